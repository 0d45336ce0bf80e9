// Handoff — a bounded queue of batches from one producer thread to one
// consumer thread, with the batches coming back for reuse.
//
//   Handoff<std::vector<Item>> h(8);          // at most 8 batches in flight
//   producer:  h.push(std::move(batch));      // false: the consumer gave up
//              while (h.take_done(b)) ...     // batches the consumer finished
//              h.would_wait(bytes);           // push() would block now (a hint)
//              h.wait_idle();                 // everything pushed so far is consumed
//              h.wait_idle_for(100us);        // the same, for at most that long
//              h.close();                     // no more batches
//   consumer:  while (h.pop(b)) { ...; h.done(std::move(b)); }
//              h.pop(b, [&] { return other_work(); });  // while nothing is queued
//   anyone:    h.nudge();                     // there is other work for pop() now
//              h.abort();                     // on error: the producer stops
//
// Session uses it to decode and order records on one core while the stages
// run on another. Batches of a few thousand records keep the locking cost
// per record negligible.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace gilscan {

// A Batch is any movable type (a std::vector of items, or a struct of
// them): it is moved in and out, never copied or looked into.
template <class Batch>
class Handoff {
public:
    // At most max_batches queued and, when max_bytes > 0, at most that many
    // bytes (a batch always fits into an empty queue).
    explicit Handoff(size_t max_batches, size_t max_bytes = 0) : max_(max_batches), max_bytes_(max_bytes) {}

    bool push(Batch&& batch, size_t bytes = 0) {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] {
            return aborted_ || (full_.size() < max_ && fits(full_.empty() ? 0 : queued_bytes(), bytes));
        });
        if (aborted_) return false;
        full_.push_back({std::move(batch), bytes});
        queued_.store(queued_bytes() + bytes, std::memory_order_relaxed);
        ++pushed_;
        cv_.notify_all();
        return true;
    }
    bool pop(Batch& out) {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return closed_ || aborted_ || !full_.empty(); });
        return pop_locked(out);
    }
    // pop(), doing idle() (outside the lock) while nothing is queued. idle()
    // does one piece of work and returns true, or returns false when it has
    // none; the consumer then sleeps until a batch comes or nudge() says
    // there is new idle work. A batch that comes while idle() works waits
    // for that piece only.
    template <class Idle>
    bool pop(Batch& out, Idle&& idle) {
        for (;;) {
            {
                std::unique_lock<std::mutex> l(mu_);
                cv_.wait(l, [&] { return aborted_ || closed_ || !full_.empty() || nudged_; });
                if (aborted_ || closed_ || !full_.empty()) break;
                nudged_ = false;
            }
            while (idle()) {
                std::lock_guard<std::mutex> l(mu_);
                if (aborted_ || closed_ || !full_.empty()) {
                    nudged_ = true;  // idle work may be left: look again at the next pop
                    return pop_locked(out);
                }
            }
        }
        return pop(out);
    }
    // The producer (or anyone): there is new work for pop()'s idle().
    void nudge() {
        std::lock_guard<std::mutex> l(mu_);
        nudged_ = true;
        cv_.notify_all();
    }
    void done(Batch&& batch) {
        std::lock_guard<std::mutex> l(mu_);
        done_.push_back(std::move(batch));
        ++finished_;
        cv_.notify_all();
    }
    bool take_done(Batch& out) {
        std::lock_guard<std::mutex> l(mu_);
        if (done_.empty()) return false;
        out = std::move(done_.back());
        done_.pop_back();
        return true;
    }
    // Bytes of the batches waiting for the consumer. Changed only under the
    // lock; the producer reads it without the lock as a hint.
    size_t queued_bytes() const { return queued_.load(std::memory_order_relaxed); }
    // Whether push(batch of `bytes`) would wait for room now, by the byte
    // bound (a hint: read without the lock).
    bool would_wait(size_t bytes) const { return !fits(queued_bytes(), bytes); }
    // Until the consumer has finished every batch pushed so far; false if it gave up.
    bool wait_idle() {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return aborted_ || finished_ == pushed_; });
        return !aborted_;
    }
    // wait_idle() for at most `timeout`: true once the consumer has finished
    // every batch pushed (or gave up), false if it is still at work.
    template <class Duration>
    bool wait_idle_for(Duration timeout) {
        std::unique_lock<std::mutex> l(mu_);
        return cv_.wait_for(l, timeout, [&] { return aborted_ || finished_ == pushed_; });
    }
    void close() {
        std::lock_guard<std::mutex> l(mu_);
        closed_ = true;
        cv_.notify_all();
    }
    void abort() {
        std::lock_guard<std::mutex> l(mu_);
        aborted_ = true;
        cv_.notify_all();
    }

private:
    bool pop_locked(Batch& out) {  // with mu_ held
        if (aborted_ || full_.empty()) return false;
        out = std::move(full_.front().batch);
        queued_.store(queued_bytes() - full_.front().bytes, std::memory_order_relaxed);
        full_.pop_front();
        cv_.notify_all();
        return true;
    }
    // The byte bound: a batch always fits into an empty queue.
    bool fits(size_t queued, size_t bytes) const { return max_bytes_ == 0 || queued == 0 || queued + bytes <= max_bytes_; }
    std::mutex mu_;
    std::condition_variable cv_;
    struct Queued {
        Batch batch;
        size_t bytes;
    };
    std::deque<Queued> full_;
    std::vector<Batch> done_;
    size_t max_, max_bytes_;
    std::atomic<size_t> queued_{0};  // bytes of full_
    uint64_t pushed_ = 0, finished_ = 0;
    bool closed_ = false, aborted_ = false;
    bool nudged_ = false;  // new work for pop()'s idle()
};

}  // namespace gilscan
