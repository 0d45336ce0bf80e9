// RecordStream — the perf_event_header walk over the data section, with
// zstd decompression (PERF_RECORD_COMPRESSED / COMPRESSED2) folded in.
//
//   RecordStream rs(file.bytes(), begin, end, h.swap, path);
//   RawRecord r;
//   while (rs.next(r)) { ... r.type, r.body, r.extra ... }
//   if (rs.stopped()) warn(rs.stop_reason());   // cut file: partial results
//
// Each record consumes exactly header.size bytes, plus the bytes that
// HEADER_TRACING_DATA and AUXTRACE append outside header.size. Compressed
// records are decoded with one streaming zstd context for the whole file; a
// record may straddle two compressed chunks, so the undecoded tail of one
// chunk's output is carried into the next. Records decoded from compressed
// data point into a shared buffer that `owner` keeps alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gilscan/cursor.h"

typedef struct ZSTD_DCtx_s ZSTD_DCtx;

namespace gilscan {

struct RawRecord {
    uint32_t type = 0;
    uint16_t misc = 0;
    uint16_t size = 0;
    Bytes body;            // size - 8 bytes after the header
    Bytes extra;           // bytes appended outside header.size (tracing data, aux trace)
    uint64_t offset = 0;   // file offset of the record (of its COMPRESSED container if compressed)
    bool compressed = false;
    std::shared_ptr<const std::vector<uint8_t>> owner;
};

class RecordStream {
public:
    RecordStream(Bytes file, uint64_t begin, uint64_t end, bool swap, const std::string& path);
    ~RecordStream();
    RecordStream(const RecordStream&) = delete;
    RecordStream& operator=(const RecordStream&) = delete;

    bool next(RawRecord& r);

    bool stopped() const { return !stop_reason_.empty(); }
    const std::string& stop_reason() const { return stop_reason_; }
    uint64_t stop_offset() const { return stop_offset_; }
    uint64_t position() const { return pos_; }  // next file offset to decode
    uint64_t compressed_records() const { return compressed_records_; }
    uint64_t decompressed_bytes() const { return decompressed_bytes_; }
    const std::vector<std::string>& warnings() const { return warnings_; }

private:
    bool next_from_file(RawRecord& r);
    bool next_from_decompressed(RawRecord& r);
    void decompress(const RawRecord& container);
    void stop(uint64_t offset, const std::string& why);

    Bytes file_;
    uint64_t pos_, end_;
    bool swap_;
    const std::string& path_;
    std::string stop_reason_;
    uint64_t stop_offset_ = 0;

    ZSTD_DCtx* dctx_ = nullptr;
    std::shared_ptr<std::vector<uint8_t>> dbuf_;
    size_t dpos_ = 0;
    uint64_t dsource_offset_ = 0;
    uint64_t compressed_records_ = 0;
    uint64_t decompressed_bytes_ = 0;
    std::vector<std::string> warnings_;
};

// Upper bound on one compressed record's output: perf writes at most one
// mmap buffer's worth per record; anything far larger is a corrupt stream.
inline constexpr size_t kMaxDecompressedChunk = 256u << 20;

}  // namespace gilscan
