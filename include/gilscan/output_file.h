// OutputFile — all-or-nothing output: bytes go to "NAME.tmp.PID" and are
// renamed to NAME only by commit(); an error (or exception) before that
// removes the temporary, so no half-written trace is ever left behind.
//
//   OutputFile out("trace.json");
//   out.write(buf, n);        // buffered
//   out.commit();             // flush, fsync-free rename into place
//
// "-" writes to stdout (no atomicity possible there). A name ending in
// ".gz" is written gzip-compressed (zlib), ".zst" zstd-compressed, streamed.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gilscan {

class OutputFile {
public:
    explicit OutputFile(std::string path);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    void write(const char* data, size_t n);
    void write(std::string_view s) { write(s.data(), s.size()); }
    void commit();
    uint64_t bytes_written() const { return written_; }
    const std::string& path() const { return path_; }

private:
    void flush_buffer();
    void sink(const char* data, size_t n, bool finish);  // compress (or not) and write
    struct Codec;
    std::unique_ptr<Codec> codec_;
    std::string path_, tmp_;
    std::FILE* f_ = nullptr;
    std::vector<char> buf_;
    size_t used_ = 0;
    uint64_t written_ = 0;
    bool committed_ = false;
    bool stdout_ = false;
};

}  // namespace gilscan
