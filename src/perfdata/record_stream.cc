#include "gilscan/perfdata/record_stream.h"

#include <algorithm>
#include <new>

#include <sys/mman.h>

#include <zstd.h>

#include "gilscan/error.h"
#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

// Mapped rather than calloc'd: the same untouched zero pages, and under
// ThreadSanitizer its munmap resets the range's metadata in one step, where
// free() walked all 24 MiB of it (every analysis of a small test recording
// took tens of milliseconds in build-tsan, most of its unit tests' time).
ChunkTable::ChunkTable() {
    void* p = ::mmap(nullptr, kOriginBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    origins_.reset(static_cast<Origin*>(p));
}

void ChunkTable::Free::operator()(Origin* p) const { ::munmap(p, kOriginBytes); }

uint32_t ChunkTable::acquire(size_t capacity, uint64_t base, bool compressed) {
    uint32_t id;
    if (!free_.empty()) {
        id = free_.back();
        free_.pop_back();
    } else {
        id = static_cast<uint32_t>(chunks_.size());
        chunks_.emplace_back();
    }
    Chunk& c = chunks_[id];
    c.bytes.clear();
    c.bytes.reserve(capacity);
    c.refs = 1;
    origins_[id] = {base, c.bytes.data(), compressed};
    recount(id);
    return id;
}

RecordStream::RecordStream(const MappedFile& file, uint64_t begin, uint64_t end, bool swap, ChunkTable& chunks,
                           size_t chunk_size)
    : file_(file),
      pos_(begin),
      end_(std::min<uint64_t>(end, file.size())),
      swap_(swap),
      chunks_(chunks),
      chunk_size_(std::max<size_t>(chunk_size, 64)),
      cbase_(begin),
      cend_(begin) {}

RecordStream::~RecordStream() {
    if (dctx_) ZSTD_freeDCtx(dctx_);
    if (fchunk_ != kNoChunk) chunks_.release(fchunk_);
    if (dchunk_ != kNoChunk) chunks_.release(dchunk_);
}

// Every chunk comes from here: ids stay below ChunkTable::kMaxChunks.
uint32_t RecordStream::acquire_chunk(size_t capacity, uint64_t base, bool compressed) {
    // The ordering queue releases records long before this (OrderedQueue's
    // byte bound); a file that still needs more held at once is refused,
    // whatever its records say, rather than taking the machine's memory.
    if (chunks_.live_bytes() + capacity > kMaxLiveBytes)
        throw Error(file_.path(), base,
                    "more than " + std::to_string(kMaxLiveBytes >> 20) +
                        " MiB of read buffers would be alive at once (records that cannot be released in order)");
    if (chunks_.full())
        throw Error(file_.path(), base,
                    "more than " + std::to_string(ChunkTable::kMaxChunks) +
                        " read buffers would be alive at once (a round of that many records in buffers of their own)");
    return chunks_.acquire(capacity, base, compressed);
}

void RecordStream::stop(uint64_t offset, const std::string& why) {
    if (stop_reason_.empty()) {
        stop_reason_ = why;
        stop_offset_ = offset;
    }
    pos_ = end_;
    drop_decompressed();
}

void RecordStream::drop_decompressed() {
    if (dchunk_ != kNoChunk) chunks_.release(dchunk_);
    dchunk_ = kNoChunk;
    dpos_ = 0;
}

bool RecordStream::next_checked(RawRecord& r) {
    for (;;) {
        if (dchunk_ != kNoChunk && next_from_decompressed(r)) return true;
        if (!next_from_file(r)) {
            if (dchunk_ != kNoChunk && dpos_ < chunks_.bytes(dchunk_).size()) {
                warnings_.push_back("compressed data ends inside a record (" +
                                    std::to_string(chunks_.bytes(dchunk_).size() - dpos_) + " bytes left over)");
            }
            drop_decompressed();
            return false;
        }
        if (r.type == PERF_RECORD_COMPRESSED || r.type == PERF_RECORD_COMPRESSED2) {
            decompress(r);
            continue;
        }
        return true;
    }
}

bool RecordStream::ensure(uint64_t n) {
    if (pos_ + n <= cend_) return true;
    // A stream arrives a little at a time: each read fills on in the
    // chunk's room (its bytes never move, so queued records stay valid),
    // rather than take a chunk of its own.
    if (file_.streaming() && fchunk_ != kNoChunk && pos_ <= cend_ && pos_ + n - cbase_ <= chunks_.bytes(fchunk_).capacity()) {
        ChunkBytes& buf = chunks_.bytes(fchunk_);
        const size_t have = buf.size();
        const size_t room = buf.capacity() - have;
        buf.resize(buf.capacity());
        const size_t got = file_.read(cend_, buf.data() + have, room, static_cast<size_t>(pos_ + n - cend_));
        buf.resize(have + got);
        cend_ += got;
        if (pos_ + n > cend_) end_ = cend_;  // the stream ended
        return pos_ + n <= cend_;
    }
    // Start a new chunk with the unfinished tail of the current one. The old
    // chunk lives on while queued records still point into it.
    // After a payload skipped past header.size, pos_ may be beyond the chunk.
    const uint64_t carried = pos_ < cend_ ? cend_ - pos_ : 0;
    const uint64_t from = pos_ + carried;
    // No bigger than what is left to read: a small file gets a small chunk.
    const size_t cap = static_cast<size_t>(std::max<uint64_t>(std::min<uint64_t>(chunk_size_, end_ - pos_), n));
    uint32_t id = acquire_chunk(cap, pos_, false);
    ChunkBytes& buf = chunks_.bytes(id);
    buf.resize(cap);
    if (carried) std::memcpy(buf.data(), chunks_.data(fchunk_) + (pos_ - cbase_), static_cast<size_t>(carried));
    const size_t want = static_cast<size_t>(std::min<uint64_t>(cap - carried, end_ - from));
    // A stream's read returns once the record is whole: what follows may not be written yet.
    const size_t need = file_.streaming() ? static_cast<size_t>(n - carried) : want;
    size_t got = file_.read(from, buf.data() + carried, want, need);
    buf.resize(static_cast<size_t>(carried) + got);
    if (fchunk_ != kNoChunk) chunks_.release(fchunk_);
    fchunk_ = id;
    cbase_ = pos_;
    cend_ = pos_ + carried + got;
    if (got < need) end_ = cend_;  // the file shrank while we read it, or the stream ended
    return pos_ + n <= cend_;
}

bool RecordStream::next_from_file(RawRecord& r) {
    if (pos_ >= end_) return false;
    const uint64_t at = pos_;
    if (end_ - at < PERF_EVENT_HEADER_SIZE || !ensure(PERF_EVENT_HEADER_SIZE)) {
        if (file_.streaming() && end_ == at) return false;  // the stream ended between records
        stop(at, "file ends inside a record header");
        return false;
    }
    const uint8_t* p = chunks_.data(fchunk_) + (at - cbase_);
    read_header(p, swap_, r);
    if (r.size < PERF_EVENT_HEADER_SIZE) {
        stop(at, "record of size " + std::to_string(r.size) + " < 8; the rest of the data cannot be framed");
        return false;
    }
    if (r.size > end_ - at || !ensure(r.size)) {
        stop(at, "file ends inside a record (type " + std::to_string(r.type) + ", " + std::to_string(r.size) +
                     " bytes)");
        return false;
    }
    frame_in_chunk(r, at);
    uint64_t next = at + r.size;
    // Records whose payload continues past header.size: its length is the
    // body's first field (u32 for tracing data, u64 for AUXTRACE).
    if (r.type == PERF_RECORD_HEADER_TRACING_DATA && r.body.size() >= 4) {
        const uint64_t extra = load<uint32_t>(r.body.data(), swap_);
        if (extra > end_ - next) {
            stop(at, "file ends inside the tracing data");
            return false;
        }
        if (extra > kMaxExtraPayload) {
            stop(at, "tracing data of " + std::to_string(extra) + " bytes is implausible");
            return false;
        }
        extra_.resize(static_cast<size_t>(extra));
        // What the chunk holds already is copied; the rest read after it
        // (a stream is read only forward).
        const size_t held = next < cend_ ? static_cast<size_t>(std::min<uint64_t>(cend_ - next, extra)) : 0;
        if (held) std::memcpy(extra_.data(), chunks_.data(fchunk_) + (next - cbase_), held);
        if (held < extra_.size() &&
            file_.read(next + held, extra_.data() + held, extra_.size() - held) != extra_.size() - held) {
            stop(at, "file ends inside the tracing data");
            return false;
        }
        r.extra = Bytes(extra_.data(), extra_.size());
        next += extra;
    } else if (r.type == PERF_RECORD_AUXTRACE && r.body.size() >= 8) {
        // Hardware trace data (Intel PT, ...): framed and skipped unread.
        const uint64_t extra = load<uint64_t>(r.body.data(), swap_);
        if (extra > end_ - next) {
            stop(at, "file ends inside AUXTRACE data");
            return false;
        }
        next += extra;
    }
    pos_ = next;
    return true;
}

void RecordStream::decompress(const RawRecord& c) {
    ++compressed_records_;
    Bytes payload = c.body;
    if (c.type == PERF_RECORD_COMPRESSED2) {
        // COMPRESSED2: u64 data_size, then data padded to 8 bytes.
        if (payload.size() < 8) {
            warnings_.push_back("COMPRESSED2 record too short at byte " + std::to_string(c.offset));
            return;
        }
        uint64_t data_size = load<uint64_t>(payload.data(), swap_);
        if (data_size > payload.size() - 8) {
            warnings_.push_back("COMPRESSED2 data size runs past its record at byte " + std::to_string(c.offset));
            return;
        }
        payload = payload.subspan(8, data_size);
    }
    if (!dctx_) dctx_ = ZSTD_createDCtx();
    // A new chunk starts with the undecoded tail of the previous one.
    const size_t step = ZSTD_DStreamOutSize();
    uint32_t id = acquire_chunk(std::max(chunk_size_, step * 2), c.offset, true);
    ChunkBytes& buf = chunks_.bytes(id);
    if (dchunk_ != kNoChunk) {
        const ChunkBytes& old = chunks_.bytes(dchunk_);
        if (dpos_ < old.size()) buf.assign(old.begin() + static_cast<long>(dpos_), old.end());
    }
    drop_decompressed();
    const size_t carried = buf.size();
    ZSTD_inBuffer in{payload.data(), payload.size(), 0};
    while (in.pos < in.size) {
        size_t old = buf.size();
        if (old - carried > kMaxDecompressedChunk) {
            warnings_.push_back("compressed record at byte " + std::to_string(c.offset) +
                                " expands beyond 256 MiB; skipped");
            buf.resize(carried);
            ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
            break;
        }
        buf.resize(old + step);
        ZSTD_outBuffer out{buf.data() + old, step, 0};
        size_t rc = ZSTD_decompressStream(dctx_, &out, &in);
        buf.resize(old + out.pos);
        if (ZSTD_isError(rc)) {
            warnings_.push_back("compressed record at byte " + std::to_string(c.offset) +
                                " does not decompress (" + ZSTD_getErrorName(rc) + "); its events are lost");
            // The stream cannot continue mid-frame: drop this chunk's output and any carried tail.
            buf.clear();
            ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
            break;
        }
        if (out.pos == 0 && in.pos == in.size) break;
    }
    decompressed_bytes_ += buf.size() - carried;
    chunks_.recount(id);  // the buffer may have grown past what acquire() counted
    dchunk_ = id;
    dpos_ = 0;
}

bool RecordStream::next_from_decompressed(RawRecord& r) {
    const ChunkBytes& b = chunks_.bytes(dchunk_);
    size_t left = b.size() - dpos_;
    if (left < PERF_EVENT_HEADER_SIZE) return false;  // the tail waits for the next chunk
    const uint8_t* p = b.data() + dpos_;
    read_header(p, swap_, r);
    r.offset = chunks_.base(dchunk_);
    r.extra = {};
    r.chunk = dchunk_;
    if (r.size < PERF_EVENT_HEADER_SIZE) {
        warnings_.push_back("decompressed record of size " + std::to_string(r.size) +
                            " < 8 in the chunk at byte " + std::to_string(r.offset) +
                            "; the rest of that chunk was dropped");
        drop_decompressed();
        return false;
    }
    if (r.size > left) return false;  // straddles into the next chunk
    r.body = Bytes(p + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
    dpos_ += r.size;
    return true;
}

}  // namespace gilscan
