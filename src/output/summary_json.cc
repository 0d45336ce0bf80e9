#include "gilscan/output/summary.h"

#include "gilscan/output/blame_report.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

namespace {

double us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

nlohmann::json thread_json(const ThreadSummary& t) {
    using nlohmann::json;
    auto opt_us = [](const std::optional<uint64_t>& v) { return v ? json(us(*v)) : json(nullptr); };
    json r;
    r["pid"] = t.st.tgid;
    r["tid"] = t.st.tid;
    r["comm"] = t.st.comm;
    r["main_thread"] = t.main_thread;
    r["span_us"] = us(t.span_ns);
    // The span's ends on the recording's clock (CLOCK_MONOTONIC with record's -k): first event or fork, exit or end.
    r["first_ns"] = t.st.first_seen;
    r["last_ns"] = t.st.last_seen;
    r["running_us"] = us(t.st.running_ns);
    r["runnable_us"] = us(t.st.runnable_ns);
    r["hidden_switch_ins"] = t.st.hidden_switch_ins;
    r["hidden_switch_in_us"] = us(t.st.hidden_switch_in_ns);
    r["hidden_wakeups"] = t.st.hidden_wakeups;
    r["sleep_us"] = us(t.st.sleep_ns);
    r["sleep_count"] = t.st.sleep_count;
    r["disk_sleep_us"] = us(t.st.disk_ns);
    r["disk_sleep_count"] = t.st.disk_count;
    r["other_state_us"] = us(t.st.other_ns);
    r["unknown_us"] = us(t.st.unknown_ns);
    r["gil_sleep_us"] = opt_us(t.gil_sleep_ns);
    r["gil_sleep_count"] = t.gil_sleep_count ? json(*t.gil_sleep_count) : json(nullptr);
    r["gil_wait_us"] = opt_us(t.gil_wait_ns);
    r["gil_hold_us"] = opt_us(t.gil_hold_ns);
    r["no_gil_us"] = opt_us(t.no_gil_ns);
    // The process's GILs (gil.processes' gil_index) the thread took; null without the uprobes.
    json gils = json::array();
    for (unsigned k = 0; k < 64; ++k)
        if (t.gil_mask >> k & 1) gils.push_back(k);
    r["gil_indices"] = t.gil_wait_ns ? gils : json(nullptr);
    return r;
}

// Everything but the rows: "threads" is an empty array.
nlohmann::json summary_head(const FileSummary& fs) {
    using nlohmann::json;
    json j;
    j["file"] = fs.file;
    j["clock"] = fs.clock;
    j["hostname"] = fs.hostname;
    j["cmdline"] = fs.cmdline;
    j["perf_version"] = fs.perf_version;
    j["date"] = fs.date.empty() ? json(nullptr) : json(fs.date);
    j["first_time_ns"] = fs.first_time;
    j["last_time_ns"] = fs.last_time;
    if (fs.window) {
        const auto secs = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
        j["window"] = {{"start_s", secs(fs.window->start_s)}, {"stop_s", secs(fs.window->stop_s)},
                       {"start_ns", fs.window->start_ns}, {"stop_ns", fs.window->stop_ns}};
    } else {
        j["window"] = nullptr;
    }
    j["pipe_mode"] = fs.pipe_mode;
    j["compressed"] = fs.compressed;
    j["truncated"] = fs.truncated;
    j["lost_events"] = fs.lost_events;
    j["lost_records"] = fs.lost_records;
    j["lost_samples"] = fs.lost_samples;
    json per_cpu = json::object();
    for (const auto& [cpu, n] : fs.lost_by_cpu) per_cpu[cpu == ~0u ? "unknown" : std::to_string(cpu)] = n;
    j["lost_by_cpu"] = per_cpu;
    json per_cpu_samples = json::object();
    for (const auto& [cpu, n] : fs.lost_samples_by_cpu)
        per_cpu_samples[cpu == ~0u ? "unknown" : std::to_string(cpu)] = n;
    j["lost_samples_by_cpu"] = per_cpu_samples;
    j["event_counts"] = fs.event_counts;
    j["warnings"] = fs.warnings;
    j["threads"] = json::array();
    j["gil_sleep_source"] = fs.gil_sleep_known ? json(fs.gil_sleep_source) : json(nullptr);
    json g = json::object();
    g["uprobes"] = fs.gil_probes;
    g["probe_events"] = fs.gil_probe_events;
    json procs = json::array();
    for (const auto& p : fs.gil_processes) {
        const uint64_t span = p.last > p.first ? p.last - p.first : 0;
        char address[24] = "";
        std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(p.address));
        procs.push_back({{"pid", p.pid},
                         {"gil_index", p.index},
                         {"gil_address", p.address ? json(address) : json(nullptr)},
                         {"span_us", us(span)},
                         {"held_us", us(p.held_ns)},
                         {"contended_us", us(p.contended_ns)},
                         {"waiting_us", us(p.waiting_ns)},
                         {"gil_load", span ? static_cast<double>(p.held_ns) / static_cast<double>(span) : 0.0},
                         {"max_waiters", p.max_waiters}});
    }
    g["processes"] = procs;
    g["anomalies"] = {{"take_without_return", fs.gil_anomalies.take_without_return},
                      {"return_without_take", fs.gil_anomalies.return_without_take},
                      {"drop_without_take", fs.gil_anomalies.drop_without_take},
                      {"releases_not_seen", fs.gil_anomalies.releases_not_seen},
                      {"implicit_drops", fs.gil_anomalies.implicit_drops}};
    j["gil"] = g;
    if (fs.gil_functions_known) {
        json fns = json::array();
        for (const auto& f : fs.gil_functions)
            fns.push_back({{"pid", f.tgid},
                           {"function", f.function.empty() ? json(nullptr) : json(f.function)},
                           {"sleep_count", f.sleep_count},
                           {"sleep_us", us(f.sleep_ns)}});
        j["gil_functions"] = fns;
    }
    if (fs.blame_known) {
        j["gil_blame"] = blame_json(fs);
        j["gil_blame_source"] = fs.blame_inferred ? "inferred" : "uprobes";
    }
    const StackStats& st = fs.stack_stats;
    j["stacks"] = {{"sleeps_seen", st.sleeps_seen}, {"not_python", st.not_python}, {"no_stack", st.no_stack},
                   {"decided", st.decided}, {"complete", st.complete}, {"stopped_early", st.stopped_early},
                   {"failed", st.failed}, {"gil", st.gil}, {"handoff", st.handoff}};
    return j;
}

}  // namespace

nlohmann::json summary_json(const FileSummary& fs) {
    nlohmann::json j = summary_head(fs);
    for (const auto& t : fs.threads) j["threads"].push_back(thread_json(t));
    return j;
}

std::string json_dump(const nlohmann::json& j, int indent) {
    // Strings come from the recording as bytes (utf8.h); nlohmann's default
    // handler throws at the first ill-formed one, which ended a run with a
    // thread whose comm the kernel had cut inside a character.
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_summary_json(OutputFile& out, const FileSummary& fs) {
    // What json_dump(summary_json(fs), 2) gives, with the rows made and written one
    // at a time: as one document, a capture with hundreds of thousands
    // of threads would hold gigabytes.
    const std::string head = json_dump(summary_head(fs), 2);
    const std::string_view key = "\n  \"threads\": ";  // the top level's (indent 2)
    const size_t at = head.find(key);
    if (fs.threads.empty() || at == std::string::npos) {
        // No rows; or (not expected) no place found for them: the whole
        // document at once rather than a summary without its rows.
        out.write(fs.threads.empty() ? head : json_dump(summary_json(fs), 2));
        out.write("\n", 1);
        return;
    }
    const size_t rows_at = at + key.size();  // where "[]" stands
    out.write(std::string_view(head).substr(0, rows_at));
    out.write("[\n", 2);
    std::string row;
    for (size_t i = 0; i < fs.threads.size(); ++i) {
        // An element of a top-level array: its lines indented by 4 more.
        row = "    ";
        for (char c : json_dump(thread_json(fs.threads[i]), 2)) {
            row += c;
            if (c == '\n') row += "    ";
        }
        if (i + 1 < fs.threads.size()) row += ",\n";
        out.write(row);
    }
    out.write("\n  ]", 4);
    out.write(std::string_view(head).substr(rows_at + 2));
    out.write("\n", 1);
}

}  // namespace gilscan
