// OrderedQueue — delivers records in timestamp order with bounded memory,
// using perf's FINISHED_ROUND rule (util/ordered-events.c).
//
//   OrderedQueue q(chunks);                 // the ChunkTable the records live in
//   q.push(time, record, deliver);          // retains record.chunk while queued
//   q.finished_round(deliver);   // at each PERF_RECORD_FINISHED_ROUND
//   q.flush_all(deliver);        // at the end of the data
//   // deliver(const RawRecord&)
//
// perf writes the per-CPU ring buffers out in rounds; every event of a round
// is later than everything released at the end of the round before it, so at
// each FINISHED_ROUND the events up to the previous round's maximum time can
// be released. A recording without rounds (or one round too large) is held
// to `max_queued` events: past that the older half is released, as perf's
// OE_FLUSH__HALF does. Equal timestamps keep file order.
//
// Speed: entries are 16 bytes (time, chunk, position in the chunk); a round
// arrives as one sorted run per CPU buffer, so pending entries are merged
// run by run (n log runs) instead of sorted. std::merge takes from its first
// range on ties (so does ours) and runs are merged in file order, so equal
// timestamps keep file order without a sequence number.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gilscan/perf_abi.h"
#include "gilscan/record_stream.h"

namespace gilscan {

class OrderedQueue {
public:
    explicit OrderedQueue(ChunkTable& chunks, size_t max_queued = 4u << 20, bool swap = false)
        : chunks_(chunks), max_queued_(max_queued), swap_(swap) {}

    template <class Deliver>
    void push(uint64_t time, const RawRecord& r, Deliver&& deliver) {
        if (flushed_any_ && time < last_flushed_) ++out_of_order_;  // perf counts these too
        max_time_ = std::max(max_time_, time);
        chunks_.retain(r.chunk);
        Entry e;
        e.time = time;
        e.chunk = r.chunk;
        e.pos = static_cast<uint32_t>(r.body.data() - PERF_EVENT_HEADER_SIZE - chunks_.data(r.chunk));
        if (!pending_.empty() && time < pending_.back().time) runs_.push_back(pending_.size());
        pending_.push_back(e);
        peak_ = std::max(peak_, size());
        if (size() > max_queued_) {
            // No round boundary in sight: release the older half.
            ++half_flushes_;
            arrange();
            flush_until(sorted_[sorted_.size() / 2].time, deliver);
        }
    }

    template <class Deliver>
    void finished_round(Deliver&& deliver) {
        flush_until(next_flush_, deliver);
        next_flush_ = max_time_;
    }

    template <class Deliver>
    void flush_all(Deliver&& deliver) {
        flush_until(~uint64_t{0}, deliver);
    }

    uint64_t out_of_order() const { return out_of_order_; }
    uint64_t max_time() const { return max_time_; }
    size_t size() const { return sorted_.size() - head_ + pending_.size(); }
    size_t peak_size() const { return peak_; }
    uint64_t half_flushes() const { return half_flushes_; }

private:
    struct Entry {
        uint64_t time;
        uint32_t chunk;  // ChunkTable id
        uint32_t pos;    // the record's header within the chunk
    };
    static bool earlier(const Entry& a, const Entry& b) { return a.time < b.time; }

    // std::merge without the unpredictable branch per element (runs of
    // different CPUs interleave at random): the side to take is selected
    // arithmetically. Ties take from the first range, like std::merge.
    static Entry* merge(const Entry* a, const Entry* ae, const Entry* b, const Entry* be, Entry* out) {
        while (a != ae && b != be) {
            // Pointer select by mask: compilers turn a ternary here back into a branch.
            const uintptr_t take_b = b->time < a->time;
            const uintptr_t pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
            *out++ = *reinterpret_cast<const Entry*>(pa ^ ((pa ^ pb) & (0 - take_b)));
            a += 1 - take_b;
            b += take_b;
        }
        out = std::copy(a, ae, out);
        return std::copy(b, be, out);
    }

    // Pairwise merges of the sorted runs of pending_ (ping-pong between two
    // buffers: one sequential copy per pass, log2(runs) passes), then one
    // merge with what is left of sorted_.
    void arrange() {
        if (pending_.empty()) return;
        bounds_.clear();
        bounds_.push_back(0);
        bounds_.insert(bounds_.end(), runs_.begin(), runs_.end());
        bounds_.push_back(pending_.size());
        runs_.clear();
        while (bounds_.size() > 2) {
            merged_.resize(pending_.size());
            next_.clear();
            next_.push_back(0);
            size_t i = 0;
            for (; i + 2 < bounds_.size(); i += 2) {
                const Entry* p = pending_.data();
                merge(p + bounds_[i], p + bounds_[i + 1], p + bounds_[i + 1], p + bounds_[i + 2],
                      merged_.data() + bounds_[i]);
                next_.push_back(bounds_[i + 2]);
            }
            if (i + 1 < bounds_.size()) {  // an odd run out: carried over as it is
                std::copy(pending_.begin() + static_cast<long>(bounds_[i]), pending_.begin() + static_cast<long>(bounds_[i + 1]),
                          merged_.begin() + static_cast<long>(bounds_[i]));
                if (next_.back() != bounds_[i + 1]) next_.push_back(bounds_[i + 1]);
            }
            pending_.swap(merged_);
            bounds_.swap(next_);
        }
        if (head_ == sorted_.size()) {
            sorted_.swap(pending_);  // nothing left over: no copy
        } else if (!earlier(pending_.front(), sorted_.back())) {
            sorted_.erase(sorted_.begin(), sorted_.begin() + static_cast<long>(head_));
            sorted_.insert(sorted_.end(), pending_.begin(), pending_.end());
        } else {
            merged_.resize(sorted_.size() - head_ + pending_.size());
            merge(sorted_.data() + head_, sorted_.data() + sorted_.size(), pending_.data(),
                  pending_.data() + pending_.size(), merged_.data());
            sorted_.swap(merged_);
        }
        head_ = 0;
        pending_.clear();
    }

    template <class Deliver>
    void flush_until(uint64_t limit, Deliver& deliver) {
        arrange();
        RawRecord r;
        while (head_ < sorted_.size() && sorted_[head_].time <= limit) {
            const Entry& e = sorted_[head_];
            const uint8_t* rec = chunks_.data(e.chunk) + e.pos;
            r.type = load<uint32_t>(rec, swap_);
            r.misc = load<uint16_t>(rec + 4, swap_);
            r.size = load<uint16_t>(rec + 6, swap_);
            r.body = Bytes(rec + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
            r.compressed = chunks_.compressed(e.chunk);
            r.offset = chunks_.base(e.chunk) + (r.compressed ? 0 : e.pos);
            r.chunk = e.chunk;
            last_flushed_ = e.time;
            flushed_any_ = true;
            ++head_;
            deliver(r);
            chunks_.release(r.chunk);
        }
        if (head_ > 4096 && head_ * 2 > sorted_.size()) {
            sorted_.erase(sorted_.begin(), sorted_.begin() + static_cast<long>(head_));
            head_ = 0;
        }
    }

    ChunkTable& chunks_;
    std::vector<Entry> sorted_;   // sorted; [head_, end) still queued
    size_t head_ = 0;
    std::vector<Entry> pending_;  // pushed since the last flush, in file order
    std::vector<Entry> merged_;
    std::vector<size_t> runs_;    // where a new sorted run starts in pending_
    std::vector<size_t> bounds_, next_;
    size_t max_queued_;
    bool swap_;
    uint64_t next_flush_ = 0;
    uint64_t max_time_ = 0;
    uint64_t last_flushed_ = 0;
    bool flushed_any_ = false;
    uint64_t out_of_order_ = 0;
    uint64_t half_flushes_ = 0;
    size_t peak_ = 0;
};

}  // namespace gilscan
