// TraceRelay — the trace's events formatted by a thread that has time: the
// stages hand each event over as a few compact bytes, and the target sink
// (the TraceWriter's JSON, the PftraceWriter's protobuf) is fed from them
// later (the same calls, in the same order: the trace is byte for byte what
// the writer alone writes).
//
//   OutputFile out("trace.json");
//   TraceWriter tw(out, opt);
//   TraceRelay relay(tw);
//   session.set_reader_idle([&] { return relay.format_some(); });  // the reader, instead of waiting
//   GilTracker gil(&relay);  Timeline tl(session, relay);  session.run(...);
//   relay.close();                   // the rest formatted here; rethrows an error
//   tw.finish(threads, meta);  out.commit();
//
//   PftraceWriter pw(out, opt, sys);
//   TraceRelay relay(pw, pw.filter(), &pw);   // the scheduler's events too
//   relay.start_thread();            // formatted by a thread of its own
//   timeline.set_sched_tap(&relay);  ...  relay.close();  pw.finish(...);
//
// Why: formatting numbers as text was a quarter of the stages' thread on a
// scheduler capture with its trace — the thread that bounds the run — while
// the reader thread waited for the stages a third of the time. Handed over,
// an event costs its fields' bytes; for JSON the reader formats queued
// blocks when it would otherwise wait for room (a third busy thread, on two
// cores, took CPU from the two that bound the run). A .pftrace's encoding
// is a thread of its own (start_thread): the reader, once it has read the
// file, has no more waits to fill, and the stages' thread runs on alone
// for its last part, where the encoding then overlaps it. When the queue is
// full (nobody had time), the stages format the oldest block themselves.
//
// Blocks are formatted one at a time (a mutex) and in the order they were
// handed over. An error while formatting (a write that fails) drops what is
// queued; the next block handed over, or close(), rethrows it on the
// stages' thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/output/trace_writer.h"

namespace gilscan {

// alignas(128): its first lines are the stages' (written per event), fmt_
// and what follows are the formatting thread's (per block), and no other
// object shares a line with either.
class alignas(128) TraceRelay : public TraceSink, public SchedTap {
public:
    explicit TraceRelay(TraceWriter& writer) : TraceRelay(writer, writer.filter()) {}
    // Any sink: the events it is handed are dropped here by `filter` first
    // (the target's own); `tap`, when given, takes the scheduler's events
    // (without one, they are not handed over).
    TraceRelay(TraceSink& target, const TraceFilter& filter, SchedTap* tap = nullptr);
    ~TraceRelay() override;

    // A thread of its own formats the blocks as they are handed over, until
    // close() (the .pftrace's: see above). Once at most, before any event.
    void start_thread();

    void span(const Span& s) override;
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override;
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns, bool cut) override;
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                    std::string_view culprit) override;
    void gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) override;
    bool wants_plain_spans() const override { return plain_spans_; }
    void sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) override;
    void sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) override;
    void switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) override;

    // Any thread: formats the oldest queued block unless another thread is
    // formatting one. False when there was nothing to do (or it was busy).
    bool format_some();
    // The stages' thread, at the end: formats everything handed over and
    // rethrows the first error. The writer is the caller's alone after it.
    void close();

    // Events are handed over in blocks of about kBlock bytes; with kMaxQueued
    // of them waiting, the stages format the oldest themselves.
    static constexpr size_t kBlock = 128u << 10;
    static constexpr size_t kMaxQueued = 16;

    // Counts for the tests: blocks formatted by format_some() (the reader)
    // or the relay's own thread, and by the stages' thread (queue full, and
    // close()).
    uint64_t blocks_formatted_by_others() const { return by_others_.load(std::memory_order_relaxed); }
    uint64_t blocks_formatted_by_producer() const { return by_producer_.load(std::memory_order_relaxed); }

    // Where blocks come from: 2 MiB slabs on transparent huge pages, cut into
    // kBlock pieces that are reused, never returned before the relay goes.
    // Blocks of their own (malloc'd at 128 KiB, each its own mmap) took a
    // fault per 4 KiB page the first time they were filled. A block resized past kBlock (one event
    // larger than a block) is an ordinary allocation.
    class Slabs {
    public:
        Slabs() = default;
        Slabs(const Slabs&) = delete;
        Slabs& operator=(const Slabs&) = delete;
        ~Slabs();
        uint8_t* take();
        void give(uint8_t* p);
        size_t slabs() const;  // for the tests

    private:
        mutable std::mutex mu_;
        std::vector<void*> slabs_;
        std::vector<uint8_t*> free_;
    };
    // A vector's allocator: kBlock pieces from the slabs, anything else from
    // the heap; no zero fill (UninitAllocator: every block is written before
    // it is read).
    template <class T>
    struct SlabAllocator : UninitAllocator<T> {
        template <class U>
        struct rebind {
            using other = SlabAllocator<U>;
        };
        using propagate_on_container_move_assignment = std::true_type;
        using propagate_on_container_swap = std::true_type;
        using propagate_on_container_copy_assignment = std::true_type;
        using is_always_equal = std::false_type;
        Slabs* slabs = nullptr;
        explicit SlabAllocator(Slabs* s) noexcept : slabs(s) {}
        template <class U>
        SlabAllocator(const SlabAllocator<U>& o) noexcept : slabs(o.slabs) {}
        T* allocate(size_t n) {
            if (n * sizeof(T) == kBlock) return reinterpret_cast<T*>(slabs->take());
            return std::allocator<T>::allocate(n);
        }
        void deallocate(T* p, size_t n) noexcept {
            if (n * sizeof(T) == kBlock) return slabs->give(reinterpret_cast<uint8_t*>(p));
            std::allocator<T>::deallocate(p, n);
        }
        template <class U>
        bool operator==(const SlabAllocator<U>& o) const noexcept { return slabs == o.slabs; }
        template <class U>
        bool operator!=(const SlabAllocator<U>& o) const noexcept { return slabs != o.slabs; }
    };
    using Block = std::vector<uint8_t, SlabAllocator<uint8_t>>;
    size_t slabs_used() const { return slabs_.slabs(); }  // for the tests

private:
    enum class Op : uint8_t { Span, NameThread, GilWait, GilLock, GilHolder, GilWaiters, SchedSwitch, SchedWake, SwitchIn };
    template <class... F>
    void append(Op op, const F&... fields);  // one event's bytes (trace_relay.cc)
    char* room(size_t n);  // n bytes at the end of the current block
    void hand_off();       // the current block to the queue, a spare one in its place
    // Formats the oldest queued block; called with fmt_ held. False: none.
    bool format_front();
    void replay(const Block& block, size_t used);
    void check_error();
    void thread_loop();
    void stop_thread();

    TraceSink& writer_;
    SchedTap* const tap_;
    const TraceFilter filter_;  // the writer's, copied: see TraceFilter
    const bool plain_spans_;
    Slabs slabs_;  // before every block: they go back to it when destroyed
    Block block_;
    size_t used_ = 0;

    alignas(128) std::mutex fmt_;  // held while a block is formatted: one at a time, in order
    std::mutex mu_;   // the queue, the spares, the error
    struct Full {
        Block bytes;
        size_t used = 0;
    };
    std::deque<Full> full_;
    std::vector<Block> spare_;
    std::exception_ptr error_;
    std::condition_variable queued_;  // start_thread()'s: a block handed over, or closing
    bool closing_ = false;
    std::thread thread_;
    std::atomic<uint64_t> by_others_{0}, by_producer_{0};  // written under fmt_
};

}  // namespace gilscan
