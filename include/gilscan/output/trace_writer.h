// Stage: Chrome trace JSON (Perfetto, chrome://tracing, VizTracer --combine),
// streamed span by span — the trace is never held in memory.
//
//   OutputFile out("trace.json");
//   TraceWriter tw(out, {.running = false});
//   Timeline tl(session, tw);  session.run(tl);  tl.finish(end);
//   tw.finish(tl.threads(), meta);   // thread/process names, metadata
//   out.commit();
//
// Layout: {"traceEvents":[...],"viztracer_metadata":{...},"otherData":{...}}.
// pid = process (tgid), tid = thread; ts/dur in microseconds with three
// decimals (nanosecond precision) on the recording's own clock, so a
// `perf record -k CLOCK_MONOTONIC` trace lines up with VizTracer's.
// Sleeps are complete events named like per4m's: "S", "S(GIL)", "D"; runnable
// time "R+"; running "R" only with `running`. Each has a fixed catapult
// colour (cname). A thread's GIL waits and holds, which overlap its states
// partially, are on a row of their own (gil_row_tid) named "GIL · <name>"
// beside the thread's; a process's holder track comes first in it, Python
// processes before others. With TraceOptions::viztracer the states are on a
// row of their own too, "state · <name>" (VizTracer's functions take the
// thread's row). No row holds spans that overlap partially, and
// no span has zero length (test/e2e/checklib.py checks every trace the
// end-to-end tests write).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/output/output_file.h"
#include "gilscan/gil/trace_sink.h"
#include "gilscan/sched/timeline.h"

namespace gilscan {

struct TraceOptions {
    bool running = false;   // per4m's --running
    bool runnable = true;
    bool sleeping = true;
    std::unordered_set<int32_t> pids;  // only these processes (empty: all)
    // --viztracer: laid out to be merged with a VizTracer trace (`viztracer
    // --combine`, which concatenates the files' events; a viewer takes a
    // row's last name). VizTracer's function slices are on the threads' own
    // rows (pid, tid) and it names those rows and its process: the states go
    // on a row of their own (state_row_tid), and gilscan names neither the
    // threads' own rows nor a Python process (finish()).
    bool viztracer = false;
};

// The id of a thread's state row with TraceOptions::viztracer: above any
// real tid (Linux caps pids at 2^22), below the GIL rows (gil_row_tid).
inline int32_t state_row_tid(int32_t tid) { return static_cast<int32_t>(static_cast<uint32_t>(tid) + 0x10000000u); }

// Which events a trace keeps (the options are fixed for a run). A value:
// the relay keeps its own copy, so the stages' thread asks it without
// reading the writer's cache lines, which the formatting thread writes.
struct TraceFilter {
    TraceOptions opt;
    bool wanted(int32_t pid) const { return opt.pids.empty() || opt.pids.count(pid); }
    bool wanted(const Span& s) const {
        if (!wanted(s.tgid)) return false;
        switch (s.kind) {
        case SpanKind::Running: return opt.running;
        case SpanKind::Runnable: return opt.runnable;
        case SpanKind::Sleep:
        case SpanKind::DiskSleep:
        case SpanKind::Other: return opt.sleeping;
        case SpanKind::Unknown: break;
        }
        return true;
    }
};

// A process's "GIL holder" track (gil_track_tid) and its name.
struct HolderTrack {
    int32_t pid = 0, track_tid = 0;
    std::string name;
};

struct TraceMeta {
    std::string source_file;
    std::string clock;
    std::string hostname;
    std::string cmdline;
    std::vector<HolderTrack> holder_tracks;
    std::vector<std::pair<int32_t, int32_t>> gil_rows;  // (pid, tid) of the threads with a GIL row
    std::unordered_set<int32_t> python_pids;            // processes listed first
};

// alignas(128): the formatting thread writes its state for every event; no
// other object (the relay, a stage's tables) may share its cache lines.
class alignas(128) TraceWriter final : public TraceSink {
public:
    TraceWriter(OutputFile& out, TraceOptions opt);
    void span(const Span& s) override;
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override;
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns, bool cut) override;
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                    std::string_view culprit) override;
    void gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) override;
    void finish(const std::vector<const ThreadStats*>& threads, const TraceMeta& meta);
    uint64_t events_written() const { return events_; }

    // Which events are written (a relay asks its copy before it hands an event over).
    const TraceFilter& filter() const { return filter_; }

private:
    // Events are formatted straight into the output buffer: begin(bound)
    // reserves room for the event's worst case (every string byte escaped),
    // end() hands the used part over.
    char* begin(size_t bound);
    void end(char* p);
    // A "M" event: what = "thread_name" or "process_name".
    void metadata(std::string_view what, int32_t pid, int32_t tid, std::string_view name);
    void sort_index(std::string_view what, int32_t pid, int32_t tid, int64_t index);
    void meta_event(std::string_view what, int32_t pid, int32_t tid, std::string_view args);
    void name_process_rows(int32_t pid, const std::map<std::pair<bool, int32_t>, const ThreadStats*>& members,
                           const std::set<std::pair<int32_t, int32_t>>& gil_rows);

    // Formatting numbers is most of an event's cost, and a trace repeats
    // them: the text ,"pid":P,"tid":T is kept per track (direct-mapped by
    // tid), a counter's ,"pid":P per pid, and a timestamp's microseconds
    // above the last four digits (they change every 10 ms) from the
    // previous event.
    struct TrackText {
        int32_t pid = 0, tid = 0;
        uint32_t len = 0;  // 0: empty slot
        char text[44];
    };
    static constexpr size_t kTrackSlots = 4096, kPidSlots = 256;
    char* put_cached(char* p, TrackText& t, int32_t pid, int32_t tid, bool with_tid);
    char* put_track(char* p, int32_t pid, int32_t tid);
    char* put_pid(char* p, int32_t pid);
    char* put_ts(char* p, uint64_t ns);
    char* put_interval(char* p, uint64_t start_ns, uint64_t end_ns);  // ,"ts":…,"dur":…
    // 229 KB: prefaulted (byte_buffer.h), not zeroed page fault by page fault.
    std::vector<TrackText, PrefaultAllocator<TrackText>> tracks_ =
        std::vector<TrackText, PrefaultAllocator<TrackText>>(kTrackSlots);
    std::vector<TrackText> pids_ = std::vector<TrackText>(kPidSlots);
    uint64_t ts_high_ = ~uint64_t{0};  // ns / 10^7 (microseconds / 10000) that ts_text_ holds
    uint32_t ts_len_ = 0;
    char ts_text_[24] = {};

    OutputFile& out_;
    TraceFilter filter_;
    uint32_t state_row_offset_ = 0;  // added to a span's tid: 0, or state_row_tid's with viztracer
    char* start_ = nullptr;
    std::string big_;  // an event too large for the buffer's room (a huge stack) is built here
    uint64_t events_ = 0;
};


}  // namespace gilscan
