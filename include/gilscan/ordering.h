// OrderedQueue — delivers records in timestamp order with bounded memory,
// using perf's FINISHED_ROUND rule (util/ordered-events.c).
//
//   OrderedQueue q;
//   q.push({time, seq, record, attr_index});
//   q.finished_round(deliver);   // at each PERF_RECORD_FINISHED_ROUND
//   q.flush_all(deliver);        // at the end of the data
//
// perf writes the per-CPU ring buffers out in rounds; every event of a round
// is later than everything released at the end of the round before it, so at
// each FINISHED_ROUND the events up to the previous round's maximum time can
// be released. A recording without rounds (or one round too large) is held
// to `max_queued` events: past that the older half is released, as perf's
// OE_FLUSH__HALF does. Equal timestamps keep file order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "gilscan/record_stream.h"

namespace gilscan {

struct QueuedRecord {
    uint64_t time = 0;
    uint64_t seq = 0;
    RawRecord rec;
    int attr_index = 0;
};

class OrderedQueue {
public:
    using Deliver = std::function<void(const QueuedRecord&)>;

    explicit OrderedQueue(size_t max_queued = 4u << 20) : max_queued_(max_queued) {}

    void push(QueuedRecord&& r, const Deliver& deliver);
    void finished_round(const Deliver& deliver);
    void flush_all(const Deliver& deliver);

    uint64_t out_of_order() const { return out_of_order_; }
    uint64_t max_time() const { return max_time_; }
    size_t size() const { return queue_.size(); }
    size_t peak_size() const { return peak_; }
    uint64_t half_flushes() const { return half_flushes_; }
    // Lowest file offset still referenced by a queued record (for releasing pages).
    uint64_t lowest_offset(uint64_t fallback) const;

private:
    void flush_until(uint64_t limit, const Deliver& deliver);
    void sort_pending();

    std::vector<QueuedRecord> queue_;
    size_t sorted_prefix_ = 0;
    size_t max_queued_;
    uint64_t next_flush_ = 0;
    uint64_t max_time_ = 0;
    uint64_t last_flushed_ = 0;
    bool flushed_any_ = false;
    uint64_t out_of_order_ = 0;
    uint64_t half_flushes_ = 0;
    size_t peak_ = 0;
};

}  // namespace gilscan
