// Stage: `gilscan top`'s view — what a live analysis found, one interval at
// a time, as a screen, a plain text block (--batch) or a JSON line (--json).
//
//   TopView view(10);
//   view.update(figures_at_t1);        // cumulative figures (pipeline.h: LiveAnalysis)
//   view.update(figures_at_t2);        // the view now shows [t1, t2)
//   std::fputs(view.text(80, 24, "pid 1234").c_str(), stdout);
//
// The stages' figures are totals from the recording's start (open states
// counted up to the moment asked for); an interval's are the difference of
// two moments. A figure that went down between them (an open state counted
// up to the first moment, which events that arrived later ended earlier)
// is shown as 0 for that interval; the totals stay exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gilscan/gil/blame.h"
#include "gilscan/output/summary.h"

namespace gilscan {

struct LiveThreadFigures {
    int32_t pid = -1, tid = -1;
    std::string comm;
    uint64_t first_seen = 0;  // with tid, who the thread is (a tid can be reused)
    uint64_t running_ns = 0, gil_hold_ns = 0, gil_wait_ns = 0;
    bool alive = true;
    LiveThreadFigures() = default;
    // The thread's own figures from the timeline's; its GIL ones are set after.
    LiveThreadFigures(const ThreadStats& st, bool alive_now)
        : pid(st.tgid), tid(st.tid), comm(st.comm), first_seen(st.first_seen), running_ns(st.running_ns),
          alive(alive_now) {}
};

struct LiveGilFigures {
    int32_t pid = -1;
    uint32_t index = 0;  // the process's GIL (several with subinterpreters' own)
    uint64_t held_ns = 0, contended_ns = 0, waiting_ns = 0;
    int32_t holder = -1;  // at the moment (-1: none)
    uint32_t waiters = 0;  // at the moment
};

// Every figure from the recording's start to `time` (the recording's clock).
struct LiveFigures {
    uint64_t time = 0;
    uint64_t start = 0;  // the recording's first event (0: none yet)
    bool gil_probes = false;  // GIL waits and holds measured by the uprobes (else waits from stacks, no holds)
    std::vector<LiveThreadFigures> threads;
    std::vector<LiveGilFigures> gils;
    bool blame = false;  // blame was asked for and can name holders
    std::vector<BlameRow> blame_rows;
    uint64_t lost_events = 0;
};

// A finished analysis's figures as a last moment (its last event's time):
// the interval from the last live moment to the end.
LiveFigures live_figures_of(const FileSummary& fs);

class TopView {
public:
    explicit TopView(size_t blame_top) : blame_top_(blame_top) {}

    // The figures at a later moment: the view's interval ends there.
    void update(LiveFigures now);
    bool ready() const { return have_now_; }
    uint64_t time() const { return now_.time; }  // the moment shown last
    uint64_t interval_ns() const { return now_.time > before_.time ? now_.time - before_.time : 0; }

    // A screen of width x height (height 0: every row), headed by `what`
    // (the process or command watched).
    std::string text(size_t width, size_t height, const std::string& what) const;
    // The interval as one JSON object (--json): times in CLOCK_MONOTONIC ns,
    // shares in percent of the interval, times in µs.
    nlohmann::json json() const;

    struct ThreadRow {
        const LiveThreadFigures* t = nullptr;
        uint64_t running_ns = 0, hold_ns = 0, wait_ns = 0;
    };
    struct GilRow {
        const LiveGilFigures* g = nullptr;
        uint64_t held_ns = 0, contended_ns = 0, waiting_ns = 0;
        uint64_t thread_wait_ns = 0;  // its threads' waits summed: mean waiters x interval
    };
    struct BlameLine {
        const BlameRow* row = nullptr;
        uint64_t contended_ns = 0, on_cpu_ns = 0, off_cpu_ns = 0;  // in the interval
    };
    // The interval's rows: threads that lived in it, GIL waits first;
    // GILs by pid; blame by contended time in it, at most blame_top.
    std::vector<ThreadRow> thread_rows() const;
    std::vector<GilRow> gil_rows() const;
    std::vector<BlameLine> blame_lines() const;

private:
    // Parts of text(): the heading and the GILs' lines; the blame table.
    void gil_text(std::string& screen, size_t& rows, size_t width, size_t height, const std::string& what) const;
    void blame_text(std::string& screen, size_t& rows, size_t width, size_t height,
                    const std::vector<BlameLine>& blame) const;
    size_t blame_top_;
    bool have_now_ = false;
    LiveFigures before_, now_;
};

}  // namespace gilscan
