#include <doctest/doctest.h>

#include <functional>
#include <limits>
#include <map>
#include <random>

#include "gilscan/sched/timeline.h"
#include "support/test_util.h"
#include "gilscan/sched/tid_map.h"

using namespace gilscan;
using namespace gilscan::test;

TEST_CASE("sleep ends at the wake-up, runnable until the switch-in, running after") {
    SchedRecording r;
    r.switch_(50, 0, 10, 12, 1, 11);  // 11 switched in at 50
    r.switch_(100, 0, 10, 11, 1, 0);  // 11 sleeps at 100
    r.waking(150, 1, 10, 12, 11);     // woken at 150 by 12
    r.switch_(170, 1, 10, 12, 1, 11); // on a CPU at 170
    r.switch_(400, 1, 10, 11, 1, 0);
    r.waking(500, 1, 10, 12, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 2);
    CHECK(sleeps[0].start == 100);
    CHECK(sleeps[0].end == 150);
    CHECK(sleeps[0].name == "S");
    CHECK(sleeps[0].waker == 12);
    CHECK_FALSE(sleeps[0].cut);
    auto run = a.spans.of(11, SpanKind::Running);
    REQUIRE(run.size() >= 2);
    CHECK(run[0].start == 50);
    CHECK(run[0].end == 100);
    CHECK(run[1].start == 170);
    CHECK(run[1].end == 400);
    const ThreadStats* t = a.thread(11);
    REQUIRE(t);
    CHECK(t->sleep_count == 2);
    CHECK(t->sleep_ns == 50 + 100);
    CHECK(t->runnable_ns == 20);
    CHECK(t->running_ns == 50 + 230);
    CHECK(t->hidden_switch_ins == 0);
}

TEST_CASE("preempted while runnable (prev_state 0x100, R+) is runnable, not asleep") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 0, 12);
    r.switch_(20, 0, 10, 11, 0x100, 12);  // R+: preempted
    r.switch_(60, 0, 10, 12, 1, 11);
    r.switch_(90, 0, 10, 11, 1, 0);
    Analysis a = analyse_bytes(r.w.build());
    auto rn = a.spans.of(11, SpanKind::Runnable);
    REQUIRE(rn.size() == 1);
    CHECK(rn[0].start == 20);
    CHECK(rn[0].end == 60);
    CHECK(rn[0].name == "R+");
    CHECK(a.thread(11)->sleep_count == 1);  // only the last one, cut at the end
}

TEST_CASE("D is its own state") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 2, 0);
    r.waking(40, 1, 10, 12, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto d = a.spans.of(11, SpanKind::DiskSleep);
    REQUIRE(d.size() == 1);
    CHECK(d[0].name == "D");
    CHECK(d[0].end - d[0].start == 30);
    CHECK(a.thread(11)->disk_count == 1);
    CHECK(a.thread(11)->sleep_count == 0);
}

TEST_CASE("a sleep still open at the end is cut there and marked") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 1, 0);
    r.switch_(90, 1, 10, 12, 1, 0);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].cut);
    CHECK(sleeps[0].end == 90);
}

TEST_CASE("switch-in never recorded (per-process recording): woken time counts as running") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 1, 99);  // next is another process's task
    r.waking(50, 1, 20, 99, 11);      // woken by a task of another process
    r.waking(80, 1, 10, 11, 12);      // 11 is current here: it was switched in unseen
    r.switch_(120, 0, 10, 11, 1, 99);
    Analysis a = analyse_bytes(r.w.build());
    const ThreadStats* t = a.thread(11);
    REQUIRE(t);
    CHECK(t->hidden_switch_ins == 1);
    CHECK(t->hidden_switch_in_ns == 80 - 50);  // woken at 50, next seen (running) at 80
    CHECK(t->runnable_ns == 0);
    CHECK(t->running_ns == 30 + 40);
    // 99 belongs to a process the recording does not follow: no spans, not in the table.
    CHECK(a.spans.of(99, SpanKind::Running).empty());
    CHECK_FALSE(a.thread(99)->monitored);
    CHECK_FALSE(a.cpu_wide);  // no idle task switched out: events per task
    // The same with one switch of CPU 1's idle task (events per CPU, -a):
    // the summary then names another cause for the switch-in unseen.
    r.switch_(130, 1, 0, 0, 0, 12);
    a = analyse_bytes(r.w.build());
    CHECK(a.thread(11)->hidden_switch_ins == 1);
    CHECK(a.cpu_wide);
}

// Some kernels hand a per-process recording neither a wake-up by another
// process's task nor the switch-in after it: the sleeper is next seen
// running. Its sleep ends there; its switch-out ends one itself.
TEST_CASE("wake-up and switch-in never recorded: the sleep ends at the thread's first own event") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 1, 99);  // 11 sleeps; next is another process's task
    r.waking(50, 1, 10, 11, 12);      // 11 is current here: woken and switched in unseen
    r.switch_(80, 0, 10, 11, 1, 99);  // and sleeps again
    r.switch_(120, 0, 10, 11, 1, 99); // its switch-out, asleep as far as the recording shows
    r.waking(130, 1, 10, 12, 11);
    r.switch_(140, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
    const ThreadStats* t = a.thread(11);
    REQUIRE(t);
    CHECK(t->hidden_wakeups == 1);
    CHECK(t->hidden_switch_ins == 0);
    const auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 3);
    CHECK(sleeps[0].start == 10);
    CHECK(sleeps[0].end == 50);
    CHECK(sleeps[1].start == 80);
    CHECK(sleeps[1].end == 120);  // ended by its switch-out: no running span of zero length
    CHECK(sleeps[2].end == 130);
    CHECK(t->running_ns == 80 - 50);
    CHECK(t->sleep_ns == 40 + 40 + 10);
    CHECK(a.spans.of(11, SpanKind::Running).size() == 2);  // 50-80, and from 140 to the end
}

// perf record --switch-events: a switch record is written in the task's own
// context, also when another process's task switched it in.
TEST_CASE("switch records: a per-process recording's switch-ins are exact") {
    SchedRecording r;
    r.switch_(10, 0, 10, 11, 0, 99);         // 11 preempted (R) by another process's task
    r.switch_record(12, 0, 10, 11, true, true);  // its switch-out record: sched_switch said it all
    r.switch_record(40, 1, 10, 11);          // switched in by another process's task
    r.waking(60, 1, 10, 11, 12);             // 11 is current: its own event, no hidden switch-in
    r.switch_(100, 1, 10, 11, 1, 99);        // sleeps
    r.switch_record(150, 0, 10, 11);         // its wake-up went unrecorded; its switch-in did not
    r.switch_(200, 0, 10, 11, 1, 12);        // sleeps again; 12 switched in by a traced switch
    r.switch_record(203, 0, 10, 12);         // 12's record of it: running already
    r.waking(250, 0, 10, 12, 11);            // 11 woken by 12, recorded
    r.switch_record(280, 1, 10, 11);         // switched in by another process's task
    r.switch_(300, 1, 10, 11, 1, 99);
    r.switch_record(320, 1, 10, 13);         // 13 is first seen switched in: running from there
    r.switch_(350, 1, 10, 13, 1, 99);
    Analysis a = analyse_bytes(r.w.build());
    const ThreadStats* t = a.thread(11);
    REQUIRE(t);
    CHECK(t->hidden_switch_ins == 0);
    CHECK(t->hidden_wakeups == 1);
    CHECK(t->runnable_ns == (40 - 10) + (280 - 250));
    CHECK(t->running_ns == (100 - 40) + (200 - 150) + (300 - 280));
    CHECK(t->sleep_ns == (150 - 100) + (250 - 200) + (350 - 300));
    const auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 3);
    CHECK(sleeps[0].end == 150);
    CHECK(sleeps[0].waker == -1);  // nobody seen waking it
    CHECK(sleeps[1].waker == 12);
    const ThreadStats* t12 = a.thread(12);
    REQUIRE(t12);
    CHECK(t12->running_ns == 350 - 200);  // from the traced switch-in, not its record
    const ThreadStats* t13 = a.thread(13);
    REQUIRE(t13);
    CHECK(t13->monitored);
    CHECK(t13->running_ns == 350 - 320);
    CHECK(t13->first_seen == 320);
}

TEST_CASE("LOST: states of threads last seen on that CPU become unknown until their next event") {
    // CPU numbers as machines have them, and beyond the timeline's array of
    // them (a damaged or foreign file): the same result.
    for (uint32_t c0 : {0u, 5000u}) {
        CAPTURE(c0);
        SchedRecording r;
        r.switch_(10, c0, 10, 11, 1, 0);      // 11 sleeps, on CPU c0
        r.switch_(20, c0 + 1, 10, 12, 1, 0);  // 12 sleeps, on another CPU
        r.w.lost(r.sw, 5, 30, c0);            // events lost on CPU c0 up to t=30
        r.waking(60, c0 + 1, 10, 13, 11);
        r.waking(70, c0 + 1, 10, 13, 12);
        Analysis a = analyse_bytes(r.w.build());
        CHECK(a.stats.lost_events == 5);
        CHECK(a.stats.lost_by_cpu.at(c0) == 5);
        auto unk = a.spans.of(11, SpanKind::Unknown);
        REQUIRE(unk.size() == 1);
        CHECK(unk[0].start == 10);  // from CPU c0's last event, before the loss was reported
        CHECK(unk[0].end == 60);
        CHECK(a.spans.of(11, SpanKind::Sleep).empty());
        auto s12 = a.spans.of(12, SpanKind::Sleep);  // other CPU: untouched
        REQUIRE(s12.size() == 1);
        CHECK(s12[0].end == 70);
    }
}

TEST_CASE("exit: the final switch-out (X/Z) ends the thread; a reused tid is a new thread") {
    SchedRecording r;
    r.w.task(PERF_RECORD_FORK, 0, 10, 10, 11, 10, 5);
    r.switch_(10, 0, 10, 11, 1, 0);
    r.waking(20, 1, 10, 12, 11);
    r.switch_(25, 0, 10, 12, 1, 11);
    r.w.task(PERF_RECORD_EXIT, 0, 10, 10, 11, 10, 30);
    r.switch_(31, 0, 10, 11, 0x10, 0);  // X
    r.w.task(PERF_RECORD_FORK, 0, 40, 40, 11, 40, 50);
    r.switch_(60, 0, 40, 11, 1, 0);
    Analysis a = analyse_bytes(r.w.build());
    int n = 0;
    for (auto& t : a.threads) n += t.tid == 11;
    CHECK(n == 2);
}

namespace {

// One recording through a GIL tracker and a timeline into `sink`, each sleep
// labelled by the classifier `label` makes from the tracker; the threads'
// figures after.
std::vector<ThreadStats> run_timeline(const std::string& path, SpanSink& sink,
                                      const std::function<SleepClassifier(GilTracker&)>& label) {
    Session s(path);
    GilTracker gil(nullptr);
    Timeline tl(s, sink);
    tl.set_classifier(label(gil));
    FanOutOf<GilTracker, Timeline> stages(gil, tl);
    s.run(stages);
    tl.finish(s.stats().last_time);
    std::vector<ThreadStats> out;
    for (const ThreadStats* t : tl.threads()) out.push_back(*t);
    return out;
}

// Two runs' figures, thread by thread; the GIL sleeps counted.
uint64_t check_same_figures(const std::vector<ThreadStats>& x, const std::vector<ThreadStats>& y) {
    REQUIRE(x.size() == y.size());
    uint64_t gil_sleeps = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const ThreadStats &a = x[i], &b = y[i];
        CAPTURE(a.tid);
        CHECK(a.tid == b.tid);
        CHECK(a.tgid == b.tgid);
        CHECK(a.running_ns == b.running_ns);
        CHECK(a.runnable_ns == b.runnable_ns);
        CHECK(a.sleep_ns == b.sleep_ns);
        CHECK(a.sleep_count == b.sleep_count);
        CHECK(a.disk_ns == b.disk_ns);
        CHECK(a.disk_count == b.disk_count);
        CHECK(a.other_ns == b.other_ns);
        CHECK(a.unknown_ns == b.unknown_ns);
        CHECK(a.gil_sleep_ns == b.gil_sleep_ns);
        CHECK(a.gil_sleep_count == b.gil_sleep_count);
        gil_sleeps += a.gil_sleep_count;
    }
    return gil_sleeps;
}

}  // namespace

TEST_CASE("a sink that wants no spans gets none, and every thread's figures are the same as with spans") {
    // A summary-only run: the timeline skips building spans nobody reads.
    struct NoSpans : SpanSink {
        int calls = 0;
        void span(const Span&) override { ++calls; }
        bool wants_spans() const override { return false; }
    };
    // gil_combined: scheduler events and GIL probes (GIL sleeps); plain, lost:
    // scheduler events only, lost has LOST records (unknown spans).
    for (std::string name : {"gil_combined", "plain", "lost"}) {
        CAPTURE(name);
        const std::string path = std::string(GILSCAN_TESTDATA) + "/" + name + ".data";
        std::vector<std::vector<ThreadStats>> runs;
        size_t spans = 0;
        // The uprobe classifier's labels: with spans named, without them
        // (label.text false) the same decisions with no strings.
        size_t gil_labels[2] = {0, 0}, named[2] = {0, 0}, text_mismatch = 0;
        for (bool want : {true, false}) {
            Collect collect;
            NoSpans none;
            runs.push_back(run_timeline(path, want ? static_cast<SpanSink&>(collect) : none, [&](GilTracker& gil) {
                return [&, want, by_probes = gil_probe_classifier(gil)](const Sample& smp, const EventInfo& ev,
                                                                        const PrevState& ps, SleepLabel& l) {
                    text_mismatch += l.text != want;
                    by_probes(smp, ev, ps, l);
                    gil_labels[want] += l.gil;
                    named[want] += !l.name.empty() || !l.evidence().empty();
                };
            }));
            if (want) spans = collect.spans.size();
            else CHECK(none.calls == 0);
        }
        CHECK(spans > 100);
        const uint64_t gil_sleeps = check_same_figures(runs[0], runs[1]);
        if (name == "gil_combined") CHECK(gil_sleeps > 0);
        CHECK(text_mismatch == 0);
        CHECK(gil_labels[0] == gil_labels[1]);
        CHECK(named[0] == 0);
        if (name == "gil_combined") CHECK(named[1] >= gil_labels[1]);
        if (name == "gil_combined") CHECK(gil_labels[1] > 0);
    }
}

TEST_CASE("a sink that wants labelled sleeps only gets exactly those of a full run, and sleeps with a stack") {
    // A .pftrace's writer: Perfetto draws the plain states itself, and a
    // sleep's stack (--sleep-stacks) is all it adds to a plain one. Here
    // every other sleep has a stack, plain or labelled.
    struct Labelled : Collect {
        bool wants_plain_spans() const override { return false; }
    };
    const std::string path = std::string(GILSCAN_TESTDATA) + "/gil_combined.data";
    std::vector<CollectedSpan> got[2];
    std::vector<std::vector<ThreadStats>> figures;
    for (bool all : {true, false}) {
        Collect collect;
        Labelled labelled;
        size_t sleeps = 0;
        figures.push_back(run_timeline(path, all ? static_cast<SpanSink&>(collect) : labelled, [&](GilTracker& gil) {
            return [&, by_probes = gil_probe_classifier(gil)](const Sample& smp, const EventInfo& ev,
                                                             const PrevState& ps, SleepLabel& l) {
                by_probes(smp, ev, ps, l);
                if (++sleeps % 2 == 0) l.stack_json = R"j(["frame (x.so)"])j";
            };
        }));
        got[all] = all ? collect.spans : labelled.spans;
    }
    std::vector<CollectedSpan> expected;
    size_t plain_with_stack = 0;
    for (const CollectedSpan& sp : got[1])
        if (sp.kind == SpanKind::Sleep && (sp.name != "S" || sp.has_stack)) {
            expected.push_back(sp);
            plain_with_stack += sp.name == "S";
        }
    CHECK(plain_with_stack >= 3);
    CHECK(expected.size() > 10);
    CHECK(expected.size() < got[1].size() / 2);
    CHECK(got[0].size() == expected.size());
    for (size_t i = 0; i < std::min(got[0].size(), expected.size()); ++i) {
        CAPTURE(i);
        CAPTURE(got[0][i].name);
        CAPTURE(expected[i].name);
        CAPTURE(got[0][i].start);
        CAPTURE(expected[i].start);
        REQUIRE(got[0][i] == expected[i]);
    }
    CHECK(check_same_figures(figures[0], figures[1]) > 0);
}

// SleepLabel's evidence is a literal view or a built string: each sleep's
// span shows its own, and clear() between sleeps leaves neither behind (a
// literal kept would hide the next sleep's built text; a built text kept
// would label a sleep nobody classified).
TEST_CASE("a sleep's evidence is its own label's: a literal, a built string, or none") {
    SchedRecording r;
    r.switch_(50, 0, 10, 12, 1, 11);
    for (uint64_t t = 100; t <= 300; t += 100) {
        r.switch_(t, 0, 10, 11, 1, 0);         // 11 sleeps
        r.waking(t + 20, 1, 10, 12, 11);       // woken by 12
        r.switch_(t + 40, 0, 10, 12, 1, 11);   // and on a CPU again
    }
    r.switch_(400, 0, 10, 11, 1, 0);
    TempFile f(r.w.build());
    Session s(f.path);
    struct Evidence : SpanSink {
        std::vector<std::pair<std::string, std::string>> sleeps;  // name, evidence
        void span(const Span& sp) override {
            if (sp.tid == 11 && sp.kind == SpanKind::Sleep) sleeps.emplace_back(sp.name, sp.evidence);
        }
    } sink;
    Timeline tl(s, sink);
    int calls = 0;
    tl.set_classifier([&](const Sample& smp, const EventInfo&, const PrevState&, SleepLabel& l) {
        if (smp.tid != 11) return;
        CHECK(l.evidence().empty());  // cleared since the last sleep
        switch (calls++) {
        case 0:
            l.name = "S(GIL)";
            l.evidence_literal = "a literal";
            break;
        case 1:
            l.name = "S(GIL handoff)";
            l.evidence_built = "built for sleep " + std::to_string(calls);
            break;
        default: break;  // unclassified
        }
    });
    s.run(tl);
    tl.finish(s.stats().last_time);
    CHECK(calls == 4);
    REQUIRE(sink.sleeps.size() == 4);
    CHECK(sink.sleeps[0] == std::pair<std::string, std::string>{"S(GIL)", "a literal"});
    CHECK(sink.sleeps[1] == std::pair<std::string, std::string>{"S(GIL handoff)", "built for sleep 2"});
    CHECK(sink.sleeps[2] == std::pair<std::string, std::string>{"S", ""});
    CHECK(sink.sleeps[3] == std::pair<std::string, std::string>{"S", ""});
}

TEST_CASE("live figures (gilscan top): each thread's open state counted up to the moment, nothing closed") {
    SchedRecording r;
    r.w.comm(r.sw, 10, 11, "worker", 50);
    r.switch_(100, 0, 10, 11, 1, 0);       // 11 sleeps
    r.waking(150, 1, 10, 12, 11);          // 12 wakes 11
    r.switch_(170, 1, 10, 12, 0x100, 11);  // 12 switches to 11: 11 runs
    TempFile f(r.w.build());
    Session s(f.path);
    Collect spans;
    Timeline tl(s, spans);
    s.run(tl);
    for (int twice = 0; twice < 2; ++twice) {
        const auto live = tl.live(250);
        auto it = std::find_if(live.begin(), live.end(), [](const Timeline::LiveThread& t) { return t.st.tid == 11; });
        REQUIRE(it != live.end());
        CHECK(it->alive);
        CHECK(it->st.sleep_ns == 50);
        CHECK(it->st.runnable_ns == 20);
        CHECK(it->st.running_ns == 80);  // 170..250, open
        CHECK(it->st.comm == "worker");
    }
    CHECK(tl.latest() == 170);
    tl.finish(250);
    for (const ThreadStats* t : tl.threads())
        if (t->tid == 11) CHECK(t->running_ns == 80);
}
