// TraceRelay — the trace's events formatted by whichever thread has time:
// the stages hand each event over as a few compact bytes, and the JSON text
// is made from them later by the TraceWriter (the same code, in the same
// order: the trace is byte for byte what TraceWriter alone writes).
//
//   OutputFile out("trace.json");
//   TraceWriter tw(out, opt);
//   TraceRelay relay(tw);
//   session.set_reader_idle([&] { return relay.format_some(); });  // the reader, instead of waiting
//   GilTracker gil(&relay);  Timeline tl(session, relay);  session.run(...);
//   relay.close();                   // the rest formatted here; rethrows an error
//   tw.finish(threads, meta);  out.commit();
//
// Why: formatting numbers as text was a quarter of the stages' thread on a
// scheduler capture with its trace — the thread that bounds the run — while
// the reader thread waited for the stages a third of the time. Handed over,
// an event costs its fields' bytes; the reader formats queued blocks when
// it would otherwise wait for room. When the queue is full (the reader had
// no time), the stages format the oldest block themselves. No thread of its
// own: on two cores a third busy thread took CPU from the two that bound
// the run (0.41 s against 0.42 s without it; 0.38 s with it niced).
//
// Blocks are formatted one at a time (a mutex) and in the order they were
// handed over. An error while formatting (a write that fails) drops what is
// queued; the next block handed over, or close(), rethrows it on the
// stages' thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string_view>
#include <vector>

#include "gilscan/byte_buffer.h"
#include "gilscan/trace_writer.h"

namespace gilscan {

// alignas(128): its first lines are the stages' (written per event), fmt_
// and what follows are the formatting thread's (per block), and no other
// object shares a line with either.
class alignas(128) TraceRelay : public TraceSink {
public:
    explicit TraceRelay(TraceWriter& writer);

    void span(const Span& s) override;
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override;
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint64_t start_ns, uint64_t end_ns, bool cut) override;
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns) override;
    void gil_waiters(int32_t pid, uint64_t ts_ns, uint32_t waiting) override;

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
    // and by the stages' thread (queue full, and close()).
    uint64_t blocks_formatted_by_others() const { return by_others_.load(std::memory_order_relaxed); }
    uint64_t blocks_formatted_by_producer() const { return by_producer_.load(std::memory_order_relaxed); }

private:
    enum class Op : uint8_t { Span, NameThread, GilWait, GilLock, GilHolder, GilWaiters };
    template <class... F>
    void append(Op op, const F&... fields);  // one event's bytes (trace_relay.cc)
    char* room(size_t n);  // n bytes at the end of the current block
    void hand_off();       // the current block to the queue, a spare one in its place
    // Formats the oldest queued block; called with fmt_ held. False: none.
    bool format_front();
    void replay(const ChunkBytes& block, size_t used);
    void check_error();

    TraceWriter& writer_;
    const TraceFilter filter_;  // the writer's, copied: see TraceFilter
    ChunkBytes block_;
    size_t used_ = 0;

    alignas(128) std::mutex fmt_;  // held while a block is formatted: one at a time, in order
    std::mutex mu_;   // the queue, the spares, the error
    struct Full {
        ChunkBytes bytes;
        size_t used = 0;
    };
    std::deque<Full> full_;
    std::vector<ChunkBytes> spare_;
    std::exception_ptr error_;
    std::atomic<uint64_t> by_others_{0}, by_producer_{0};  // written under fmt_
};

}  // namespace gilscan
