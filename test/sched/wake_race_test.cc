// The wake-up race: another CPU's try_to_wake_up traces sched_waking
// before, or at the same nanosecond as, the sleeper's own sched_switch.
#include <doctest/doctest.h>

#include "gilscan/sched/timeline.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

// Where the racing waking is: a time, and whether the recording lists it
// after the switch-out (possible only at the same nanosecond: the tie's
// order, either of which is the same race).
struct Race {
    uint64_t waking;
    bool after_switch_out;
};
constexpr Race kRaces[] = {{5000, false}, {5003, false}, {5003, true}};

// 11 runs from 1000 and sleeps at 5003 on CPU 0 while 12's try_to_wake_up
// on CPU 1 traces its waking; then `enqueue` (sched_wakeup, 0: none
// recorded) and 11's switch-in at 5100.
Analysis raced(const Race& race, uint64_t enqueue) {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    if (!race.after_switch_out) r.waking(race.waking, 1, 10, 12, 11);
    r.switch_(5003, 0, 10, 11, 1, 0);
    if (race.after_switch_out) r.waking(race.waking, 1, 10, 12, 11);
    if (enqueue) r.waking(enqueue, 1, 10, 12, 11);
    r.switch_(5100, 1, 10, 12, 1, 11);
    return analyse_bytes(r.w.build());
}

}  // namespace

TEST_CASE("a waking traced before or at the switch-out it races: the sleep lasts to the enqueue") {
    // At the same nanosecond, ending the sleep at the waking made one of no
    // length, counted in the summary and drawn in no trace.
    for (const Race& race : kRaces) {
        CAPTURE(race.waking);
        CAPTURE(race.after_switch_out);
        Analysis a = raced(race, 5020);
        auto sleeps = a.spans.of(11, SpanKind::Sleep);
        REQUIRE(sleeps.size() == 1);
        CHECK(sleeps[0].start == 5003);
        CHECK(sleeps[0].end == 5020);
        CHECK(sleeps[0].woken_before);
        CHECK(sleeps[0].waker == 12);
        auto rn = a.spans.of(11, SpanKind::Runnable);
        REQUIRE(rn.size() == 1);
        CHECK(rn[0].start == 5020);
        CHECK(rn[0].end == 5100);
        CHECK(rn[0].waker == 12);
        CHECK_FALSE(rn[0].woken_before);
        CHECK(a.thread(11)->sleep_count == 1);
        CHECK(a.thread(11)->sleep_ns == 17);
    }
}

TEST_CASE("a raced sleep with no enqueue recorded ends at the switch-in; a waking after the switch-out ends it") {
    for (const Race& race : kRaces) {
        CAPTURE(race.waking);
        CAPTURE(race.after_switch_out);
        Analysis a = raced(race, 0);
        auto sleeps = a.spans.of(11, SpanKind::Sleep);
        REQUIRE(sleeps.size() == 1);
        CHECK(sleeps[0].end == 5100);
        CHECK(sleeps[0].woken_before);
        CHECK(sleeps[0].waker == 12);
        CHECK(a.spans.of(11, SpanKind::Runnable).empty());
        CHECK(a.thread(11)->sleep_count == 1);
    }
    Analysis a = raced({5004, true}, 0);  // not a race: the sleep ends at the waking
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].end == 5004);
    CHECK_FALSE(sleeps[0].woken_before);
    CHECK(a.spans.of(11, SpanKind::Runnable).size() == 1);
}

TEST_CASE("a waking in the thread's own context does not end its next sleep") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    r.waking(5000, 0, 10, 11, 11);          // an interrupt on 11's CPU wakes 11 while it runs
    r.switch_(5003, 0, 10, 11, 1, 0);       // then 11 sleeps again
    r.waking(9000, 1, 10, 12, 11);
    r.switch_(9100, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].start == 5003);
    CHECK(sleeps[0].end == 9000);
    CHECK_FALSE(sleeps[0].woken_before);
    CHECK(sleeps[0].waker == 12);
}

TEST_CASE("an old wake-up of a running thread does not end a later sleep") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    r.waking(2000, 1, 10, 12, 11);               // spurious: 11 was running
    r.switch_(2000 + 10'000'000, 0, 10, 11, 1, 0);  // sleeps 10 ms later
    r.waking(2000 + 30'000'000, 1, 10, 12, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].end - sleeps[0].start == 20'000'000);
    CHECK_FALSE(sleeps[0].woken_before);
}
