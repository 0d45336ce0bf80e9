// --time START,STOP: the part of a recording an analysis covers, in seconds
// from the recording's first sample. Either bound may be absent.
//
// Every stage still reads the whole recording (a state at START began
// before it), but counts only what lies inside [lo, hi): each interval a
// figure or a span is made of is clipped to it. The session anchors the
// window at the first sample it delivers (Session::set_window); until then
// it lets everything through, and nothing is timed before a sample.
//
//   TimeWindow w = TimeWindow::parse("1.5,3");   // seconds 1.5 to 3
//   w.anchor(first_sample_ns);
//   uint64_t a = since, b = now;
//   if (w.clip(a, b)) count(b - a);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gilscan {

struct TimeWindow {
    std::optional<double> start_s, stop_s;  // as asked, seconds from the first sample
    uint64_t lo = 0, hi = ~uint64_t{0};     // absolute, once anchored: [lo, hi)
    bool anchored = false;

    // "START,STOP", "START," or ",STOP": non-negative seconds, START < STOP.
    // Throws std::invalid_argument saying what is wrong otherwise.
    static TimeWindow parse(std::string_view text);

    bool active() const { return start_s || stop_s; }
    // The recording's first sample is at `first`: the bounds from it (saturating).
    void anchor(uint64_t first);

    bool contains(uint64_t t) const { return t >= lo && t < hi; }
    // [a, b] cut to the window. False when nothing of it is inside: an
    // interval of some length that does not overlap, or an instant (a == b)
    // outside [lo, hi).
    bool clip(uint64_t& a, uint64_t& b) const {
        if (a == b) return contains(a);
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        return a < b;
    }
    // How much of [a, b] is inside.
    uint64_t overlap(uint64_t a, uint64_t b) const { return clip(a, b) ? b - a : 0; }

    // "1.5 s to 3 s" (either side "the start" / "the end"), for the table.
    std::string describe() const;
};

}  // namespace gilscan
