// OrderedQueue — delivers records in timestamp order with bounded memory,
// using perf's FINISHED_ROUND rule (util/ordered-events.c).
//
//   OrderedQueue q(chunks);                 // the ChunkTable the records live in
//   q.push(time, record, deliver);          // retains record.chunk while queued
//   q.finished_round(deliver);   // at each PERF_RECORD_FINISHED_ROUND
//   q.drain(deliver);            // deliver what it made ready now, or
//   q.pump(deliver, 512);        //   a few at a time while reading on
//   q.flush_all(deliver);        // at the end of the data
//   // deliver(OrderedQueue::Run): ready records a run at a time, unread;
//   // it owns the queue's reference to each one's chunk
//   // (chunks.release(e->chunk()) when done with the record)
//
// perf writes the per-CPU ring buffers out in rounds; every event of a round
// is later than everything released at the end of the round before it, so at
// each FINISHED_ROUND the events up to the previous round's maximum time can
// be released. A recording without rounds (or one round too large) is held
// to `max_queued` events: past that the older half is released, as perf's
// OE_FLUSH__HALF does (and by the reader, past kWindowBytes held in chunks). Equal timestamps keep file order.
//
// Released records are "ready" until delivered. Delivering them all at the
// round's end (drain) or spread over the reading of the next round (pump)
// gives the same order: what is ready is always delivered before the next
// round is merged in, and before any record the caller hands over directly.
// The reader thread pumps: it keeps the stages' bounded queue filled instead
// of alternating between a burst of a whole round and none while it reads.
//
// Speed: entries are 16 bytes (time, chunk and event, position in the chunk); a round
// arrives as one sorted run per CPU buffer, so pending entries are merged
// run by run (log runs passes) or radix-sorted on their time (one pass for
// spans of up to 13 bits; wider ones by their top bits into buckets, then
// bucket by bucket), whichever takes fewer passes. std::merge takes from
// its first range on ties (so does ours), runs are merged in file order and
// every radix pass is a stable scatter, so equal timestamps keep file order
// without a sequence number.
// The queue is two sorted arrays, what earlier rounds left (`old`) and the
// newest round (`new`), merged one record at a time as they are delivered:
// a round is released at the next round's end, by when the older array is
// all delivered, so the newer becomes the older by a swap. One array made of
// both at every round (the leftover copied, the round merged in) moved every
// entry twice more.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/record_stream.h"

namespace gilscan {

class OrderedQueue {
public:
    explicit OrderedQueue(ChunkTable& chunks, size_t max_queued = 4u << 20)
        : chunks_(chunks), max_queued_(max_queued) {}

    // A queued record: its time, where it is (a ChunkTable id and the
    // position of its header there, bytes unread) and the event the reader
    // found for it.
    struct Entry {
        uint64_t time;
        uint32_t chunk_event;  // ChunkTable id (low 20 bits), event + 1 (high 12; 0: not known)
        uint32_t pos;          // the record's header within the chunk
        uint32_t chunk() const { return chunk_event & (ChunkTable::kMaxChunks - 1); }
        int event() const { return static_cast<int>(chunk_event >> kChunkBits) - 1; }  // -1 .. 4094 (-1: not known)
    };
    // What deliver() is handed, rather than one RawRecord at a time:
    // ready records in order, consecutive entries of the queue, their bytes
    // unread (a 64-CPU round's records are spread over 12 MB of chunks, and
    // reading each one's header here was a cache miss per record on the
    // reader's core, for bytes the stages' core must fetch again anyway).
    // It takes over the queue's chunk reference of each. A run at a time,
    // the hand-over is one loop with nothing else per record in it: one call
    // per record, with its checks of the queue's state, was some 35
    // instructions a record more on the reader's thread.
    struct Run {
        const Entry* first;
        const Entry* last;
    };
    // The mean size of the records of the latest round arranged (a
    // deliver(Run) that bounds bytes in flight counts by it).
    size_t mean_record_size() const { return mean_size_; }

    template <class Deliver>
    void push(uint64_t time, const RawRecord& r, Deliver&& deliver) {
        // Out of order: earlier than a record released before it (perf counts
        // these too; last_flushed_ is 0 until something is released).
        if (time < last_flushed_) ++out_of_order_;
        chunks_.retain(r.chunk);  // the queue's reference, handed on with the record
        assert(r.chunk < ChunkTable::kMaxChunks);
        Entry e;
        e.time = time;
        e.chunk_event = pack(r.chunk, r.event);
        e.pos = static_cast<uint32_t>(r.body.data() - PERF_EVENT_HEADER_SIZE - chunks_.data(r.chunk));
        // Only where a run starts is noted per record: the round's earliest
        // and latest times are those of its runs' ends, found when it is
        // sorted (kept per record, they were a tenth of push's instructions).
        if (!pending_.empty() && time < pending_.back().time) runs_.push_back(pending_.size());
        if (pending_.size() == pending_.capacity()) make_room(pending_, pending_.size() + 1);
        pending_.push_back(e);
        pending_bytes_ += r.size;
        if (++queued_ > max_queued_) release_older_half(deliver);  // no round boundary in sight
    }

    // Releases the older half of what is queued, and delivers it.
    template <class Deliver>
    void release_older_half(Deliver&& deliver) {
        if (queued_ == 0) return;
        ++half_flushes_;
        drain(deliver);
        arrange();
        join();  // all of it in old_, from index 0
        if (!old_.empty()) release_until(old_[old_.size() / 2].time);
        drain(deliver);
    }

    // At PERF_RECORD_FINISHED_ROUND: what the previous round's end allows
    // becomes ready. It is delivered by pump() or drain(), so a reader thread
    // can hand it on a little at a time while it reads the next round.
    template <class Deliver>
    void finished_round(Deliver&& deliver) {
        drain(deliver);  // what the previous round made ready goes first
        arrange();
        release_until(next_flush_);
        next_flush_ = max_time_;
    }

    // Delivers up to n ready records.
    template <class Deliver>
    void pump(Deliver&& deliver, size_t n) {
        // The queue is at its largest before records leave it: here (drain
        // pumps too), not at every push.
        peak_ = std::max(peak_, queued_);
        // Mostly one side is ready (a round's records are released with the
        // round after it): each side's run is delivered straight, the two
        // compared only while both have ready records.
        while (n) {
            if (old_head_ < old_ready_ && new_head_ < new_ready_) {
                // Ties: the older array first (its records were read first).
                if (new_[new_head_].time < old_[old_head_].time)
                    emit_from(new_, new_head_, deliver);
                else
                    emit_from(old_, old_head_, deliver);
                --n;
                continue;
            }
            const bool from_old = old_head_ < old_ready_;
            const Entries& side = from_old ? old_ : new_;
            size_t& head = from_old ? old_head_ : new_head_;
            const size_t end = std::min(from_old ? old_ready_ : new_ready_, head + n);
            if (head == end) return;
            n -= end - head;
            const size_t first = head;
            head = end;
            queued_ -= end - first;
            deliver(Run{side.data() + first, side.data() + end});
        }
    }
    size_t ready() const { return (old_ready_ - old_head_) + (new_ready_ - new_head_); }

    // Delivers every ready record.
    template <class Deliver>
    void drain(Deliver&& deliver) {
        pump(deliver, ready());
    }

    template <class Deliver>
    void flush_all(Deliver&& deliver) { flush_until(~uint64_t{0}, deliver); }

    // Delivers every record up to `limit`, whatever the rounds say (a stream
    // known to hold every record up to there).
    template <class Deliver>
    void flush_until(uint64_t limit, Deliver&& deliver) {
        drain(deliver);
        arrange();
        release_until(limit);
        drain(deliver);
    }

    uint64_t out_of_order() const { return out_of_order_; }
    size_t size() const { return queued_; }
    size_t peak_size() const { return std::max(peak_, queued_); }
    uint64_t half_flushes() const { return half_flushes_; }

private:
    // The record's event, as the reader found it, rides in the chunk id's
    // spare bits: the stages then need not look it up again (its id
    // lookup, with the checks on where the id is, was 28 instructions a
    // record on each thread). Events past 4094 go as not known.
    static constexpr unsigned kChunkBits = 20;
    static_assert(ChunkTable::kMaxChunks == 1u << kChunkBits);
    static uint32_t pack(uint32_t chunk, int event) {
        uint32_t code = static_cast<uint32_t>(event) + 1;  // -1 -> 0
        code = code < (1u << (32 - kChunkBits)) ? code : 0;
        return chunk | code << kChunkBits;
    }
    // resize() leaves new entries uninitialized (byte_buffer.h): every one is
    // written by the sort or merge before it is read.
    using Entries = std::vector<Entry, HugeUninitAllocator<Entry>>;
    // The four arrays (pending_, merged_, new_, old_: they trade buffers by
    // swaps) hold a round each, 65k entries (1 MiB) for the bench's 16-CPU
    // capture. Grown by doubling from small 4 KiB pages, they took over a
    // thousand page faults in all; from kHugeFrom entries on they grow in
    // whole 2 MiB huge pages instead, one fault (and 2 MiB zeroed)
    // each. Smaller queues (small recordings, pipe mode's short rounds) stay
    // on ordinary pages.
    static constexpr size_t kHugeEntries = HugeUninitAllocator<Entry>::kHuge / sizeof(Entry);
    static constexpr size_t kHugeFrom = 4096;
    static void make_room(Entries& v, size_t n) {
        if (n <= v.capacity()) return;
        size_t cap = std::max(n, 2 * v.capacity());
        if (cap >= kHugeFrom) cap = (cap + kHugeEntries - 1) / kHugeEntries * kHugeEntries;
        v.reserve(cap);
    }
    static void sized(Entries& v, size_t n) {
        make_room(v, n);
        v.resize(n);
    }

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

    // Sorts pending_ (pushed in file order: one sorted run per CPU buffer).
    // Pairwise merges of the runs cost log2(runs) passes; a radix sort on the
    // time relative to the round's minimum one pass per digit of up to 13
    // bits of the time span. Whichever needs fewer passes is used (a 64-CPU
    // round has 64 runs: 6 merge passes against 2 digits); a span of more
    // than one digit goes by bucket_sort. All are stable.
    void sort_pending(uint64_t lo, uint64_t hi) {
        if (runs_.empty()) return;
        const unsigned bits = hi > lo ? 64 - static_cast<unsigned>(__builtin_clzll(hi - lo)) : 1;
        const unsigned radix_passes = (bits + kMaxDigitBits - 1) / kMaxDigitBits;
        // runs_ holds the starts of all runs but the first: ceil(log2(runs)) passes.
        const unsigned merge_passes = 64 - static_cast<unsigned>(__builtin_clzll(runs_.size()));
        if (radix_passes >= merge_passes || pending_.size() < 4096)
            merge_runs();
        else if (radix_passes == 1)
            radix_sort(lo, 1, bits);
        else
            bucket_sort(lo, bits);
        runs_.clear();
    }

    // Digits are the span's bits shared out evenly over the fewest passes of
    // at most 13 bits (8192 counters, 32 KB: within L1/L2). A 64-CPU round
    // spans 2^26 ns (50 ms): two passes of 13 bits, where fixed 11-bit
    // digits took three (about 4% of the reader thread).
    static constexpr unsigned kMaxDigitBits = 13;

    // A digit's counts become where each digit's entries start (a stable
    // counting scatter writes them from there on).
    static void counts_to_starts(uint32_t* c, size_t n) {
        uint32_t sum = 0;
        for (size_t d = 0; d < n; ++d) {
            const uint32_t x = c[d];
            c[d] = sum;
            sum += x;
        }
    }

    void radix_sort(uint64_t lo, unsigned passes, unsigned digit_bits) {
        const size_t buckets = size_t{1} << digit_bits;
        const uint64_t mask = buckets - 1;
        sized(merged_, pending_.size());
        std::vector<uint32_t>& counts = counts_;
        counts.assign(buckets * passes, 0);
        for (const Entry& e : pending_) {
            uint64_t k = e.time - lo;
            for (unsigned p = 0; p < passes; ++p, k >>= digit_bits) ++counts[p * buckets + (k & mask)];
        }
        for (unsigned p = 0; p < passes; ++p) {
            uint32_t* c = counts.data() + p * buckets;
            counts_to_starts(c, buckets);
            const unsigned shift = p * digit_bits;
            for (const Entry& e : pending_) merged_[c[((e.time - lo) >> shift) & mask]++] = e;
            pending_.swap(merged_);
        }
    }

    // Spans of more than one digit (a 64-CPU round spans 2^26 ns): the top
    // bits first, into buckets of some 512 entries each, then each bucket on
    // its own by the bits below. Two LSD passes of 13 bits over the whole
    // round scattered every entry to one of 8192 places 2 MB apart, twice: a
    // cache miss per entry per pass (16 ns an entry, a fifth of the reader
    // thread). The top pass writes to a few hundred places, each moving
    // forward (each CPU's run is sorted), and a bucket's passes stay in L1.
    // Stable: every pass is a stable counting scatter (or insertion sort).
    static constexpr size_t kBucketTarget = 512;  // entries: 8 KB, in L1 with its counters
    static constexpr unsigned kLowDigitBits = 9;   // 512 counters per low pass
    static constexpr size_t kInsertionMax = 24;   // smaller buckets: insertion sort

    void bucket_sort(uint64_t lo, unsigned bits) {
        const size_t n = pending_.size();
        unsigned top = 1;
        while (top < kMaxDigitBits && (n >> top) > kBucketTarget) ++top;
        top = std::min(top, bits - 1);
        const unsigned low = bits - top;
        const size_t buckets = size_t{1} << top;
        sized(merged_, n);
        std::vector<uint32_t>& c = counts_;
        c.assign(buckets, 0);
        for (const Entry& e : pending_) ++c[(e.time - lo) >> low];
        counts_to_starts(c.data(), buckets);
        for (const Entry& e : pending_) merged_[c[(e.time - lo) >> low]++] = e;
        // Now c[b] is where bucket b ends, and so where b + 1 starts.
        // Each bucket, from merged_, sorted into the same place in pending_
        // (an odd number of low passes) or back into merged_ (even: then the
        // two arrays swap, rather than each bucket being copied back).
        const uint64_t low_mask = (uint64_t{1} << low) - 1;
        const unsigned passes = (low + kLowDigitBits - 1) / kLowDigitBits;
        const unsigned digit = (low + passes - 1) / passes;
        Entry* const final_place = passes % 2 ? pending_.data() : merged_.data();
        for (size_t b = 0; b < buckets; ++b) {
            const size_t b0 = b ? c[b - 1] : 0, b1 = c[b];
            if (b1 - b0 <= kInsertionMax) {
                insertion_sort_into(merged_.data() + b0, b1 - b0, final_place + b0);
                continue;
            }
            sort_bucket(b0, b1 - b0, lo, low_mask, passes, digit);
        }
        if (passes % 2 == 0) pending_.swap(merged_);
    }

    // Copies n entries from src to dst, sorted by time, stably (src == dst:
    // sorts in place).
    static void insertion_sort_into(const Entry* src, size_t n, Entry* dst) {
        for (size_t i = 0; i < n; ++i) {
            const Entry e = src[i];
            size_t j = i;
            while (j > 0 && dst[j - 1].time > e.time) {
                dst[j] = dst[j - 1];
                --j;
            }
            dst[j] = e;
        }
    }

    // LSD passes over merged_[b0, b0 + m) by the low bits of the time,
    // between merged_ and pending_: it ends in pending_ after an odd number.
    void sort_bucket(size_t b0, size_t m, uint64_t lo, uint64_t low_mask, unsigned passes, unsigned digit) {
        const size_t nb = size_t{1} << digit;
        const uint64_t mask = nb - 1;
        uint32_t* c = low_counts_;
        std::fill(c, c + nb * passes, 0u);
        Entry* src = merged_.data() + b0;
        Entry* dst = pending_.data() + b0;
        for (size_t i = 0; i < m; ++i) {
            uint64_t k = (src[i].time - lo) & low_mask;
            for (unsigned p = 0; p < passes; ++p, k >>= digit) ++c[p * nb + (k & mask)];
        }
        for (unsigned p = 0; p < passes; ++p) {
            uint32_t* cp = c + p * nb;
            counts_to_starts(cp, nb);
            const unsigned shift = p * digit;
            for (size_t i = 0; i < m; ++i) dst[cp[(((src[i].time - lo) & low_mask) >> shift) & mask]++] = src[i];
            std::swap(src, dst);
        }
    }

    void merge_runs() {
        bounds_.clear();
        bounds_.push_back(0);
        bounds_.insert(bounds_.end(), runs_.begin(), runs_.end());
        bounds_.push_back(pending_.size());
        while (bounds_.size() > 2) {
            sized(merged_, pending_.size());
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
    }

    // The new round (sorted) becomes new_; what earlier rounds left is old_.
    // Called with nothing ready, so records made ready are delivered before
    // any later merge: the order is the same whether they go at once or a
    // few at a time.
    void arrange() {
        if (!pending_.empty()) {
            // The round's time span from its runs' ends (each run is sorted).
            uint64_t lo = pending_.front().time, hi = pending_.back().time;
            for (const size_t start : runs_) {
                lo = std::min(lo, pending_[start].time);
                hi = std::max(hi, pending_[start - 1].time);
            }
            max_time_ = std::max(max_time_, hi);
            mean_size_ = std::max<size_t>(pending_bytes_ / pending_.size(), PERF_EVENT_HEADER_SIZE);
            pending_bytes_ = 0;
            sort_pending(lo, hi);
        }
        if (old_head_ == old_.size()) {
            // The usual case: the older array is all delivered.
            old_.swap(new_);
            old_head_ = new_head_;
        } else if (new_head_ < new_.size()) {
            // Both still hold records (late ones, a half flush): one array of them.
            join();
        }
        new_.swap(pending_);
        new_head_ = 0;
        pending_.clear();
        old_ready_ = old_head_;
        new_ready_ = 0;
    }

    // old_ and new_ merged into old_ (from index 0); new_ empty. Ties take
    // from old_, as merge() takes from its first range.
    void join() {
        sized(merged_, (old_.size() - old_head_) + (new_.size() - new_head_));
        merge(old_.data() + old_head_, old_.data() + old_.size(), new_.data() + new_head_, new_.data() + new_.size(),
              merged_.data());
        old_.swap(merged_);
        old_head_ = old_ready_ = 0;
        new_.clear();
        new_head_ = new_ready_ = 0;
    }

    // Makes the queued records up to `limit` ready. The out-of-order test
    // compares against the last of them: the last record released, as if
    // they had all been delivered now.
    void release_until(uint64_t limit) {
        auto until = [limit](const Entries& v, size_t head) {
            return static_cast<size_t>(std::upper_bound(v.begin() + static_cast<long>(head), v.end(), limit,
                                                        [](uint64_t t, const Entry& e) { return t < e.time; }) -
                                       v.begin());
        };
        old_ready_ = until(old_, old_head_);
        new_ready_ = until(new_, new_head_);
        uint64_t last = 0;
        bool any = false;
        if (old_ready_ > old_head_) last = old_[old_ready_ - 1].time, any = true;
        if (new_ready_ > new_head_) last = std::max(last, new_[new_ready_ - 1].time), any = true;
        if (any) last_flushed_ = last;
    }

    // Delivers side[head] as a run of one (and moves head on). The queue's
    // reference to the record's chunk goes with it: deliver() releases it
    // when done with the record (a release here and a retain there were two
    // more writes per record).
    template <class Deliver>
    void emit_from(const Entries& side, size_t& head, Deliver& deliver) {
        --queued_;
        const Entry* e = side.data() + head++;
        deliver(Run{e, e + 1});
    }

    ChunkTable& chunks_;
    // Each sorted; [head, end) still queued, [head, ready) may be delivered.
    Entries old_, new_;
    size_t old_head_ = 0, old_ready_ = 0, new_head_ = 0, new_ready_ = 0;
    Entries pending_;  // pushed since the last flush, in file order
    Entries merged_;
    std::vector<size_t> runs_;    // where a new sorted run starts in pending_
    std::vector<size_t> bounds_, next_;
    std::vector<uint32_t> counts_;
    // A bucket's low-digit counters (up to 64 bits of span: 8 passes of 8 or 9 bits).
    uint32_t low_counts_[8 << kLowDigitBits];
    size_t max_queued_;
    uint64_t next_flush_ = 0;
    uint64_t max_time_ = 0;  // of the records arranged so far
    uint64_t last_flushed_ = 0;
    uint64_t out_of_order_ = 0;
    uint64_t half_flushes_ = 0;
    size_t queued_ = 0;  // records pushed and not yet delivered
    uint64_t pending_bytes_ = 0;  // of pending_'s records
    size_t mean_size_ = PERF_EVENT_HEADER_SIZE;
    size_t peak_ = 0;
};

}  // namespace gilscan
