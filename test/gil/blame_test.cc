// GIL blame's interval arithmetic on synthetic recordings from the test
// perf.data writer: holds x waits, CPU samples inside the intervals, sleeps
// split at their edges, with holders from uprobes and inferred.
#include <doctest/doctest.h>

#include "gilscan/gil/blame.h"
#include "gilscan/perfdata/perf_abi.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

constexpr int64_t kS = 1;  // prev_state TASK_INTERRUPTIBLE

// A cpu-clock event (no stacks: its samples' time lands on kSampleNoStack).
int add_cpu_clock(PerfWriter& w) {
    PerfEventAttr a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_type = kTpSampleType & ~PERF_SAMPLE_RAW;  // the sample id where the tracepoints have it
    a.flags = 1ull << ATTR_BIT_sample_id_all;
    return w.add_event(a, "cpu-clock");
}

void cpu_sample(PerfWriter& w, int ev, uint64_t t, int32_t tid, int32_t pid = 10) {
    TestSample s;
    s.pid = pid;
    s.tid = tid;
    s.time = t;
    s.cpu = 0;
    w.sample(ev, s);
}

// (on, off) ns charged to (pid 10, stack).
struct Charged {
    std::map<uint32_t, std::pair<uint64_t, uint64_t>> by_stack;
    uint64_t unattributed = 0;
    bool inferred = false;
    uint64_t on(uint32_t id) const { return by_stack.count(id) ? by_stack.at(id).first : 0; }
    uint64_t off(uint32_t id) const { return by_stack.count(id) ? by_stack.at(id).second : 0; }
    uint64_t total() const {
        uint64_t n = 0;
        for (const auto& [id, c] : by_stack) n += c.first + c.second;
        return n;
    }
};

// The stages as the pipeline builds them; gil_tids: the threads whose
// sleeps are GIL waits when there are no uprobes (the stack classifier's answer).
Charged blame(const std::vector<uint8_t>& bytes, std::set<int32_t> gil_tids = {}) {
    TempFile f(bytes);
    Session s(f.path);
    ProcessMaps maps;
    Collect spans;
    Timeline tl(s, spans);
    GilTracker gil(nullptr);
    ModuleCache modules(ModuleOptions{});
    BlameStacks stacks(modules);
    GilBlame b(maps, stacks);
    gil.set_listener(&b);
    tl.set_observer(&b);
    const SleepClassifier by_probes = gil_probe_classifier(gil);
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        if (gil.seen_probes()) by_probes(smp, ev, ps, label);
        else if (gil_tids.count(smp.tid)) label.gil = true;
    });
    FanOutOf<ProcessMaps, GilTracker, Timeline, GilBlame> stages(maps, gil, tl, b);
    s.run(stages);
    const uint64_t end = s.stats().last_time;
    gil.finish(end);
    tl.finish(end);
    b.finish(end);
    Charged c;
    for (const BlameCharge& ch : b.charges()) {
        REQUIRE(ch.pid == 10);
        c.by_stack[ch.stack] = {ch.on_cpu_ns, ch.off_cpu_ns};
    }
    c.unattributed = b.unattributed_ns();
    c.inferred = b.inferred();
    return c;
}

}  // namespace

TEST_CASE("uprobes: contended hold is the holder's time while another waits; a CPU sample names what came before it") {
    GilRecording g;
    const int cpu = add_cpu_clock(g.r.w);
    g.ev(g.take, 100, 11);
    g.ev(g.take_ret, 110, 11);   // 11 holds from 110
    g.ev(g.take, 120, 12);       // 12 waits from 120: contended from here
    cpu_sample(g.r.w, cpu, 150, 11);  // stands for 11's on-CPU time before it: 120..150
    g.ev(g.drop, 200, 11);       // 150..200: no sample after it, on CPU
    g.ev(g.drop_ret, 201, 11);
    g.ev(g.take_ret, 206, 12);   // 12 holds alone: no one waits, nothing charged
    g.ev(g.drop, 300, 12);
    cpu_sample(g.r.w, cpu, 310, 12);
    const Charged c = blame(g.r.w.build());
    CHECK_FALSE(c.inferred);
    CHECK(c.on(BlameStacks::kSampleNoStack) == 30);
    CHECK(c.on(BlameStacks::kNoSample) == 50);
    CHECK(c.total() == 80);
}

TEST_CASE("uprobes: a holder's sleep is split at the wait's edges, off CPU inside, on CPU after its wake-up") {
    GilRecording g;
    g.ev(g.take, 100, 11);
    g.ev(g.take_ret, 101, 11);              // 11 holds from 101
    g.r.switch_(130, 0, 10, 11, kS, 0);     // 11 sleeps holding the GIL (a blocking C call)
    g.ev(g.take, 150, 12);                  // 12 waits from 150
    g.r.waking(170, 1, 99, 99, 11);         // 11 woken at 170 (off CPU 150..170 contended)
    g.r.switch_(171, 1, 99, 99, kS, 11);
    g.ev(g.drop, 250, 11);                  // on CPU 170..250
    g.ev(g.take_ret, 260, 12);
    g.ev(g.drop, 270, 12);
    const Charged c = blame(g.r.w.build());
    CHECK(c.off(BlameStacks::kNoStack) == 20);
    CHECK(c.on(BlameStacks::kNoSample) == 80);
    CHECK(c.total() == 100);
}

TEST_CASE("uprobes: two waiters count once; contended time ends when the last stops waiting") {
    GilRecording g;
    g.ev(g.take, 100, 11);
    g.ev(g.take_ret, 100, 11);
    g.ev(g.take, 110, 12);
    g.ev(g.take, 120, 13);
    g.ev(g.drop, 200, 11);       // 11: 110..200 contended = 90
    g.ev(g.take_ret, 205, 12);   // 12 holds, 13 still waits: 205..240 contended
    g.ev(g.drop, 240, 12);
    g.ev(g.take_ret, 241, 13);   // 13 holds alone
    g.ev(g.drop, 290, 13);
    const Charged c = blame(g.r.w.build());
    CHECK(c.total() == 90 + 35);
}

TEST_CASE("inferred: the thread that wakes a GIL waiter held the GIL since the last such wake-up") {
    SchedRecording r;
    r.switch_(90, 0, 10, 13, kS, 11);   // 13 sleeps (innocent: released the GIL)
    r.switch_(100, 1, 10, 12, kS, 0);   // 12 waits for the GIL (S(GIL)) from 100
    r.waking(180, 0, 10, 11, 12);       // 11 signals 12: 11 held 100..180, on CPU
    r.switch_(181, 0, 10, 11, 0, 12);   // 11 preempted, 12 runs
    r.waking(190, 0, 10, 12, 13);       // 12 wakes 13 (not a GIL wait: no commit)
    r.switch_(200, 0, 10, 12, kS, 11);  // 12 waits again from 200: no one wakes it
    r.switch_(300, 0, 10, 11, kS, 0);
    const Charged c = blame(r.w.build(), {12});
    CHECK(c.inferred);
    CHECK(c.on(BlameStacks::kNoSample) == 80);
    CHECK(c.total() == 80);
    CHECK(c.unattributed == 100);  // 200..300 waited with no hand-off after it
}

TEST_CASE("inferred: a holder asleep is charged off CPU up to its wake-up, then on CPU; other threads' time is dropped") {
    SchedRecording r;
    r.switch_(90, 0, 10, 11, kS, 13);   // 11 sleeps (it holds the GIL: a blocking C call)
    r.switch_(100, 1, 10, 12, kS, 0);   // 12 waits from 100
    r.switch_(120, 0, 10, 13, kS, 0);   // 13 (innocent) sleeps 120..160: dropped at the commit
    r.waking(150, 0, 99, 99, 11);       // 11 woken by another process: off CPU 100..150
    r.waking(160, 0, 99, 99, 13);
    r.switch_(151, 0, 99, 99, kS, 11);
    r.waking(170, 0, 10, 11, 12);       // 11 signals 12: on CPU 150..170
    r.switch_(175, 0, 10, 11, kS, 12);
    const Charged c = blame(r.w.build(), {12});
    CHECK(c.off(BlameStacks::kNoStack) == 50);
    CHECK(c.on(BlameStacks::kNoSample) == 20);
    CHECK(c.total() == 70);
}

TEST_CASE("inferred: a waiter woken by a timer (another process's task) is no hand-off; its waits all go to the next") {
    SchedRecording r;
    r.switch_(100, 1, 10, 12, kS, 0);   // 12 waits from 100
    r.waking(120, 1, 99, 99, 12);       // the switch interval's timeout, in another task's context
    r.switch_(125, 1, 10, 12, kS, 0);   // 12 waits again
    r.waking(200, 0, 10, 11, 12);       // 11 drops and signals: 11 held all along
    r.switch_(210, 0, 10, 11, kS, 12);
    const Charged c = blame(r.w.build(), {12});
    CHECK(c.total() == 20 + 75);
}
