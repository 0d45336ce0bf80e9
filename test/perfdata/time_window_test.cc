#include "gilscan/perfdata/time_window.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace gilscan;

TEST_CASE("time window: parsed from START,STOP with either side empty") {
    TimeWindow w = TimeWindow::parse("1.5,3");
    REQUIRE(w.start_s);
    REQUIRE(w.stop_s);
    CHECK(*w.start_s == 1.5);
    CHECK(*w.stop_s == 3);
    CHECK(w.describe() == "1.5 s to 3 s");
    TimeWindow from = TimeWindow::parse("2,");
    CHECK(from.start_s == 2.0);
    CHECK_FALSE(from.stop_s);
    CHECK(from.describe() == "2 s to the end");
    TimeWindow to = TimeWindow::parse(",0.25");
    CHECK_FALSE(to.start_s);
    CHECK(to.describe() == "the start to 0.25 s");
    for (const char* bad : {"", ",", "1", "a,2", "2,1", "1,1", "-1,2", "1,2,3", "nan,", "inf,", "1e400,", " 1,2"})
        CHECK_THROWS_AS(TimeWindow::parse(bad), std::invalid_argument);
}

TEST_CASE("time window: anchored at the first sample, [lo, hi)") {
    TimeWindow w = TimeWindow::parse("1,2");
    // Before anchoring everything is in (the first sample anchors it).
    CHECK(w.contains(5));
    w.anchor(1'000'000'000);
    CHECK(w.lo == 2'000'000'000);
    CHECK(w.hi == 3'000'000'000);
    CHECK_FALSE(w.contains(1'999'999'999));
    CHECK(w.contains(2'000'000'000));
    CHECK_FALSE(w.contains(3'000'000'000));
    TimeWindow open = TimeWindow::parse("1,");
    open.anchor(10);
    CHECK(open.hi == ~uint64_t{0});
    TimeWindow far = TimeWindow::parse("1e12,");  // past the clock's top: saturates
    far.anchor(~uint64_t{0} - 5);
    CHECK(far.lo == ~uint64_t{0});
}

TEST_CASE("time window: intervals clipped, instants kept inside only") {
    TimeWindow w = TimeWindow::parse("1,2");
    w.anchor(0);
    uint64_t a = 500'000'000, b = 1'500'000'000;
    REQUIRE(w.clip(a, b));
    CHECK(a == 1'000'000'000);
    CHECK(b == 1'500'000'000);
    a = 1'800'000'000, b = 2'500'000'000;
    REQUIRE(w.clip(a, b));
    CHECK(b == 2'000'000'000);
    a = 0, b = 1'000'000'000;  // ends where the window starts: nothing inside
    CHECK_FALSE(w.clip(a, b));
    a = b = 1'000'000'000;  // an instant at the start is inside
    CHECK(w.clip(a, b));
    a = b = 2'000'000'000;  // at the end is not
    CHECK_FALSE(w.clip(a, b));
    CHECK(w.overlap(0, 3'000'000'000) == 1'000'000'000);
    CHECK(w.overlap(2'500'000'000, 3'000'000'000) == 0);
}
