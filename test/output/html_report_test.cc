// The HTML report's collector and page: bounded lanes and bins, the page's data.
#include "gilscan/output/html_report.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <numeric>

using namespace gilscan;

TEST_CASE("html report: time bins keep every weight as they widen") {
    TimeBins b;
    b.add(5'000, 7'500, 1.0);  // 2.5 µs at width 1 µs
    CHECK(b.width() == 1000);
    CHECK(std::accumulate(b.bins().begin(), b.bins().end(), 0.0) == doctest::Approx(2500));
    b.add(1'000'000'000, 1'000'001'000, 2.0);  // a second on: the bins double until it fits
    CHECK(b.bins().size() <= TimeBins::kMaxBins);
    CHECK(b.width() > 1000);
    CHECK(b.origin() % b.width() == 0);
    CHECK(std::accumulate(b.bins().begin(), b.bins().end(), 0.0) == doctest::Approx(2500 + 2000));
}

TEST_CASE("html report: time bins take a span that begins before their first bin") {
    TimeBins b;
    b.add(50'000'000, 51'000'000, 1.0);  // another thread's later wait came first
    b.add(10'000, 20'000, 1.0);
    CHECK(b.origin() <= 10'000);
    CHECK(b.bins().size() <= TimeBins::kMaxBins);
    CHECK(std::accumulate(b.bins().begin(), b.bins().end(), 0.0) == doctest::Approx(1'000'000 + 10'000));
    CHECK(b.bins()[(10'000 - b.origin()) / b.width()] > 0);
}

TEST_CASE("html report: lanes merge short states once past the bound, and stay in order") {
    ReportCollector rc;
    Span s;
    s.tgid = 1;
    s.tid = 2;
    const size_t n = ReportCollector::kMaxSegments * 2;
    for (size_t i = 0; i < n; ++i) {
        s.start = i * 1000;
        s.end = s.start + 1000;
        s.kind = i % 3 == 0 ? SpanKind::Sleep : SpanKind::Running;
        s.name = i % 3 == 0 ? "S(GIL)" : "R";
        rc.span(s);
    }
    const auto& segs = rc.lanes().at({1, 2}).segs;
    CHECK(segs.size() <= ReportCollector::kMaxSegments);
    CHECK(rc.resolution() > 0);
    uint64_t covered = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        CHECK(segs[i].start < segs[i].end);
        if (i) CHECK(segs[i].start >= segs[i - 1].end);
        covered += segs[i].end - segs[i].start;
    }
    CHECK(covered == n * 1000);  // no gap in, none out
    CHECK(segs.front().kind == ReportCollector::kRunning);  // two thirds running
    // The S(GIL) sleeps count as waiting in the process's load.
    double waited = 0;
    for (double v : rc.waiting().at(1).bins()) waited += v;
    CHECK(waited == doctest::Approx(static_cast<double>((n + 2) / 3 * 1000)));
}

TEST_CASE("html report: the page carries its data, escaped, and no placeholder") {
    FileSummary fs;
    fs.file = "a</script><b>.data";
    fs.first_time = 1'000'000;
    fs.last_time = 3'000'000;
    ThreadSummary t;
    t.st.tid = t.st.tgid = 7;
    t.st.comm = "python3";
    t.span_ns = 2'000'000;
    fs.threads.push_back(t);
    ReportCollector rc;
    Span s;
    s.tgid = s.tid = 7;
    s.start = 1'500'000;
    s.end = 2'000'000;
    s.kind = SpanKind::Running;
    rc.span(s);
    ReportInputs in{fs, rc, {"python3 (7);take_gil 12", "python3 (7);main;take_gil 3"}, {}, "3.12 (python3.12)", 2};
    const std::string page = html_report(in);
    CHECK(page.find('@') == std::string::npos);
    CHECK(page.find("a</script><b>") == std::string::npos);  // escaped in the title and the data
    const std::string tag = "<script type=\"application/json\" id=\"data\">";
    const size_t at = page.find(tag);
    REQUIRE(at != std::string::npos);
    const size_t from = at + tag.size(), to = page.find("</script>", from);
    std::string data = page.substr(from, to - from);
    for (size_t i = data.find("<\\/"); i != std::string::npos; i = data.find("<\\/", i)) data.erase(i + 1, 1);
    const auto d = nlohmann::json::parse(data);
    CHECK(d["rows"].size() == 1);
    CHECK(d["lanes"][0]["segs"] == nlohmann::json::array({500, 500, 0}));
    CHECK(d["flame_wait"]["v"] == 15);
    CHECK(d["flame_wait"]["c"][0]["n"] == "python3 (7)");
    CHECK(d["flame_blame"].is_null());
    CHECK(d["span_us"] == 2000);
}
