// Stage: the per-thread summary — a table on stdout (per4m style) and
// `--summary-json FILE`.
//
//   FileSummary fs = build_summary(session, timeline.threads(), filter);
//   print_summary_table(stdout, fs);
//   write_text_file("summary.json", summary_json(fs).dump(2));
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

#include "gilscan/session.h"
#include "gilscan/timeline.h"

namespace gilscan {

struct ThreadSummary {
    ThreadStats st;
    uint64_t span_ns = 0;
    bool main_thread = false;
    std::optional<uint64_t> gil_sleep_ns, gil_wait_ns, gil_hold_ns, no_gil_ns;
    std::optional<uint64_t> gil_sleep_count;
};

struct FileSummary {
    std::string file, clock, hostname, cmdline, perf_version;
    uint64_t first_time = 0, last_time = 0;
    uint64_t lost_events = 0, lost_records = 0, lost_samples = 0;
    std::map<uint32_t, uint64_t> lost_by_cpu, lost_samples_by_cpu;
    std::map<std::string, uint64_t> event_counts;
    std::vector<std::string> warnings;
    std::vector<ThreadSummary> threads;
    bool pipe_mode = false, compressed = false, truncated = false;
    bool gil_sleep_known = false;  // set when stacks were classified
};

FileSummary build_summary(const Session& s, const std::vector<ThreadStats>& threads,
                          const std::unordered_set<int32_t>& pids);
void print_summary_table(std::FILE* out, const FileSummary& fs);
nlohmann::json summary_json(const FileSummary& fs);

}  // namespace gilscan
