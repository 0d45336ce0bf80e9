// TraceSink — what the stages put into a trace: spans from the timeline,
// GIL spans, holders and waiter counts from the GIL tracker, track names.
// The output stage implements it: TraceWriter (trace_writer.h) formats each
// event at once, TraceRelay (trace_relay.h) hands it over to be formatted
// later, by the reader thread while it would wait.
//
//   GilTracker gil(&trace_sink);
//   InOrderTraceSink in_order(timeline, trace_sink);   // -j 3 and up
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gilscan/sched/timeline.h"

namespace gilscan {

class TraceSink : public SpanSink {
public:
    // Names an extra track (e.g. the per-process "GIL holder" track).
    virtual void name_thread(int32_t pid, int32_t tid, std::string_view name) = 0;

    // The GIL tracker's events, typed rather than as names and args built
    // per event (they are most of a uprobe capture's trace: a third of its
    // events are counters, a third GIL spans; as strings they were built,
    // copied into the relay and checked for escaping, event by event):
    //   gil_span:    "ph":"X", cat "GIL state", "GIL wait" or "LOCK"; args {"gil":gil+1} for the
    //                process's second GIL and later (subinterpreters with their own), {"cut_at_end":true} when cut
    //   gil_holder:  "ph":"X" on the track (pid, track_tid), cat "GIL holder", "GIL held by H", args {"holder":H},
    //                and "culprit" (GIL blame's function for the hold's contended time) when not empty
    //   gil_waiters: "ph":"C", "GIL waiters" (the process's GIL `gil` > 0: "GIL waiters (GIL gil+1)"),
    //                args {"waiting":N}
    enum class GilSpan : uint8_t { Wait, Lock };
    virtual void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns, bool cut) = 0;
    virtual void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                            std::string_view culprit) = 0;
    virtual void gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) = 0;
};

// The GIL tracker's events in order with the timeline's spans. At -j 3 and
// up a sleep's span waits for its worker's label, and the spans after it
// wait with it (Timeline::output); the tracker writes straight to the trace,
// so its events would come out ahead of spans that -j 1 writes before them.
// Through this sink they wait behind those spans too.
//
//   InOrderTraceSink in_order(timeline, *trace_sink);
//   GilTracker gil(&in_order);
class InOrderTraceSink final : public TraceSink, private DeferredSink {
public:
    InOrderTraceSink(Timeline& tl, TraceSink& next) : tl_(tl), next_(next) {}
    // Spans and track names pass straight on (the tracker writes none).
    void span(const Span& s) override { next_.span(s); }
    bool wants_spans() const override { return next_.wants_spans(); }
    bool wants_plain_spans() const override { return next_.wants_plain_spans(); }
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override { next_.name_thread(pid, tid, name); }
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns, bool cut) override;
    // A culprit is never deferred: GIL blame, which names them, runs without -j workers.
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                    std::string_view culprit) override;
    void gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) override;

private:
    enum Kind : uint8_t { kSpan, kHolder, kWaiters };
    void replay(const DeferredEvent& e) override;
    Timeline& tl_;
    TraceSink& next_;
};

// JSON string escaping (quotes included), for comm names and the frame
// names the stack classifier keeps ready as trace text. Defined with the
// trace writer's formatting (trace_writer.cc), which it shares.
void append_json_string(std::string& out, std::string_view s);

}  // namespace gilscan
