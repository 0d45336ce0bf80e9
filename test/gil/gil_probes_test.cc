#include <doctest/doctest.h>

#include "gilscan/gil/gil_probes.h"
#include "support/test_util.h"

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
    g.ev(g.take_ret, 170, 12);  // 12 takes while 11 holds: 11 let go unseen, at 170 at the latest
    g.ev(g.drop, 180, 14);      // drop without take
    g.ev(g.drop, 200, 11);      // 11 no longer holds: a drop without take
    g.ev(g.drop, 230, 12);
    Analysis a = analyse_bytes(g.r.w.build());
    CHECK(a.gil_anomalies.return_without_take == 2);
    CHECK(a.gil_anomalies.take_without_return == 1);
    CHECK(a.gil_anomalies.releases_not_seen == 1);
    CHECK(a.gil_anomalies.drop_without_take == 2);
    CHECK(a.gil_thread(11)->wait_ns == 60);
    CHECK(a.gil_thread(11)->hold_ns == 10);
    CHECK(a.gil_thread(12)->hold_ns == 60);
    CHECK(a.gil_thread(13)->hold_ns == 10);
    CHECK(a.gil_anomalies.implicit_drops == 0);
    // One holder at a time: held is the union of the holds, never more.
    REQUIRE(a.gils.size() == 1);
    CHECK(a.gils[0].held_ns == 10 + 10 + 60);
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
    CHECK(a.gil_anomalies.releases_not_seen == 0);
    CHECK(a.gil_anomalies.return_without_take == 1);  // 12's take entry is not in this recording
    CHECK(a.gil_thread(11)->hold_ns == 90);
    CHECK(a.gil_thread(11)->wait_ns == 10 + 100);
}

TEST_CASE("subinterpreters with their own GIL: each gil= address is a GIL of the process, held side by side") {
    // Main GIL A, a subinterpreter's B (3.12+, PEP 684). 11 and 13 run in the
    // main interpreter; 12 in the subinterpreter, then swaps to the main one
    // (it drops B, then takes A: its return and drop follow its last take).
    const uint64_t A = 0x7f0000001000, B = 0x7f0000802000;
    for (const bool swap : {false, true}) {
        CAPTURE(swap);
        for (const bool field : {true, false}) {
            CAPTURE(field);
            GilRecording g("python", "", field);
            g.r.w.swap = swap;
            g.ev(g.take, 100, 11, 10, A);
            g.ev(g.take, 105, 12, 10, B);
            g.ev(g.take_ret, 106, 12);  // B held from 106 ...
            g.ev(g.take_ret, 110, 11);  // ... and A from 110: two holders, two GILs
            g.ev(g.take, 120, 13, 10, A);
            g.ev(g.drop, 200, 11);
            g.ev(g.take_ret, 205, 13);
            g.ev(g.drop, 250, 12);      // B
            g.ev(g.take, 260, 12, 10, A);
            g.ev(g.drop, 300, 13);
            g.ev(g.take_ret, 301, 12);
            g.ev(g.drop, 400, 12);      // A
            Analysis a = analyse_bytes(g.r.w.build());
            REQUIRE(a.gil_thread(12));
            CHECK(a.gil_thread(12)->wait_ns == 1 + 41);
            CHECK(a.gil_thread(13)->wait_ns == 85);
            CHECK(a.gil_anomalies.implicit_drops == 0);
            if (!field) {
                // Without the addresses: one GIL of one holder, so 11's take
                // at 110 ends 12's hold there, and 12's drop of B at 250 is
                // a drop without a take.
                REQUIRE(a.gils.size() == 1);
                CHECK(a.gils[0].address == 0);
                CHECK(a.gil_anomalies.releases_not_seen == 1);
                CHECK(a.gil_anomalies.drop_without_take == 1);
                CHECK(a.gil_thread(12)->hold_ns == 4 + 99);
                CHECK(a.gils[0].held_ns == 4 + 90 + 95 + 99);
                continue;
            }
            CHECK(a.gil_thread(12)->hold_ns == 144 + 99);
            CHECK(a.gil_anomalies.releases_not_seen == 0);
            CHECK(a.gil_anomalies.total() == 0);
            REQUIRE(a.gils.size() == 2);
            const GilProcessStats &ga = a.gils[0], &gb = a.gils[1];
            CHECK(ga.pid == 10);
            CHECK(ga.index == 0);
            CHECK(ga.address == A);
            CHECK(ga.first == 100);
            CHECK(ga.last == 400);
            CHECK(ga.held_ns == 90 + 95 + 99);
            CHECK(ga.contended_ns == 80 + 40);
            CHECK(ga.waiting_ns == 10 + 85 + 41);
            CHECK(ga.max_waiters == 1);
            CHECK(gb.pid == 10);
            CHECK(gb.index == 1);
            CHECK(gb.address == B);
            CHECK(gb.first == 105);
            CHECK(gb.last == 250);
            CHECK(gb.held_ns == 144);
            CHECK(gb.contended_ns == 0);
            CHECK(gb.waiting_ns == 1);
        }
    }
}

TEST_CASE("GIL addresses: the first GIL is the first address's; a take without one acts on the thread's GIL") {
    const uint64_t A = 0x5000, B = 0x9000;
    GilRecording g("python", "", true);
    g.ev(g.take_ret, 50, 11);         // probes placed mid-run: a return with no take, no address yet
    g.ev(g.drop, 60, 11);
    g.ev(g.take, 100, 12, 10, A);     // the process's first GIL becomes A's
    g.ev(g.take_ret, 101, 12);
    g.ev(g.take, 110, 13, 10, B);
    g.ev(g.take_ret, 111, 13);
    g.ev(g.drop, 120, 13);
    g.ev(g.take, 130, 13, 10, 0);     // no address (the probe's read failed): B, 13's last GIL
    g.ev(g.take_ret, 131, 13);        // while 12 holds A: no overlap
    g.ev(g.take, 140, 21, 20, 0);     // another process: its own first GIL
    g.ev(g.take_ret, 141, 21, 20);
    Analysis a = analyse_bytes(g.r.w.build());
    CHECK(a.gil_anomalies.releases_not_seen == 0);
    CHECK(a.gil_anomalies.return_without_take == 1);
    REQUIRE(a.gils.size() == 3);
    CHECK(a.gils[0].address == A);
    CHECK(a.gils[0].first == 50);
    CHECK(a.gils[0].held_ns == 10 + 40);   // 11's 50..60, 12's 101..141 (the end)
    CHECK(a.gils[1].address == B);
    CHECK(a.gils[1].held_ns == 9 + 10);    // 111..120, 131..141
    CHECK(a.gils[2].pid == 20);
    CHECK(a.gils[2].index == 0);
    CHECK(a.gils[2].address == 0);
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

TEST_CASE("live figures (gilscan top): open waits and holds counted up to the moment, nothing closed") {
    GilRecording g;
    g.ev(g.take, 100, 11);
    g.ev(g.take_ret, 110, 11);  // 11 holds from 110
    g.ev(g.take, 120, 12);      // 12 waits from 120
    TempFile f(g.r.w.build());
    Session s(f.path);
    GilTracker gil(nullptr);
    s.run(gil);
    for (int twice = 0; twice < 2; ++twice) {  // asking closes nothing
        std::map<int32_t, GilThreadStats> th;
        for (const auto& t : gil.live_threads(150)) th[t.tid] = t;
        CHECK(th[11].wait_ns == 10);
        CHECK(th[11].hold_ns == 40);
        CHECK(th[12].wait_ns == 30);
        CHECK(th[12].hold_ns == 0);
        const auto gils = gil.live_gils(150);
        REQUIRE(gils.size() == 1);
        CHECK(gils[0].st.held_ns == 40);
        CHECK(gils[0].st.contended_ns == 30);
        CHECK(gils[0].st.waiting_ns == 40);  // 100..110 (11 waits, no holder) and 120..150
        CHECK(gils[0].holder == 11);
        CHECK(gils[0].waiters == 1);
    }
    CHECK(gil.live_threads(105).size() == 2);  // a moment before the latest event adds nothing open
    // What finish() closes at that moment is what live figures said.
    const auto live = gil.live_gils(150);
    gil.finish(150);
    const auto done = gil.processes();
    CHECK(done[0].held_ns == live[0].st.held_ns);
    CHECK(done[0].contended_ns == live[0].st.contended_ns);
    CHECK(done[0].waiting_ns == live[0].st.waiting_ns);
    CHECK(gil.thread(12)->wait_ns == 30);
}
