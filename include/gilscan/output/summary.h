// Stage: the per-thread summary — a table on stdout (per4m style) and
// `--summary-json FILE` (summary.cc builds and prints it, summary_json.cc
// lays out the JSON).
//
//   FileSummary fs = build_summary(session, timeline.threads(), filter);
//   print_summary_table(stdout, fs);
//   write_text_file("summary.json", json_dump(summary_json(fs), 2));
//
// GIL figures stay null (std::nullopt) until a later stage can measure them:
// gil_sleep_* needs unwound stacks, gil_wait/hold needs GIL uprobes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "gilscan/gil/blame.h"
#include "gilscan/gil/gil_probes.h"
#include "gilscan/gil/gil_stacks.h"
#include "gilscan/output/output_file.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/timeline.h"

namespace gilscan {

struct ThreadSummary {
    ThreadStats st;
    uint64_t span_ns = 0;
    bool main_thread = false;
    std::optional<uint64_t> gil_sleep_ns, gil_wait_ns, gil_hold_ns, no_gil_ns;
    std::optional<uint64_t> gil_sleep_count;
    uint64_t gil_mask = 0;  // with the uprobes: which of its process's GILs it took (GilThreadStats::gil_mask)
};

struct FileSummary {
    std::string file, clock, hostname, cmdline, perf_version;
    std::string date;  // ISO 8601 UTC of the first event, from HEADER_CLOCK_DATA ("" if unknown)
    uint64_t first_time = 0, last_time = 0;
    // --time: the part analysed (every figure, row and span is of it alone).
    struct Window {
        std::optional<double> start_s, stop_s;  // as asked, seconds from the first sample
        uint64_t start_ns = 0, stop_ns = 0;     // on the recording's clock, within first_time..last_time
        std::string text;                       // "1.5 s to 3 s"
    };
    std::optional<Window> window;
    uint64_t lost_events = 0, lost_records = 0, lost_samples = 0;
    std::map<uint32_t, uint64_t> lost_by_cpu, lost_samples_by_cpu;
    std::map<std::string, uint64_t> event_counts;
    std::vector<std::string> warnings;
    std::vector<ThreadSummary> threads;
    bool pipe_mode = false, compressed = false, truncated = false;
    bool gil_sleep_known = false;  // set when sleeps were classified (stacks or uprobes)
    std::string gil_sleep_source;  // "uprobes" or "stacks"
    bool gil_probes = false;       // take_gil/drop_gil uprobes were recorded
    uint64_t gil_probe_events = 0;
    std::vector<GilProcessStats> gil_processes;
    GilAnomalies gil_anomalies;
    StackStats stack_stats;
    // --gil-functions: S(GIL) sleeps by process and Python function (the
    // most sleep time first; "" = no function named), when asked for.
    bool gil_functions_known = false;
    std::vector<GilFunctionStats> gil_functions;
    // GIL blame (blame.h): who held the GIL while others waited, by process
    // and function, the most contended first; known when some thread waited.
    bool blame_known = false;
    bool blame_inferred = false;           // holders inferred from the scheduler (no uprobes)
    std::vector<BlameRow> gil_blame;
    std::map<int32_t, uint64_t> blame_waiting_ns;  // per process: time with at least one waiter
    size_t blame_top = 10;                 // rows the table shows (--top)
};

// "2026-11-29T12:02:26Z" for nanoseconds since the epoch.
std::string iso8601_utc(int64_t ns);

// cpu_wide: Timeline::cpu_wide() (which cause the unrecorded switch-ins' warning names).
FileSummary build_summary(const Session& s, const std::vector<const ThreadStats*>& threads,
                          const std::unordered_set<int32_t>& pids, const GilTracker* gil = nullptr,
                          bool cpu_wide = false);
// With GIL uprobes in the recording, the table shows the threads of the
// processes that ran the probed Python unless all_threads.
void print_summary_table(std::FILE* out, const FileSummary& fs, bool all_threads = false);
// The table's rows of GIL waits by function: the first this many, then a count.
constexpr size_t kGilFunctionRowsShown = 20;
nlohmann::json summary_json(const FileSummary& fs);
// j as text, with every string's ill-formed UTF-8 replaced by U+FFFD (the
// default dump() throws there): what each JSON output gilscan writes uses.
std::string json_dump(const nlohmann::json& j, int indent = -1);
// The same document, json_dump(…, 2) and a newline, written row by row into `out`
// (a system-wide capture can have hundreds of thousands of threads).
void write_summary_json(OutputFile& out, const FileSummary& fs);

}  // namespace gilscan
