// The hot path allocates nothing per event: the same recording with twice
// as many scheduler events and GIL-labelled sleeps must not take (nearly)
// twice as many heap allocations, and a warm stack classifier none per sleep. Counted by replacing operator new in this
// executable of its own (not built under sanitizers, which replace it too).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include <cstdio>
#include <memory>

#include "gilscan/gil/gil_stacks.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/output/output_file.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/output/trace_relay.h"
#include "gilscan/output/trace_writer.h"
#include "support/test_util.h"

namespace {
std::atomic<uint64_t> g_news{0};
}  // namespace

void* operator new(std::size_t n) {
    g_news.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
// GCC cannot see that this operator new is the malloc these frees pair with.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace gilscan;
using namespace gilscan::test;

namespace {

struct CountingSink : SpanSink {
    SpanSink* next = nullptr;  // the trace writer, when there is one
    uint64_t spans = 0, gil_sleeps = 0;
    void span(const Span& s) override {
        ++spans;
        gil_sleeps += s.name == "S(GIL)";
        if (next) next->span(s);
    }
};

struct Run {
    uint64_t allocations, spans, gil_sleeps;
};

// `cycles` rounds of: 11 asks for the GIL held by 12 and sleeps inside
// take_gil (S(GIL), labelled from the uprobes), 12 drops it and wakes 11,
// 12 sleeps (plain S), 11 takes the GIL, drops it later.
Run run(int cycles, bool trace, bool relayed = false) {
    GilRecording g;
    for (int i = 0; i < cycles; ++i) {
        const uint64_t t = 1000 + static_cast<uint64_t>(i) * 1000;
        g.ev(g.take, t, 11);
        g.r.switch_(t + 10, 0, 10, 11, 1, 12);
        g.ev(g.drop, t + 40, 12);
        g.ev(g.drop_ret, t + 41, 12);
        g.r.waking(t + 50, 0, 10, 12, 11);
        g.r.switch_(t + 60, 0, 10, 12, 1, 11);
        g.ev(g.take_ret, t + 70, 11);
        g.ev(g.drop, t + 500, 11);
        g.ev(g.drop_ret, t + 501, 11);
        g.r.waking(t + 510, 0, 10, 11, 12);
        g.r.switch_(t + 520, 0, 10, 11, 1, 12);
        g.ev(g.take, t + 530, 12);
        g.ev(g.take_ret, t + 531, 12);
    }
    TempFile f(g.r.w.build());
    Session s(f.path);
    // With the trace: spans, GIL spans and counters formatted into the
    // output's buffers and written by its thread.
    const std::string out_path = f.path + ".json";
    // Relayed: handed over as bytes and formatted at the end (-j 2 and up).
    std::unique_ptr<OutputFile> out;
    std::unique_ptr<TraceWriter> writer;
    std::unique_ptr<TraceRelay> relay;
    if (trace) {
        out = std::make_unique<OutputFile>(out_path);
        writer = std::make_unique<TraceWriter>(*out, TraceOptions());
        if (relayed) relay = std::make_unique<TraceRelay>(*writer);
    }
    TraceSink* const to = relay ? static_cast<TraceSink*>(relay.get()) : writer.get();
    GilTracker gil(to);
    CountingSink sink;
    sink.next = to;
    Timeline tl(s, sink);
    tl.set_classifier(gil_probe_classifier(gil));
    FanOutOf<GilTracker, Timeline> stages(gil, tl);
    const uint64_t before = g_news.load();
    s.run(stages);
    if (relay) relay->close();
    const uint64_t after = g_news.load();
    if (out) std::remove(out_path.c_str());  // never committed
    return {after - before, sink.spans, sink.gil_sleeps};
}

}  // namespace

TEST_CASE("no heap allocation per event: decoding, GIL tracker, timeline, probe labels, the trace") {
    for (int mode = 0; mode < 3; ++mode) {
        const bool trace = mode > 0, relayed = mode == 2;
        CAPTURE(trace);
        CAPTURE(relayed);
        const Run small = run(2000, trace, relayed), large = run(4000, trace, relayed);
        CAPTURE(small.allocations);
        CAPTURE(large.allocations);
        // The labelled path really ran, once per cycle.
        CHECK(small.gil_sleeps == 2000);
        CHECK(large.gil_sleeps == 4000);
        CHECK(large.spans > small.spans + 10000);
        // 26,000 more events: only vectors growing (a few doublings) may allocate.
        CHECK(large.allocations < small.allocations + 100);
    }
}

TEST_CASE("no heap allocation per sleep stack once warm: the DWARF classifier (real recording)") {
    // Each sleep's stack is classified twice in a row: the first call warms
    // what a new stack may add (modules, CFI rules of new pcs, the label's
    // capacity); the second must then allocate nothing. (libdw's own mallocs,
    // where the cached rules stop, are not operator new and not counted.)
    const std::string path = std::string(GILSCAN_TESTDATA) + "/stacks_py311.data";
    Session s(path);
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
    GilStackClassifier gsc(&maps, modules);
    CountingSink sink;
    Timeline tl(s, sink);
    uint64_t sleeps = 0, second_calls = 0;
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        gsc.classify(smp, ev, ps, label);
        if (ps.cls != StateClass::Sleeping) return;
        ++sleeps;
        const uint64_t before = g_news.load();
        gsc.classify(smp, ev, ps, label);
        second_calls += g_news.load() - before;
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
    CAPTURE(sleeps);
    CHECK(sleeps > 100);
    CHECK(gsc.stats().decided > 100);  // stacks really reached CPython frames
    CHECK(sink.gil_sleeps > 0);
    CHECK(second_calls == 0);
}
