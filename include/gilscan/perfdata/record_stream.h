// RecordStream — the perf_event_header walk over the data section, with
// zstd decompression (PERF_RECORD_COMPRESSED / COMPRESSED2) folded in.
//
//   ChunkTable chunks;
//   RecordStream rs(file, begin, end, h.swap, chunks);
//   RawRecord r;
//   while (rs.next(r)) { ... r.type, r.body, r.extra ... }   // valid until the next next()
//   chunks.retain(r.chunk);  ...  chunks.release(r.chunk);    // to keep a record longer
//   if (rs.stopped()) warn(rs.stop_reason());   // cut file: partial results
//
// Each record consumes exactly header.size bytes, plus the bytes that
// HEADER_TRACING_DATA and AUXTRACE append outside header.size.
//
// Why chunks and not spans into the mmap: the data section is read with
// pread() into reusable 2 MiB chunks. Faulting a mapping in costs more than
// copying the same bytes out of the page cache (`bench/walk` against
// `bench/walk --pread`) — and a chunk that
// no queued record needs any more is reused, so residency stays bounded
// whatever the file size. A record never straddles
// two chunks: the unfinished tail of one chunk starts the next.
//
// Compressed records are decoded with one streaming zstd context for the
// whole file into chunks of their own; a record may straddle two compressed
// records, so the undecoded tail of one output is carried into the next.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/mapped_file.h"
#include "gilscan/perfdata/perf_abi.h"

typedef struct ZSTD_DCtx_s ZSTD_DCtx;

namespace gilscan {

inline constexpr uint32_t kNoChunk = ~0u;

// Reference-counted byte buffers that records point into. Buffers are
// recycled: a released chunk's memory is reused by the next acquire().
//
// One thread owns a table (acquire, retain, release, bytes, data). Another
// thread holding a reference handed over to it (through a mutex, as
// Session's reader thread does) may call origin() for that chunk: the table
// is written there only by acquire(), and an id is only reacquired once
// every reference to it is back, so the two never touch the same entry at
// once. That lets a record go to the stages as a pointer and a chunk id,
// with where it came from in the file looked up only when it is needed.
class ChunkTable {
public:
    // Ids stay below 2^20: the ordering queue packs one with the record's
    // event into 32 bits (ordering.h). That many live chunks would be 2 TiB
    // of 2 MiB file chunks; RecordStream stops with an Error before it.
    static constexpr uint32_t kMaxChunks = 1u << 20;
    ChunkTable();
    ChunkTable(const ChunkTable&) = delete;
    ChunkTable& operator=(const ChunkTable&) = delete;
    bool full() const { return free_.empty() && chunks_.size() >= kMaxChunks; }
    // A chunk with refs = 1, at least `capacity` bytes reserved, empty.
    uint32_t acquire(size_t capacity, uint64_t base, bool compressed);
    ChunkBytes& bytes(uint32_t id) { return chunks_[id].bytes; }
    const uint8_t* data(uint32_t id) const { return chunks_[id].bytes.data(); }
    // File offset of byte 0 (file chunks) or of the COMPRESSED record it came from.
    uint64_t base(uint32_t id) const { return origins_[id].base; }
    bool compressed(uint32_t id) const { return origins_[id].compressed; }
    // The file offset of the record at `rec` in the chunk (of its
    // COMPRESSED container for a decompressed one); safe from a thread
    // holding a handed-over reference to the chunk (above). A file chunk's
    // bytes never move after acquire(): it is filled up to the capacity
    // reserved there (RecordStream::ensure), and a vector resized within its
    // capacity keeps its buffer.
    uint64_t origin(uint32_t id, const uint8_t* rec) const {
        const Origin& o = origins_[id];
        return o.compressed ? o.base : o.base + static_cast<uint64_t>(rec - o.data);
    }
    void retain(uint32_t id) { ++chunks_[id].refs; }
    // Bytes reserved by live chunks (a chunk counts its capacity from
    // acquire(), and again after recount() once it grew, until its last
    // release). The ordering queue keeps this under its window's bound.
    uint64_t live_bytes() const { return live_bytes_; }
    uint64_t peak_live_bytes() const { return peak_live_bytes_; }
    void recount(uint32_t id) {
        Chunk& c = chunks_[id];
        live_bytes_ += c.bytes.capacity() - c.counted;
        c.counted = c.bytes.capacity();
        peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    }
    // Inline: called twice per record (the ordering queue and the batch each hold one).
    void release(uint32_t id) {
        // The buffer is kept for the next acquire(): memory stays at the peak of
        // live chunks (bounded by the ordering window), and a fresh buffer's page
        // faults and zeroing are paid once, not per chunk.
        Chunk& c = chunks_[id];
        if (--c.refs == 0) {
            free_.push_back(id);
            live_bytes_ -= c.counted;
            c.counted = 0;
        }
    }
    size_t live() const { return chunks_.size() - free_.size(); }

private:
    struct Chunk {
        ChunkBytes bytes;
        uint32_t refs = 0;
        uint64_t counted = 0;  // its share of live_bytes_
    };
    uint64_t live_bytes_ = 0, peak_live_bytes_ = 0;
    std::vector<Chunk> chunks_;
    std::vector<uint32_t> free_;
    // Where each chunk came from (base(), compressed(), origin()), per id, in
    // memory that never moves (chunks_ does when it grows): 24 MiB of address
    // space mapped anonymous, untouched pages until ids that high are used.
    struct Origin {
        uint64_t base;
        const uint8_t* data;  // the bytes as reserved by acquire() (a file chunk's never move)
        bool compressed;
    };
    static constexpr size_t kOriginBytes = size_t{kMaxChunks} * sizeof(Origin);
    struct Free {
        void operator()(Origin* p) const;  // munmap
    };
    std::unique_ptr<Origin[], Free> origins_;
};

struct RawRecord {
    uint32_t type = 0;
    uint16_t misc = 0;
    uint16_t size = 0;
    Bytes body;            // size - 8 bytes after the header
    Bytes extra;           // bytes appended outside header.size (tracing data); valid until next()
    uint64_t offset = 0;   // file offset of the record (of its COMPRESSED container if compressed)
    uint32_t chunk = kNoChunk;  // the ChunkTable buffer holding the bytes (ChunkTable::compressed: decompressed bytes)
    const void* note = nullptr;  // a ReaderStage's note (session.h), on the stages' side
    int event = -1;  // the record's event index where the reader looked it up (-1: not known)
};

// The perf_event_header at p: type, misc, size. The body is the caller's to
// frame (RecordStream checks size against what is left first).
inline void read_header(const uint8_t* p, bool swap, RawRecord& r) {
    r.type = load<uint32_t>(p, swap);
    r.misc = load<uint16_t>(p + 4, swap);
    r.size = load<uint16_t>(p + 6, swap);
}
// A record RecordStream framed earlier (its size known to fit), found again
// where it lies in a chunk: its header, and its body after it. The ordering
// queue, the stages and the reader stage read handed-over records this way.
inline void read_framed(const uint8_t* p, bool swap, RawRecord& r) {
    read_header(p, swap, r);
    r.body = Bytes(p + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
}

class RecordStream {
public:
    static constexpr size_t kChunkSize = 2u << 20;

    RecordStream(const MappedFile& file, uint64_t begin, uint64_t end, bool swap, ChunkTable& chunks,
                 size_t chunk_size = kChunkSize);
    ~RecordStream();
    RecordStream(const RecordStream&) = delete;
    RecordStream& operator=(const RecordStream&) = delete;

    // Inline for the common case: a kernel record wholly inside the current
    // file chunk, nothing decompressed pending (the out-of-line framing took
    // some 140 instructions a record, a quarter of the reader's). Everything
    // else — chunk ends, compressed data, user records with payloads past
    // header.size, malformed sizes — goes the checked way.
    bool next(RawRecord& r) {
        if (dchunk_ == kNoChunk && pos_ < cend_ && cend_ - pos_ >= PERF_EVENT_HEADER_SIZE) {
            const uint8_t* p = chunks_.data(fchunk_) + (pos_ - cbase_);
            // The chunk was just filled by pread, whose large copies leave
            // little of it in the cache: each header's load would wait for
            // memory (a fifth of the reader's time in a profile of the
            // 64-CPU capture). Ask for the bytes some records ahead.
            __builtin_prefetch(p + 512);
            read_header(p, swap_, r);
            if (r.type < PERF_RECORD_HEADER_ATTR && r.size >= PERF_EVENT_HEADER_SIZE && r.size <= cend_ - pos_) {
                frame_in_chunk(r, pos_);
                pos_ += r.size;
                return true;
            }
        }
        return next_checked(r);
    }

    bool stopped() const { return !stop_reason_.empty(); }
    const std::string& stop_reason() const { return stop_reason_; }
    uint64_t stop_offset() const { return stop_offset_; }
    uint64_t position() const { return pos_; }  // next file offset to decode
    uint64_t compressed_records() const { return compressed_records_; }
    uint64_t decompressed_bytes() const { return decompressed_bytes_; }
    const std::vector<std::string>& warnings() const { return warnings_; }

private:
    // The rest of r, whose header is read: a record at file offset `at`,
    // wholly inside the current file chunk (both framing paths end here).
    void frame_in_chunk(RawRecord& r, uint64_t at) const {
        const uint8_t* p = chunks_.data(fchunk_) + (at - cbase_);
        r.body = Bytes(p + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
        r.extra = {};
        r.offset = at;
        r.chunk = fchunk_;
    }
    bool next_checked(RawRecord& r);
    bool next_from_file(RawRecord& r);
    bool next_from_decompressed(RawRecord& r);
    bool ensure(uint64_t n);  // bytes [pos_, pos_+n) in the current file chunk
    void decompress(const RawRecord& container);
    void drop_decompressed();
    void stop(uint64_t offset, const std::string& why);
    uint32_t acquire_chunk(size_t capacity, uint64_t base, bool compressed);  // throws Error at kMaxChunks

    const MappedFile& file_;
    uint64_t pos_, end_;
    bool swap_;
    ChunkTable& chunks_;
    size_t chunk_size_;
    std::string stop_reason_;
    uint64_t stop_offset_ = 0;

    uint32_t fchunk_ = kNoChunk;  // current file chunk: file bytes [cbase_, cend_)
    uint64_t cbase_ = 0, cend_ = 0;
    std::vector<uint8_t> extra_;  // the last record's out-of-size payload

    ZSTD_DCtx* dctx_ = nullptr;
    uint32_t dchunk_ = kNoChunk;  // current decompressed chunk
    size_t dpos_ = 0;
    uint64_t compressed_records_ = 0;
    uint64_t decompressed_bytes_ = 0;
    std::vector<std::string> warnings_;
};

// Upper bound on one compressed record's output: perf writes at most one
// mmap buffer's worth per record; anything far larger is a corrupt stream.
inline constexpr size_t kMaxDecompressedChunk = 256u << 20;
// The ordering window's bound in bytes held: past it, OrderedQueue
// releases its older half (as past its bound in records). perf's own rounds
// hold some megabytes; a file without rounds, whose every compressed
// record would keep a buffer of its own alive, stays within it.
inline constexpr uint64_t kWindowBytes = 1ull << 30;
// What may be held at once at all (the window, records on their way to the
// stages, the chunk being filled): past it a file is refused.
inline constexpr uint64_t kMaxLiveBytes = 4ull << 30;
// Upper bound on an out-of-size payload gilscan reads (tracing data).
inline constexpr uint64_t kMaxExtraPayload = 256u << 20;

}  // namespace gilscan
