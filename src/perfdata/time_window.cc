#include "gilscan/perfdata/time_window.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace gilscan {

namespace {

[[noreturn]] void bad(std::string_view whole) {
    throw std::invalid_argument("--time takes START,STOP in seconds from the first sample (either may be "
                                "empty: 2.5, or ,10), not " + std::string(whole));
}

std::optional<double> seconds(std::string_view v, std::string_view whole) {
    if (v.empty()) return std::nullopt;
    double d = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(d) || d < 0) bad(whole);
    return d;
}

// Seconds to nanoseconds above `first`, saturating at the top of the clock.
uint64_t at(uint64_t first, double s) {
    const double ns = std::round(s * 1e9);
    if (ns >= static_cast<double>(~uint64_t{0} - first)) return ~uint64_t{0};
    return first + static_cast<uint64_t>(ns);
}

std::string secs(double s) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, s);
    return std::string(buf, r.ptr) + " s";
}

}  // namespace

TimeWindow TimeWindow::parse(std::string_view text) {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos || text.find(',', comma + 1) != std::string_view::npos)
        bad(text);
    TimeWindow w;
    w.start_s = seconds(text.substr(0, comma), text);
    w.stop_s = seconds(text.substr(comma + 1), text);
    if (!w.active())
        throw std::invalid_argument("--time: give START, STOP or both (START,STOP in seconds), not " +
                                    std::string(text));
    if (w.start_s && w.stop_s && *w.start_s >= *w.stop_s)
        throw std::invalid_argument("--time: START must be before STOP, not " + std::string(text));
    return w;
}

void TimeWindow::anchor(uint64_t first) {
    anchored = true;
    if (start_s) lo = at(first, *start_s);
    if (stop_s) hi = at(first, *stop_s);
}

std::string TimeWindow::describe() const {
    return (start_s ? secs(*start_s) : std::string("the start")) + " to " +
           (stop_s ? secs(*stop_s) : std::string("the end"));
}

}  // namespace gilscan
