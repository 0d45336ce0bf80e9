#include <doctest/doctest.h>

#include "gilscan/gil_probes.h"
#include "test_util.h"

using namespace gilscan;
using namespace gilscan::test;

TEST_CASE("wait = take_gil entry..return, held = return..next drop_gil entry, per thread") {
    for (const auto& gs : {std::pair<std::string, std::string>{"python", ""}, {"g39", "_1"}}) {
        const std::string& group = gs.first;
        const std::string& suffix = gs.second;
        CAPTURE(group);
        GilRecording g(group, suffix);
        g.ev(g.take, 100, 11);
        g.ev(g.take_ret, 110, 11);  // 11: waited 10
        g.ev(g.take, 120, 12);      // 12 starts waiting
        g.ev(g.drop, 200, 11);      // 11 held 90
        g.ev(g.drop_ret, 205, 11);
        g.ev(g.take_ret, 206, 12);  // 12 waited 86
        g.ev(g.drop, 300, 12);      // 12 held 94
        g.ev(g.drop_ret, 301, 12);
        Analysis a = analyse_bytes(g.r.w.build());
        REQUIRE(a.gil_thread(11));
        CHECK(a.gil_thread(11)->wait_ns == 10);
        CHECK(a.gil_thread(11)->hold_ns == 90);
        CHECK(a.gil_thread(12)->wait_ns == 86);
        CHECK(a.gil_thread(12)->hold_ns == 94);
        CHECK(a.gil_anomalies.total() == 0);
    }
}

TEST_CASE("GIL anomalies are counted, never fatal, and the figures stay usable") {
    GilRecording g;
    g.ev(g.take_ret, 50, 13);   // return without entry (probes placed mid-run)
    g.ev(g.drop, 60, 13);
    g.ev(g.take, 100, 11);
    g.ev(g.take, 150, 11);      // entered again: the return was lost
    g.ev(g.take_ret, 160, 11);
    g.ev(g.take_ret, 170, 12);  // 12 "takes" while 11 holds: overlapping holders
    g.ev(g.drop, 180, 14);      // drop without take
    g.ev(g.drop, 200, 11);
    Analysis a = analyse_bytes(g.r.w.build());
    CHECK(a.gil_anomalies.return_without_take == 2);
    CHECK(a.gil_anomalies.take_without_return == 1);
    CHECK(a.gil_anomalies.overlapping_holders == 1);
    CHECK(a.gil_anomalies.drop_without_take == 1);
    CHECK(a.gil_thread(11)->wait_ns == 60);
    CHECK(a.gil_thread(11)->hold_ns == 40);
    CHECK(a.gil_thread(13)->hold_ns == 10);
    CHECK(a.gil_anomalies.implicit_drops == 0);
}

TEST_CASE("take_gil entered while holding ends the hold (drop_gil inlined at the eval breaker)") {
    GilRecording g;
    g.ev(g.take, 100, 11);
    g.ev(g.take_ret, 110, 11);
    g.ev(g.take, 200, 11);      // eval breaker: inlined drop_gil, then take_gil
    g.ev(g.take_ret, 205, 12);  // 12 got it in between: no overlap
    g.ev(g.drop, 250, 12);
    g.ev(g.take_ret, 300, 11);
    Analysis a = analyse_bytes(g.r.w.build());
    CHECK(a.gil_anomalies.implicit_drops == 1);
    CHECK(a.gil_anomalies.overlapping_holders == 0);
    CHECK(a.gil_anomalies.return_without_take == 1);  // 12's take entry is not in this recording
    CHECK(a.gil_thread(11)->hold_ns == 90);
    CHECK(a.gil_thread(11)->wait_ns == 10 + 100);
}

TEST_CASE("a sleep inside take_gil is S(GIL), inside drop_gil S(GIL handoff)") {
    GilRecording g;
    g.ev(g.take, 100, 11);
    g.r.switch_(105, 0, 10, 11, 1, 0);  // sleeps waiting for the GIL
    g.r.waking(150, 1, 10, 12, 11);
    g.r.switch_(160, 1, 10, 12, 1, 11);
    g.ev(g.take_ret, 161, 11);
    g.ev(g.drop, 200, 11);
    g.r.switch_(201, 1, 10, 11, 1, 0);  // FORCE_SWITCHING: waits for the next holder
    g.r.waking(250, 0, 10, 12, 11);
    g.r.switch_(260, 1, 10, 12, 1, 11);
    g.ev(g.drop_ret, 261, 11);
    g.r.switch_(300, 1, 10, 11, 1, 0);  // an ordinary sleep
    Analysis a = analyse_bytes(g.r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 3);
    CHECK(sleeps[0].name == "S(GIL)");
    CHECK(sleeps[1].name == "S(GIL handoff)");
    CHECK(sleeps[2].name == "S");
    CHECK(a.thread(11)->gil_sleep_count == 1);
    CHECK(a.thread(11)->gil_sleep_ns == 45);
}

namespace {
// Sinks of two types for FanOutOf, logging what reaches them.
template <int N>
struct Logged final : EventSink {
    std::vector<std::string>* log = nullptr;
    void say(const char* what) { log->push_back(std::to_string(N) + ":" + what); }
    void on_sample(const Sample&, const EventInfo&) override { say("sample"); }
    void on_comm(const CommEvent&) override { say("comm"); }
    void on_fork(const TaskEvent&) override { say("fork"); }
    void on_exit(const TaskEvent&) override { say("exit"); }
    void on_mmap(const MmapEvent&) override { say("mmap"); }
    void on_lost(const LostEvent&) override { say("lost"); }
};
}  // namespace

TEST_CASE("FanOutOf: every event to each sink, in the order given") {
    std::vector<std::string> a;
    Logged<1> one;
    Logged<2> two;
    one.log = two.log = &a;
    FanOutOf<Logged<2>, Logged<1>> fixed(two, one);
    EventSink& k = fixed;  // as the session calls it
    k.on_sample(Sample{}, EventInfo{});
    k.on_comm(CommEvent{});
    k.on_fork(TaskEvent{});
    k.on_exit(TaskEvent{});
    k.on_mmap(MmapEvent{});
    k.on_lost(LostEvent{});
    CHECK(a == std::vector<std::string>{"2:sample", "1:sample", "2:comm", "1:comm", "2:fork", "1:fork",
                                        "2:exit", "1:exit", "2:mmap", "1:mmap", "2:lost", "1:lost"});
}

TEST_CASE("an event's kinds are the session's, worked out again when EVENT_UPDATE renames it mid-stream") {
    // The GIL tracker goes by the event's name (EventInfo::gil_kind), the
    // timeline by its format (EventInfo::kind): a rename takes effect for
    // what is delivered after it, in file mode and in pipe mode alike.
    for (const bool pipe : {false, true}) {
        CAPTURE(pipe);
        SchedRecording r;
        r.waking(100, 0, 10, 11, 12);
        r.waking(110, 0, 10, 11, 12);
        // Two rounds' ends: the first two samples are delivered before the
        // update is read (records still queued when a user record arrives
        // are delivered after it, as perf applies such records at once).
        r.w.finished_round();
        r.w.finished_round();
        Out u;  // PERF_RECORD_EVENT_UPDATE {u64 type = NAME (2), u64 id, char name[]}
        u.put<uint64_t>(2);
        u.put<uint64_t>(r.w.attrs[r.wk].ids[0]);
        u.str("python:take_gil");
        u.pad(8);
        r.w.record(PERF_RECORD_EVENT_UPDATE, 0, u.b);
        r.waking(120, 0, 10, 11, 12);
        r.waking(130, 0, 10, 11, 12);
        r.waking(140, 0, 10, 11, 12);
        TempFile f(pipe ? r.w.build_pipe() : r.w.build());
        Session s(f.path);
        GilTracker gil(nullptr);
        s.run(gil);
        CHECK(gil.probe_events() == 3);
        const EventInfo& ev = s.events()[static_cast<size_t>(r.wk)];
        CHECK(ev.name == "python:take_gil");
        CHECK(ev.gil_kind == TpKind::GilTake);
        CHECK(ev.kind == TpKind::SchedWaking);  // its format is still sched_waking's
        CHECK(s.events()[static_cast<size_t>(r.sw)].kind == TpKind::SchedSwitch);
        CHECK(s.events()[static_cast<size_t>(r.sw)].gil_kind == TpKind::Other);
    }
}

TEST_CASE("the GIL holder track's id: above every real tid, and defined for any pid a file holds") {
    CHECK(gil_track_tid(4194304) == 4194304 + 0x40000000);  // Linux's largest pid_max
    CHECK(gil_track_tid(0) == 0x40000000);
    // A damaged file's pid: wraps instead of overflowing (UBSan checks this in the sanitizer build).
    CHECK(gil_track_tid(0x6c5f7275) == static_cast<int32_t>(0xac5f7275u));
    CHECK(gil_track_tid(-1) == 0x3fffffff);
}
