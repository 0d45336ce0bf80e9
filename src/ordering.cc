#include "gilscan/ordering.h"

namespace gilscan {

namespace {
bool earlier(const QueuedRecord& a, const QueuedRecord& b) {
    return a.time != b.time ? a.time < b.time : a.seq < b.seq;
}
}  // namespace

void OrderedQueue::push(QueuedRecord&& r, const Deliver& deliver) {
    if (flushed_any_ && r.time < last_flushed_) ++out_of_order_;  // perf counts these too
    max_time_ = std::max(max_time_, r.time);
    queue_.push_back(std::move(r));
    peak_ = std::max(peak_, queue_.size());
    if (queue_.size() > max_queued_) {
        // No round boundary in sight: release the older half.
        sort_pending();
        ++half_flushes_;
        uint64_t limit = queue_[queue_.size() / 2].time;
        flush_until(limit, deliver);
    }
}

void OrderedQueue::sort_pending() {
    // Records arrive sorted per CPU buffer; sorting the whole pending set is
    // cheap relative to decoding, and keeps equal times in file order.
    std::sort(queue_.begin(), queue_.end(), earlier);
}

void OrderedQueue::flush_until(uint64_t limit, const Deliver& deliver) {
    if (queue_.empty()) return;
    sort_pending();
    size_t n = 0;
    while (n < queue_.size() && queue_[n].time <= limit) {
        deliver(queue_[n]);
        last_flushed_ = queue_[n].time;
        flushed_any_ = true;
        ++n;
    }
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(n));
}

void OrderedQueue::finished_round(const Deliver& deliver) {
    flush_until(next_flush_, deliver);
    next_flush_ = max_time_;
}

void OrderedQueue::flush_all(const Deliver& deliver) {
    flush_until(~uint64_t{0}, deliver);
}

uint64_t OrderedQueue::lowest_offset(uint64_t fallback) const {
    uint64_t lo = fallback;
    for (const auto& q : queue_)
        if (!q.rec.compressed) lo = std::min(lo, q.rec.offset);
    return lo;
}

}  // namespace gilscan
