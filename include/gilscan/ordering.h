// OrderedQueue — delivers records in timestamp order with bounded memory,
// using perf's FINISHED_ROUND rule (util/ordered-events.c).
//
//   OrderedQueue q;
//   q.push(time, record, attr_index, deliver);
//   q.finished_round(deliver);   // at each PERF_RECORD_FINISHED_ROUND
//   q.flush_all(deliver);        // at the end of the data
//   // deliver(const RawRecord&, int attr_index)
//
// perf writes the per-CPU ring buffers out in rounds; every event of a round
// is later than everything released at the end of the round before it, so at
// each FINISHED_ROUND the events up to the previous round's maximum time can
// be released. A recording without rounds (or one round too large) is held
// to `max_queued` events: past that the older half is released, as perf's
// OE_FLUSH__HALF does. Equal timestamps keep file order.
//
// Speed: entries are 32 bytes (time, sequence, pointer to the record's
// bytes); a round arrives as one sorted run per CPU buffer, so pending
// entries are merged run by run (n log runs) instead of sorted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "gilscan/perf_abi.h"
#include "gilscan/record_stream.h"

namespace gilscan {

class OrderedQueue {
public:
    explicit OrderedQueue(size_t max_queued = 4u << 20, bool swap = false) : max_queued_(max_queued), swap_(swap) {}

    template <class Deliver>
    void push(uint64_t time, const RawRecord& r, int attr_index, Deliver&& deliver) {
        if (flushed_any_ && time < last_flushed_) ++out_of_order_;  // perf counts these too
        max_time_ = std::max(max_time_, time);
        Entry e;
        e.time = time;
        e.seq = seq_++;
        e.rec = r.body.data() - PERF_EVENT_HEADER_SIZE;
        e.attr = attr_index;
        e.owner = owner_for(r);
        e.offset = r.offset;
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
    // Lowest file offset still referenced by a queued record (for releasing pages).
    uint64_t lowest_offset(uint64_t fallback) const {
        uint64_t lo = fallback;
        for (size_t i = head_; i < sorted_.size(); ++i)
            if (sorted_[i].owner < 0) lo = std::min(lo, sorted_[i].offset);
        for (const auto& e : pending_)
            if (e.owner < 0) lo = std::min(lo, e.offset);
        return lo;
    }

private:
    struct Entry {
        uint64_t time;
        uint64_t seq;
        const uint8_t* rec;  // the record's header, in the mapping or an owned buffer
        uint64_t offset;
        int32_t attr;
        int32_t owner;       // index in owners_ (+ base), -1: the file mapping
    };
    static bool earlier(const Entry& a, const Entry& b) { return a.time != b.time ? a.time < b.time : a.seq < b.seq; }

    int32_t owner_for(const RawRecord& r) {
        if (!r.owner) return -1;
        if (owners_.empty() || owners_.back().buf != r.owner) owners_.push_back({r.owner, 0});
        ++owners_.back().refs;
        return static_cast<int32_t>(owner_base_ + owners_.size() - 1);
    }

    // Pairwise merges of the sorted runs of pending_ (ping-pong between two
    // buffers: one sequential copy per pass, log2(runs) passes), then one
    // merge with what is left of sorted_.
    void arrange() {
        if (pending_.empty()) return;
        std::vector<size_t> bounds;
        bounds.reserve(runs_.size() + 2);
        bounds.push_back(0);
        bounds.insert(bounds.end(), runs_.begin(), runs_.end());
        bounds.push_back(pending_.size());
        runs_.clear();
        while (bounds.size() > 2) {
            merged_.resize(pending_.size());
            std::vector<size_t> next{0};
            size_t i = 0;
            for (; i + 2 < bounds.size(); i += 2) {
                std::merge(pending_.begin() + static_cast<long>(bounds[i]), pending_.begin() + static_cast<long>(bounds[i + 1]),
                           pending_.begin() + static_cast<long>(bounds[i + 1]), pending_.begin() + static_cast<long>(bounds[i + 2]),
                           merged_.begin() + static_cast<long>(bounds[i]), earlier);
                next.push_back(bounds[i + 2]);
            }
            if (i + 1 < bounds.size()) {  // an odd run out: carried over as it is
                std::copy(pending_.begin() + static_cast<long>(bounds[i]), pending_.begin() + static_cast<long>(bounds[i + 1]),
                          merged_.begin() + static_cast<long>(bounds[i]));
                if (next.back() != bounds[i + 1]) next.push_back(bounds[i + 1]);
            }
            pending_.swap(merged_);
            bounds = std::move(next);
        }
        if (head_ == sorted_.size()) {
            sorted_.swap(pending_);  // nothing left over: no copy
        } else if (!earlier(pending_.front(), sorted_.back())) {
            sorted_.erase(sorted_.begin(), sorted_.begin() + static_cast<long>(head_));
            sorted_.insert(sorted_.end(), pending_.begin(), pending_.end());
        } else {
            merged_.resize(sorted_.size() - head_ + pending_.size());
            std::merge(sorted_.begin() + static_cast<long>(head_), sorted_.end(), pending_.begin(), pending_.end(),
                       merged_.begin(), earlier);
            sorted_.swap(merged_);
        }
        head_ = 0;
        pending_.clear();
    }

    template <class Deliver>
    void flush_until(uint64_t limit, Deliver& deliver) {
        arrange();
        while (head_ < sorted_.size() && sorted_[head_].time <= limit) {
            const Entry& e = sorted_[head_];
            RawRecord r;
            r.type = load<uint32_t>(e.rec, swap_);
            r.misc = load<uint16_t>(e.rec + 4, swap_);
            r.size = load<uint16_t>(e.rec + 6, swap_);
            r.body = Bytes(e.rec + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
            r.offset = e.offset;
            r.compressed = e.owner >= 0;
            deliver(r, e.attr);
            last_flushed_ = e.time;
            flushed_any_ = true;
            if (e.owner >= 0) --owners_[static_cast<size_t>(e.owner - static_cast<int64_t>(owner_base_))].refs;
            ++head_;
        }
        while (!owners_.empty() && owners_.front().refs == 0 && owners_.size() > 1) {
            owners_.pop_front();
            ++owner_base_;
        }
        if (head_ > 4096 && head_ * 2 > sorted_.size()) {
            sorted_.erase(sorted_.begin(), sorted_.begin() + static_cast<long>(head_));
            head_ = 0;
        }
    }

    struct Owner {
        std::shared_ptr<const std::vector<uint8_t>> buf;
        uint64_t refs;
    };

    std::vector<Entry> sorted_;   // sorted; [head_, end) still queued
    size_t head_ = 0;
    std::vector<Entry> pending_;  // pushed since the last flush, in file order
    std::vector<Entry> merged_;
    std::vector<size_t> runs_;    // where a new sorted run starts in pending_
    std::deque<Owner> owners_;
    uint64_t owner_base_ = 0;
    size_t max_queued_;
    bool swap_;
    uint64_t seq_ = 0;
    uint64_t next_flush_ = 0;
    uint64_t max_time_ = 0;
    uint64_t last_flushed_ = 0;
    bool flushed_any_ = false;
    uint64_t out_of_order_ = 0;
    uint64_t half_flushes_ = 0;
    size_t peak_ = 0;
};

}  // namespace gilscan
