#include "gilscan/record_stream.h"

#include <zstd.h>

#include "gilscan/perf_abi.h"

namespace gilscan {

RecordStream::RecordStream(Bytes file, uint64_t begin, uint64_t end, bool swap, const std::string& path)
    : file_(file), pos_(begin), end_(std::min<uint64_t>(end, file.size())), swap_(swap), path_(path) {}

RecordStream::~RecordStream() {
    if (dctx_) ZSTD_freeDCtx(dctx_);
}

void RecordStream::stop(uint64_t offset, const std::string& why) {
    if (stop_reason_.empty()) {
        stop_reason_ = why;
        stop_offset_ = offset;
    }
    pos_ = end_;
    dbuf_.reset();
}

bool RecordStream::next(RawRecord& r) {
    for (;;) {
        if (dbuf_ && next_from_decompressed(r)) return true;
        if (!next_from_file(r)) {
            if (dbuf_ && dpos_ < dbuf_->size()) {
                warnings_.push_back("compressed data ends inside a record (" +
                                    std::to_string(dbuf_->size() - dpos_) + " bytes left over)");
                dbuf_.reset();
            }
            return false;
        }
        if (r.type == PERF_RECORD_COMPRESSED || r.type == PERF_RECORD_COMPRESSED2) {
            decompress(r);
            continue;
        }
        return true;
    }
}

bool RecordStream::next_from_file(RawRecord& r) {
    if (pos_ >= end_) return false;
    const uint64_t at = pos_;
    if (end_ - at < PERF_EVENT_HEADER_SIZE) {
        stop(at, "file ends inside a record header");
        return false;
    }
    const uint8_t* p = file_.data() + at;
    r = RawRecord{};
    r.type = load<uint32_t>(p, swap_);
    r.misc = load<uint16_t>(p + 4, swap_);
    r.size = load<uint16_t>(p + 6, swap_);
    r.offset = at;
    if (r.size < PERF_EVENT_HEADER_SIZE) {
        stop(at, "record of size " + std::to_string(r.size) + " < 8; the rest of the data cannot be framed");
        return false;
    }
    if (r.size > end_ - at) {
        stop(at, "file ends inside a record (type " + std::to_string(r.type) + ", " + std::to_string(r.size) +
                     " bytes)");
        return false;
    }
    r.body = file_.subspan(at + 8, r.size - 8u);
    uint64_t next = at + r.size;
    // Records whose payload continues past header.size: its length is the
    // body's first field (u32 for tracing data, u64 for AUXTRACE).
    uint64_t extra = 0;
    const char* what = nullptr;
    if (r.type == PERF_RECORD_HEADER_TRACING_DATA && r.body.size() >= 4) {
        extra = load<uint32_t>(r.body.data(), swap_);
        what = "the tracing data";
    } else if (r.type == PERF_RECORD_AUXTRACE && r.body.size() >= 8) {
        extra = load<uint64_t>(r.body.data(), swap_);
        what = "AUXTRACE data";
    }
    if (what) {
        if (extra > end_ - next) {
            stop(at, std::string("file ends inside ") + what);
            return false;
        }
        r.extra = file_.subspan(next, extra);
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
    // Start a new buffer with the undecoded tail of the previous chunk.
    auto buf = std::make_shared<std::vector<uint8_t>>();
    if (dbuf_ && dpos_ < dbuf_->size()) buf->assign(dbuf_->begin() + static_cast<long>(dpos_), dbuf_->end());
    const size_t carried = buf->size();
    ZSTD_inBuffer in{payload.data(), payload.size(), 0};
    const size_t step = ZSTD_DStreamOutSize();
    while (in.pos < in.size) {
        size_t old = buf->size();
        if (old - carried > kMaxDecompressedChunk) {
            warnings_.push_back("compressed record at byte " + std::to_string(c.offset) +
                                " expands beyond 256 MiB; skipped");
            buf->resize(carried);
            ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
            break;
        }
        buf->resize(old + step);
        ZSTD_outBuffer out{buf->data() + old, step, 0};
        size_t rc = ZSTD_decompressStream(dctx_, &out, &in);
        buf->resize(old + out.pos);
        if (ZSTD_isError(rc)) {
            warnings_.push_back("compressed record at byte " + std::to_string(c.offset) +
                                " does not decompress (" + ZSTD_getErrorName(rc) + "); its events are lost");
            // The stream cannot continue mid-frame: drop this chunk's output and any carried tail.
            buf->clear();
            ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
            break;
        }
        if (out.pos == 0 && in.pos == in.size) break;
    }
    decompressed_bytes_ += buf->size() - carried;
    dbuf_ = std::move(buf);
    dpos_ = 0;
    dsource_offset_ = c.offset;
}

bool RecordStream::next_from_decompressed(RawRecord& r) {
    const std::vector<uint8_t>& b = *dbuf_;
    size_t left = b.size() - dpos_;
    if (left < PERF_EVENT_HEADER_SIZE) return false;  // the tail waits for the next chunk
    const uint8_t* p = b.data() + dpos_;
    r = RawRecord{};
    r.type = load<uint32_t>(p, swap_);
    r.misc = load<uint16_t>(p + 4, swap_);
    r.size = load<uint16_t>(p + 6, swap_);
    r.offset = dsource_offset_;
    r.compressed = true;
    r.owner = dbuf_;
    if (r.size < PERF_EVENT_HEADER_SIZE) {
        warnings_.push_back("decompressed record of size " + std::to_string(r.size) +
                            " < 8 in the chunk at byte " + std::to_string(dsource_offset_) +
                            "; the rest of that chunk was dropped");
        dbuf_.reset();
        return false;
    }
    if (r.size > left) return false;  // straddles into the next chunk
    r.body = Bytes(p + 8, r.size - 8u);
    dpos_ += r.size;
    return true;
}

}  // namespace gilscan
