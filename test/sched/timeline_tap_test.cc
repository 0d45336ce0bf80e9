// What the timeline tells its scheduler tap (the .pftrace's scheduler data):
// switches and wake-ups as decoded, and switch-in records with the thread's
// last known priority and name.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include "gilscan/perfdata/time_window.h"
#include "gilscan/sched/timeline.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

struct Tap : SchedTap {
    std::vector<std::tuple<uint64_t, int32_t, int32_t>> switches;  // t, prev, next
    std::vector<std::tuple<uint64_t, int32_t>> wakes;              // t, pid
    std::vector<std::tuple<uint32_t, uint64_t, int32_t, int32_t, std::string>> ins;  // cpu, t, tid, prio, comm
    void sched_switch(uint32_t, uint64_t t, int32_t, const SchedSwitch& sw) override {
        switches.emplace_back(t, sw.prev_pid, sw.next_pid);
    }
    void sched_wake(uint32_t, uint64_t t, int32_t, TpKind, const SchedWake& w) override { wakes.emplace_back(t, w.pid); }
    void switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) override {
        ins.emplace_back(cpu, t, tid, prio, std::string(comm));
    }
};

// A sched_switch whose priorities are set (SchedRecording::switch_ leaves them 0).
void switch_prio(SchedRecording& r, uint64_t t, int32_t prev, int32_t prev_prio, int32_t next, int32_t next_prio) {
    TestSample s;
    s.pid = 10;
    s.tid = prev;
    s.time = t;
    s.cpu = 0;
    s.raw = r.w.raw(r.sw, {{"prev_pid", prev},
                           {"prev_prio", prev_prio},
                           {"prev_state", 1},
                           {"next_pid", next},
                           {"next_prio", next_prio},
                           {"prev_comm", 0, "worker", true},
                           {"next_comm", 0, "other", true}});
    r.w.sample(r.sw, s);
}

Tap run(const std::vector<uint8_t>& bytes, const TimeWindow* window = nullptr) {
    TempFile f(bytes);
    Session s(f.path);
    Collect spans;
    Timeline tl(s, spans);
    Tap tap;
    tl.set_sched_tap(&tap);
    tl.set_window(window);
    s.run(tl);
    return tap;
}

SchedRecording recording() {
    SchedRecording r;
    r.w.comm(r.sw, 10, 11, "worker", 5);
    r.switch_record(10, 0, 10, 11);            // first seen through its record: prio not yet known
    switch_prio(r, 20, 11, 115, 99, 120);      // switches out at prio 115
    r.switch_record(21, 0, 10, 11, true);      // its switch-out record: not for the tap
    r.switch_record(40, 1, 10, 11);            // switched in by another process's task
    r.waking(50, 1, 10, 11, 12);               // names 12, prio 0 (the test's waking writes none)
    r.switch_record(60, 1, 10, 12);
    return r;
}

}  // namespace

TEST_CASE("scheduler tap: switch-in records with the thread's last priority and name, switch-outs not") {
    SchedRecording r = recording();
    const Tap tap = run(r.w.build());
    CHECK(tap.switches == std::vector<std::tuple<uint64_t, int32_t, int32_t>>{{20, 11, 99}});
    CHECK(tap.wakes == std::vector<std::tuple<uint64_t, int32_t>>{{50, 12}});
    using In = std::tuple<uint32_t, uint64_t, int32_t, int32_t, std::string>;
    CHECK(tap.ins == std::vector<In>{{0, 10, 11, 120, "worker"}, {1, 40, 11, 115, "worker"}, {1, 60, 12, 0, "worker"}});
}

TEST_CASE("scheduler tap: only what lies in the window") {
    SchedRecording r = recording();
    TimeWindow w;
    w.lo = 30;
    w.hi = 55;
    w.anchored = true;
    w.start_s = 0.0;
    const Tap tap = run(r.w.build(), &w);
    CHECK(tap.switches.empty());
    CHECK(tap.wakes.size() == 1);
    REQUIRE(tap.ins.size() == 1);
    CHECK(std::get<1>(tap.ins[0]) == 40);
}
