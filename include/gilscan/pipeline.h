// The whole analysis of one recording: the stages in order (docs/design.md,
// "The stages"), shared by `gilscan FILE`, `gilscan record` and
// `gilscan batch`.
//
//   AnalysisOptions o;
//   o.input = "perf.data";
//   o.output = "trace.json";          // "" = no trace
//   FileSummary s = analyse_recording(o);
//
// Stages: 1. perfdata (the file, header, features, records in time order)
// -> 2. sched (tracepoint events, per-thread state spans) -> 3. symbols
// (process maps, binaries, unwinding, names) -> 4. gil (GIL uprobes, sleeps
// labelled from stacks) -> 5. output (trace and summary).
// Throws gilscan::Error for an input that is not a usable recording; the
// trace is then not written.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>

#include "gilscan/output/summary.h"
#include "gilscan/output/top_view.h"
#include "gilscan/output/trace_writer.h"
#include "gilscan/perfdata/time_window.h"

namespace gilscan {

// gilscan top: what the analysis of a stream shows while it runs.
class LiveAnalysis {
public:
    virtual ~LiveAnalysis() = default;
    // Every figure from the recording's start up to the latest moment the
    // stages are known to have every record for, not past `now` (the
    // recording's clock: CLOCK_MONOTONIC ns for gilscan record's): its
    // `time`. Open states are counted up to it; nothing is closed.
    virtual LiveFigures figures(uint64_t now) const = 0;
};

struct AnalysisOptions {
    std::string input;
    // gilscan top: a pipe-mode stream on this descriptor (taken over), read
    // as perf writes it, instead of the file `input` (-1). One thread.
    int input_fd = -1;
    // With input_fd: called on the analysis's thread between records while
    // the stream is read: at each read, and every 100 ms while it waits for
    // perf. The stages are at rest during the call.
    std::function<void(const LiveAnalysis&)> on_live;
    // With input_fd: a time (CLOCK_MONOTONIC ns) before which perf has
    // written every record to the stream, once known (0 until then); set
    // from another thread (gilscan top's record loop: RecordTarget::flushed_to).
    const std::atomic<uint64_t>* stream_flushed = nullptr;
    std::string display_name;   // the name to report (e.g. the .data.zst it came from)
    std::string output;         // trace JSON path, "" = none
    std::string html;           // --html report path, "" = none (html_report.h)
    TraceOptions trace;
    std::unordered_set<int32_t> pids;
    TimeWindow window;          // --time: only this part of the recording (every output)
    std::string gil_evidence = "auto";  // auto | stacks | probes
    std::string symfs;
    std::string perf_maps;      // directory of perf-PID.map files for JIT frames' names ("": none; perf_map.h)
    // Whose perf maps are read besides root's: -1, the input file's owner
    // (perf writes a recording as the user it records for).
    int64_t perf_map_owner = -1;
    unsigned sleep_stacks = 0;
    // GIL waits by Python function (SleepLabel::function): each S(GIL)
    // sleep's stack unwound past take_gil to its first JIT frame, named by
    // perf_maps; totalled in FileSummary::gil_functions.
    bool gil_functions = false;
    // GIL blame (gil/blame.h): who held the GIL while others waited. Off:
    // no table, no CPU sample unwound. The folded outputs: "" = none.
    bool blame = true;
    size_t blame_top = 10;
    std::string blame_folded, wait_folded;
    // -j: threads. 1: everything on the calling thread. 2: a reader thread
    // and a trace-writing thread beside it. 3 and up, with --sleep-stacks:
    // jobs - 2 threads unwind and symbolize the sleeps' stacks.
    unsigned jobs = 1;
    std::optional<bool> reader_thread;  // jobs >= 2: force the reader thread on or off (tests; default: from 4 MiB)
    // With the reader thread: whether it classifies sleeps ahead of the stages
    // (reader_stacks.h). Default: when the stages are behind, and never
    // waiting for them. true: every sleep it can, waiting where a label
    // needs the stages' thread (tests), false: never.
    std::optional<bool> reader_stacks;
    std::function<void(uint64_t, uint64_t)> progress;
    // Where inflated copies of compressed debug files are kept (debuginfo_cache.h); "": none.
    std::string debuginfo_cache;
    // Called with the finished summary once the trace is committed, before
    // the run's memory is freed. `gilscan FILE` reports there and ends the
    // process: freeing a run's caches, Dwfls and buffers (libdw's trees, the
    // read chunks' munmaps) is a noticeable part of a short run, and work the
    // kernel does anyway at exit.
    std::function<void(const FileSummary&)> on_complete;
};

FileSummary analyse_recording(const AnalysisOptions& opt);

// The default -j of `gilscan` and `gilscan batch`: every core (at least 1).
unsigned all_cores();

}  // namespace gilscan
