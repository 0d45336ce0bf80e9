// MappedFile — a read-only mmap of one input file.
//
//   MappedFile f("perf.data");          // throws gilscan::Error if it cannot be opened
//   Cursor c(f.bytes(), false, &f.path(), 0);   // header, attrs, features: zero-copy
//   size_t n = f.read(offset, buf, len);        // the data section: copied in chunks
//
// The header and feature sections are read in place through the mapping.
// The data section streams through read() (pread, or memcpy for bytes
// already in memory) into RecordStream's reusable chunks: see
// record_stream.h for why that beats faulting the mapping in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

// A small text file read whole into text (a perf map; a procfs file, which
// reports size 0: read to the end). False when it cannot be opened (errno
// in err); failed: a read error part way.
bool read_small_file(const std::string& path, std::string& text, bool& failed, int& err);

// A file another program left for gilscan to read (a perf map, a jitdump),
// opened as perf does: O_NOFOLLOW (not through a symlink), O_NONBLOCK (a
// FIFO never hangs the run), then accepted only if it is a regular file of at
// most max_size bytes owned by root or by `owner` (the recording's user).
// -1 with the reason in *why otherwise (ENOENT: errno in *err, why empty).
int open_foreign_file(const std::string& path, uid_t owner, uint64_t max_size, std::string* why, int* err);

class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    // Bytes already in memory (fuzzing, tests); not owned, never unmapped.
    MappedFile(const std::string& name, Bytes memory);
    // A pipe-mode stream as it is written (gilscan top: perf record -o -
    // into a pipe): fd is read once, front to back, and closed here. Only
    // its 16-byte header is in bytes(); size() is kStreamSize (its end
    // is where its writer closes it). read() waits for what it needs,
    // calling `waiting` (if set) with 0 after each read that brought bytes,
    // and every 100 ms while none come with how long none have (ns).
    struct Stream {
        int fd = -1;
        std::function<void(uint64_t idle_ns)> waiting;
    };
    MappedFile(const std::string& name, Stream stream);
    static constexpr uint64_t kStreamSize = uint64_t{1} << 62;
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    Bytes bytes() const { return {data_, mapped_}; }
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }

    // Copies up to n bytes at `offset` into dst; returns how many (fewer
    // only at the end of the file). Throws gilscan::Error on an I/O error.
    // A stream returns once it has at least `need` of them (fewer only at
    // its end), with as many more as have arrived; its offsets only go
    // forward (bytes skipped are read and dropped).
    size_t read(uint64_t offset, uint8_t* dst, size_t n, size_t need) const;
    size_t read(uint64_t offset, uint8_t* dst, size_t n) const { return read(offset, dst, n, n); }
    bool streaming() const { return stream_; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    uint64_t mapped_ = 0;  // bytes at data_ (size_, but a stream's header only)
    bool owned_ = true;
    int fd_ = -1;
    // A stream's: its header's bytes, where its reads have got to, the caller's wait.
    bool stream_ = false;
    std::vector<uint8_t> head_;
    mutable uint64_t stream_pos_ = 0;
    std::function<void(uint64_t)> waiting_;
    size_t read_stream(uint64_t offset, uint8_t* dst, size_t n, size_t need) const;
};

}  // namespace gilscan
