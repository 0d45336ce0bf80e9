// --html FILE: one self-contained HTML report (docs/usage.md, "The HTML
// report"): the recording's facts, the per-thread table, GIL load over time,
// a lane per thread in the trace's colours, and flame graphs of the GIL
// waits and of GIL blame. Scripts and styles are inline (src/output/
// report.{html,css,js}, embedded at build time); no network.
//
//   ReportCollector rc;                  // a TraceSink: beside the trace writer (TeeTraceSink)
//   ... the stages run ...
//   ReportInputs in{summary, rc, wait_lines, blame_lines, python};
//   write_html_report("report.html", in);
//
// Bounded whatever the input: a lane's states are merged into stretches
// of at least a resolution that doubles whenever the lanes together pass
// kMaxSegments, the GIL load is kept in bins that double likewise, and the
// page carries at most kMaxLanes lanes and flame-graph nodes above 1/5000
// of the total.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gilscan/gil/trace_sink.h"
#include "gilscan/output/summary.h"

namespace gilscan {

// Time-weighted bins from some origin, each `width` ns; past kMaxBins the
// width doubles and pairs merge.
class TimeBins {
public:
    static constexpr size_t kMaxBins = 1 << 16;
    void add(uint64_t start, uint64_t end, double weight);  // weight x ns over [start, end)
    uint64_t origin() const { return origin_; }
    uint64_t width() const { return width_; }
    const std::vector<double>& bins() const { return bins_; }  // weight x ns per bin
    bool empty() const { return bins_.empty(); }

private:
    void grow();
    uint64_t origin_ = 0, width_ = 1000;  // 1 µs to start with
    std::vector<double> bins_;
};

class ReportCollector final : public TraceSink {
public:
    static constexpr size_t kMaxSegments = 400'000;
    // The lane states, in the page's order (and its colours' order).
    enum Kind : uint8_t { kRunning, kRunnable, kSleep, kGilWait, kGilHandoff, kDisk, kOther, kKinds };
    struct Segment {
        uint64_t start, end;
        Kind kind;
    };
    struct Lane {
        std::vector<Segment> segs;
        std::array<uint64_t, kKinds> open_ns{};  // the last segment's make-up, while it can still merge
    };

    void span(const Span& s) override;
    void name_thread(int32_t, int32_t, std::string_view) override {}
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns,
                  bool cut) override;
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                    std::string_view culprit) override;
    void gil_waiters(int32_t, uint32_t, uint64_t, uint32_t) override {}

    const std::map<std::pair<int32_t, int32_t>, Lane>& lanes() const { return lanes_; }
    uint64_t resolution() const { return resolution_; }
    // Per process: GIL held (uprobes) and threads waiting (uprobes' waits, or S(GIL) sleeps without them).
    const std::map<int32_t, TimeBins>& held() const { return held_; }
    const std::map<int32_t, TimeBins>& waiting() const { return waiting_; }

private:
    void add(Lane& l, uint64_t start, uint64_t end, Kind k);
    void coarsen();
    std::map<std::pair<int32_t, int32_t>, Lane> lanes_;
    size_t segments_ = 0;
    uint64_t resolution_ = 0;  // stretches shorter than this are merged (0: none yet)
    std::map<int32_t, TimeBins> held_, waiting_;
    bool probe_waits_ = false;  // waits come from uprobes: S(GIL) sleeps are not counted again
};

// Everything the page shows besides the collector's lanes and load.
struct ReportInputs {
    const FileSummary& summary;
    const ReportCollector& collector;
    std::vector<std::string> wait_folded;   // folded_lines of the GIL waits (µs)
    std::vector<std::string> blame_folded;  // folded_lines of the contended holds (µs)
    std::string python;                     // the Python(s) recorded, e.g. "3.12 (libpython3.12.so.1.0)"
    uint32_t cpus = 0;
};

class ProcessMaps;
// The Pythons the recorded processes mapped, for the facts: "3.12 (libpython3.12.so.1.0)".
std::string pythons_mapped(const ProcessMaps& maps, const FileSummary& summary);

// The page, written whole (output_file.h: a temporary file renamed into place).
void write_html_report(const std::string& path, const ReportInputs& in);
// The page's text (tests; write_html_report writes this).
std::string html_report(const ReportInputs& in);

// A trace sink feeding two: the trace and the report.
class TeeTraceSink final : public TraceSink {
public:
    TeeTraceSink(TraceSink& a, TraceSink& b) : a_(a), b_(b) {}
    void span(const Span& s) override {
        a_.span(s);
        b_.span(s);
    }
    bool wants_spans() const override { return true; }
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override {
        a_.name_thread(pid, tid, name);
        b_.name_thread(pid, tid, name);
    }
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t s, uint64_t e, bool cut) override {
        a_.gil_span(pid, tid, what, gil, s, e, cut);
        b_.gil_span(pid, tid, what, gil, s, e, cut);
    }
    void gil_holder(int32_t pid, int32_t track, int32_t holder, uint64_t s, uint64_t e,
                    std::string_view culprit) override {
        a_.gil_holder(pid, track, holder, s, e, culprit);
        b_.gil_holder(pid, track, holder, s, e, culprit);
    }
    void gil_waiters(int32_t pid, uint32_t gil, uint64_t t, uint32_t n) override {
        a_.gil_waiters(pid, gil, t, n);
        b_.gil_waiters(pid, gil, t, n);
    }

private:
    TraceSink &a_, &b_;
};

}  // namespace gilscan
