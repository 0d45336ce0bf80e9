// The wake-up race: another CPU's try_to_wake_up traces sched_waking
// before, or at the same nanosecond as, the sleeper's own sched_switch.
#include <doctest/doctest.h>

#include "gilscan/sched/timeline.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

TEST_CASE("a waking traced just before the switch-out it races: the sleep lasts to the enqueue") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);      // 11 runs from 1000
    r.waking(5000, 1, 10, 12, 11);          // ttwu on CPU 1 ...
    r.switch_(5003, 0, 10, 11, 1, 0);       // ... races 11's __schedule on CPU 0
    r.waking(5020, 1, 10, 12, 11);          // the enqueue once the switch is done (sched_wakeup)
    r.switch_(5100, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
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
}

TEST_CASE("a raced sleep with no enqueue recorded ends at the switch-in, its waker the early one") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    r.waking(5000, 1, 10, 12, 11);
    r.switch_(5003, 0, 10, 11, 1, 0);
    r.switch_(5100, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].end == 5100);
    CHECK(sleeps[0].woken_before);
    CHECK(sleeps[0].waker == 12);
    CHECK(a.spans.of(11, SpanKind::Runnable).empty());
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

TEST_CASE("a waking stamped with the switch-out's nanosecond, after it: the sleep lasts to the enqueue") {
    // Equal times on two CPUs: the order is the tie's, and either order is
    // the same race. Ending the sleep at the waking made one of no length,
    // counted in the summary and drawn in no trace.
    for (bool waking_first : {false, true}) {
        CAPTURE(waking_first);
        SchedRecording r;
        r.switch_(1000, 0, 10, 12, 1, 11);
        if (waking_first) r.waking(5003, 1, 10, 12, 11);
        r.switch_(5003, 0, 10, 11, 1, 0);
        if (!waking_first) r.waking(5003, 1, 10, 12, 11);
        r.waking(5020, 1, 10, 12, 11);  // the enqueue (sched_wakeup)
        r.switch_(5100, 1, 10, 12, 1, 11);
        Analysis a = analyse_bytes(r.w.build());
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
        CHECK(a.thread(11)->sleep_count == 1);
        CHECK(a.thread(11)->sleep_ns == 17);
    }
}

TEST_CASE("a waking at the switch-out's nanosecond with no enqueue recorded: the sleep ends at the switch-in") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    r.switch_(5003, 0, 10, 11, 1, 0);
    r.waking(5003, 1, 10, 12, 11);
    r.switch_(5100, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].start == 5003);
    CHECK(sleeps[0].end == 5100);
    CHECK(sleeps[0].woken_before);
    CHECK(sleeps[0].waker == 12);
    CHECK(a.thread(11)->sleep_count == 1);
}

TEST_CASE("a waking after the switch-out's nanosecond ends the sleep as any other") {
    SchedRecording r;
    r.switch_(1000, 0, 10, 12, 1, 11);
    r.switch_(5003, 0, 10, 11, 1, 0);
    r.waking(5004, 1, 10, 12, 11);
    r.switch_(5100, 1, 10, 12, 1, 11);
    Analysis a = analyse_bytes(r.w.build());
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() == 1);
    CHECK(sleeps[0].end == 5004);
    CHECK_FALSE(sleeps[0].woken_before);
    CHECK(a.spans.of(11, SpanKind::Runnable).size() == 1);
}
