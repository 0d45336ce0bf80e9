#include "gilscan/output/summary.h"

#include <algorithm>
#include <ctime>

#include "gilscan/output/blame_report.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

std::string iso8601_utc(int64_t ns) {
    std::time_t t = static_cast<std::time_t>(ns / 1000000000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

namespace {

// The file-level facts: where, when, what was recorded and lost.
void add_file_facts(const Session& s, FileSummary& fs) {
    const DecodeStats& st = s.stats();
    fs.file = s.path();
    fs.clock = s.clock();
    fs.hostname = s.features().hostname;
    fs.perf_version = s.features().perf_version;
    for (const auto& a : s.features().cmdline) fs.cmdline += (fs.cmdline.empty() ? "" : " ") + a;
    fs.first_time = st.first_time;
    if (const auto& cd = s.features().clock_data; cd && st.have_time) {
        // Wall clock of the first event: tod at the reference point, moved by
        // how far the first event is from that point on the recording clock.
        fs.date = iso8601_utc(static_cast<int64_t>(cd->tod_ns) +
                              (static_cast<int64_t>(st.first_time) - static_cast<int64_t>(cd->clockid_ns)));
    }
    fs.last_time = st.last_time;
    if (const TimeWindow* w = s.window(); w && w->active()) {
        FileSummary::Window fw{w->start_s, w->stop_s, std::clamp(w->lo, st.first_time, st.last_time),
                               std::clamp(w->hi, st.first_time, st.last_time), w->describe()};
        if (!st.have_time) fw.start_ns = fw.stop_ns = 0;
        fs.window = fw;
    }
    fs.lost_events = st.lost_events;
    fs.lost_records = st.lost_records;
    fs.lost_samples = st.lost_samples;
    fs.lost_by_cpu = st.lost_by_cpu;
    fs.lost_samples_by_cpu = st.lost_samples_by_cpu;
    fs.warnings = st.warnings;
    fs.pipe_mode = s.header().pipe;
    fs.compressed = st.compressed_records > 0;
    fs.truncated = st.truncated;
    for (size_t i = 0; i < st.samples_by_event.size(); ++i)
        if (st.samples_by_event[i]) fs.event_counts[s.events()[i].name] += st.samples_by_event[i];
}

// One row per thread, in (pid, tid) order, ties in first-seen order: the
// sort moves 16-byte keys, not rows (a system-wide capture can have
// 10^5-10^6 tids). GIL figures for every thread of a process that ran the
// probed Python.
void add_threads(const std::vector<const ThreadStats*>& threads, const std::unordered_set<int32_t>& pids,
                 const GilTracker* gil, const TimeWindow* window, FileSummary& fs) {
    const bool probes = gil && gil->seen_probes();
    std::unordered_set<int32_t> gil_pids;  // processes that ran the probed Python
    if (probes)
        for (const auto& gp : gil->processes()) gil_pids.insert(gp.pid);
    struct Row {
        int32_t pid, tid;
        const ThreadStats* t;
    };
    std::vector<Row> rows;
    rows.reserve(threads.size());
    for (const ThreadStats* t : threads) {
        if (t->tid <= 0) continue;
        int32_t pid = t->tgid > 0 ? t->tgid : t->tid;
        if (!pids.empty() && !pids.count(pid)) continue;
        if (!t->monitored) continue;  // named by a record, but its events were not recorded
        // --time: a thread whose life does not meet the window is not in it.
        if (window && (t->last_seen < window->lo || t->first_seen >= window->hi)) continue;
        rows.push_back({pid, t->tid, t});
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.pid != b.pid ? a.pid < b.pid : a.tid < b.tid; });
    fs.threads.reserve(rows.size());
    for (const Row& row : rows) {
        const ThreadStats& t = *row.t;
        ThreadSummary ts;
        ts.st = t;
        ts.st.tgid = row.pid;
        if (window) {
            ts.st.first_seen = std::max(t.first_seen, window->lo);
            ts.st.last_seen = std::min(t.last_seen, window->hi);
        }
        ts.span_ns = ts.st.last_seen >= ts.st.first_seen ? ts.st.last_seen - ts.st.first_seen : 0;
        ts.main_thread = t.tid == row.pid;
        if (probes && !t.replaced_by_exec && gil_pids.count(row.pid)) {
            const GilThreadStats* g = gil->thread(t.tid);
            uint64_t wait = g ? g->wait_ns : 0, hold = g ? g->hold_ns : 0;
            ts.gil_wait_ns = wait;
            ts.gil_hold_ns = hold;
            ts.no_gil_ns = ts.span_ns > wait + hold ? ts.span_ns - wait - hold : 0;
            ts.gil_mask = g ? g->gil_mask : 0;
        }
        fs.threads.push_back(std::move(ts));
    }
}

// Per GIL: the uprobes' figures and anomalies.
void add_gil_processes(const GilTracker& gil, const std::unordered_set<int32_t>& pids, const TimeWindow* window,
                       FileSummary& fs) {
    fs.gil_probes = true;
    fs.gil_probe_events = gil.probe_events();
    for (auto gp : gil.processes()) {
        if (!pids.empty() && !pids.count(gp.pid)) continue;
        if (window) {  // its span within the window, if it meets it
            if (gp.last < window->lo || gp.first >= window->hi) continue;
            gp.first = std::max(gp.first, window->lo);
            gp.last = std::min(gp.last, window->hi);
        }
        fs.gil_processes.push_back(gp);
    }
    fs.gil_anomalies = gil.anomalies();
    if (fs.gil_anomalies.implicit_drops)
        fs.warnings.push_back(std::to_string(fs.gil_anomalies.implicit_drops) +
                              " GIL hold(s) ended by take_gil itself (drop_gil not probed on that path: inlined "
                              "in this build, e.g. at the eval breaker); held time ends when take_gil is entered");
    if (fs.gil_anomalies.releases_not_seen)
        fs.warnings.push_back(std::to_string(fs.gil_anomalies.releases_not_seen) +
                              " GIL hold(s) ended by another thread's take (releases not seen: this build releases "
                              "the GIL where no probe is, e.g. copies of drop_gil inlined into I/O functions); a GIL "
                              "has one holder, so each such hold ends when the next take returns");
    if (fs.gil_anomalies.total())
        fs.warnings.push_back(std::to_string(fs.gil_anomalies.total()) +
                              " GIL uprobe anomalies (missing returns, drops without takes): usually lost events "
                              "or probes placed mid-run");
}

// gilscan record's perf command: -k CLOCK_MONOTONIC first and its control
// channel on inherited descriptors (record_run.cc), which a perf record
// typed by hand has no use for.
bool made_by_gilscan_record(const std::vector<std::string>& cmdline) {
    const auto has = [&](const std::string& a, const std::string& b_prefix) {
        for (size_t i = 0; i + 1 < cmdline.size(); ++i)
            if (cmdline[i] == a && cmdline[i + 1].rfind(b_prefix, 0) == 0) return true;
        return false;
    };
    return has("record", "-k") && has("-k", "CLOCK_MONOTONIC") && has("--control", "fd:");
}

// Switch-ins the recording could not show (docs/figures.md, "Per-process
// recordings"): said when the time from those wake-ups and preemptions to
// the thread's next event, counted as running, is a share of some thread's
// span that the table's one decimal shows (0.05% or more), and never for
// gilscan record's recordings, whose mode is record's choice.
void warn_hidden_switch_ins(const Session& s, bool cpu_wide, FileSummary& fs) {
    uint64_t hidden = 0, hidden_ns = 0;
    bool shows = false;
    for (const auto& t : fs.threads) {
        hidden += t.st.hidden_switch_ins;
        hidden_ns += t.st.hidden_switch_in_ns;
        shows = shows || (t.span_ns && t.st.hidden_switch_in_ns * 2000 >= t.span_ns);
    }
    if (!shows || made_by_gilscan_record(s.features().cmdline)) return;
    char amount[64];
    std::snprintf(amount, sizeof amount, "%.1f ms", static_cast<double>(hidden_ns) / 1e6);
    if (!cpu_wide)
        fs.warnings.push_back(std::to_string(hidden) +
                              " switch-in(s) were not recorded (a per-process recording: sched_switch fires in "
                              "the context of the task switched out); the " + amount + " from those wake-ups or "
                              "preemptions to running again count as running. Record with -a to measure runnable time.");
    else
        // Per-CPU events see every switch, but perf enables and disables them
        // CPU by CPU (a thread that moves to a CPU not yet, or no longer,
        // recording is next seen running), and testdata/system_wide.data
        // lacks every switch-out of one CPU's idle task mid-recording.
        fs.warnings.push_back(std::to_string(hidden) +
                              " switch-in(s) were not recorded in this system-wide recording (at its start or end on "
                              "a CPU, after lost events, on CPUs left out with -C, or not traced by the kernel); the " +
                              amount + " from those wake-ups or preemptions to running again count as running.");
}

}  // namespace

FileSummary build_summary(const Session& s, const std::vector<const ThreadStats*>& threads,
                          const std::unordered_set<int32_t>& pids, const GilTracker* gil, bool cpu_wide) {
    FileSummary fs;
    add_file_facts(s, fs);
    const TimeWindow* window = s.window() && s.window()->active() ? s.window() : nullptr;
    add_threads(threads, pids, gil, window, fs);
    if (gil && gil->seen_probes()) add_gil_processes(*gil, pids, window, fs);
    warn_hidden_switch_ins(s, cpu_wide, fs);
    return fs;
}

namespace {
double pct(uint64_t part, uint64_t whole) { return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }
double ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// The comm column: UTF-8 (utf8.h), at most 16 characters, padded to 16
// characters, where printf's %-16.16s counts bytes and could cut a
// character in two (a wide script's columns still come out wider).
std::string comm_column(const std::string& comm) {
    const std::string s = valid_utf8(comm);
    size_t chars = 0, end = 0;
    for (; end < s.size() && chars < 16; ++chars)
        end += utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + end, s.size() - end).len;
    return s.substr(0, end) + std::string(16 - chars, ' ');
}
// GIL numbers (1-based, as the "GIL load" lines have them) of a thread's
// GilThreadStats::gil_mask: "1,3"; "-" for none; bit 63 stands for 64 and up.
std::string gil_numbers(uint64_t mask) {
    std::string s;
    for (unsigned k = 0; k < 64; ++k) {
        if (!(mask >> k & 1)) continue;
        if (!s.empty()) s += ',';
        s += std::to_string(k + 1);
        if (k == 63) s += '+';
    }
    return s.empty() ? "-" : s;
}

// --gil-functions: where each process's S(GIL) sleep time went, by the
// Python function whose stack waited.
void print_gil_functions(std::FILE* out, const FileSummary& fs) {
    uint64_t total = 0;
    for (const auto& f : fs.gil_functions) total += f.sleep_ns;
    std::fprintf(out, "\nGIL waits by Python function (S(GIL) sleeps; the innermost JIT frame past take_gil, named by a perf map or jitdump):\n");
    if (fs.gil_functions.empty()) {
        std::fprintf(out, "  (no S(GIL) sleeps)\n");
        return;
    }
    std::fprintf(out, "%9s %8s %10s %7s  %s\n", "PID", "sleeps", "S(GIL)ms", "share%", "function");
    size_t shown = 0;
    for (const auto& f : fs.gil_functions) {
        if (shown++ == kGilFunctionRowsShown) break;
        std::fprintf(out, "%9d %8llu %10.1f %7.1f  %s\n", f.tgid, static_cast<unsigned long long>(f.sleep_count),
                     ms(f.sleep_ns), pct(f.sleep_ns, total),
                     f.function.empty() ? "(no function named)" : valid_utf8(f.function).c_str());
    }
    if (fs.gil_functions.size() > kGilFunctionRowsShown)
        std::fprintf(out, "(%zu more rows in --summary-json)\n", fs.gil_functions.size() - kGilFunctionRowsShown);
}
}  // namespace

void print_summary_table(std::FILE* out, const FileSummary& fs, bool all_threads) {
    if (fs.window)
        std::fprintf(out, "\nSummary of threads (%s, clock %s, %.1f ms from %s of %.1f ms recorded):\n\n",
                     fs.file.c_str(), fs.clock.c_str(), ms(fs.window->stop_ns - fs.window->start_ns),
                     fs.window->text.c_str(), ms(fs.last_time - fs.first_time));
    else
        std::fprintf(out, "\nSummary of threads (%s, clock %s, %.1f ms recorded):\n\n", fs.file.c_str(),
                     fs.clock.c_str(), ms(fs.last_time - fs.first_time));
    const bool gil_wait = std::any_of(fs.threads.begin(), fs.threads.end(), [](auto& t) { return t.gil_wait_ns.has_value(); });
    std::fprintf(out, "%9s %8s  %-16s %10s %8s %9s %7s %7s %6s %6s", "PID", "TID", "comm", "total(ms)", "run%",
                 "runnable%", "sleep%", "sleeps", "D%", "?%");
    if (fs.gil_sleep_known) std::fprintf(out, " %11s", "S(GIL)%");
    if (gil_wait) std::fprintf(out, " %8s %8s %9s %9s %9s", "no-GIL%", "GIL%", "GIL-wait%", "GIL(ms)", "wait(ms)");
    // Which GILs each thread took, where a process has several (subinterpreters with their own).
    const bool several_gils =
        std::any_of(fs.gil_processes.begin(), fs.gil_processes.end(), [](auto& p) { return p.index > 0; });
    if (several_gils) std::fprintf(out, "  %s", "GILs");
    std::fprintf(out, "\n");
    size_t hidden = 0;
    for (const auto& t : fs.threads) {
        if (gil_wait && !all_threads && !t.gil_wait_ns) {
            ++hidden;  // a process that never ran the probed Python (the pyenv shim's bash, ...)
            continue;
        }
        const uint64_t span = t.span_ns;
        char pid[24];
        std::snprintf(pid, sizeof pid, "%d%s", t.st.tgid, t.main_thread ? "*" : "");
        std::fprintf(out, "%9s %8d  %s %10.1f %8.1f %9.1f %7.1f %7llu %6.1f %6.1f", pid, t.st.tid,
                     comm_column(t.st.comm).c_str(), ms(span), pct(t.st.running_ns, span), pct(t.st.runnable_ns, span),
                     pct(t.st.sleep_ns, span), static_cast<unsigned long long>(t.st.sleep_count),
                     pct(t.st.disk_ns, span), pct(t.st.unknown_ns, span));
        if (fs.gil_sleep_known) std::fprintf(out, " %11.1f", pct(t.gil_sleep_ns.value_or(0), span));
        if (gil_wait) {
            if (t.gil_wait_ns)
                std::fprintf(out, " %8.1f %8.1f %9.1f %9.1f %9.1f", pct(t.no_gil_ns.value_or(0), span),
                             pct(t.gil_hold_ns.value_or(0), span), pct(*t.gil_wait_ns, span),
                             ms(t.gil_hold_ns.value_or(0)), ms(*t.gil_wait_ns));
            else
                std::fprintf(out, " %8s %8s %9s %9s %9s", "-", "-", "-", "-", "-");
        }
        if (several_gils) std::fprintf(out, "  %s", gil_numbers(t.gil_mask).c_str());
        std::fprintf(out, "\n");
    }
    if (hidden) std::fprintf(out, "(%zu threads of processes without GIL events not shown: --all-threads)\n", hidden);
    std::fprintf(out, "\n(* main thread; run = on a CPU, runnable = waiting for a CPU, ?%% = unknown after lost events");
    if (gil_wait) std::fprintf(out, ";\n GIL%% = holds the GIL, GIL-wait%% = in take_gil, no-GIL%% = the rest of the thread's span");
    if (several_gils) std::fprintf(out, ";\n GILs = the process's GILs the thread took (subinterpreters with their own: GIL load lines below)");
    std::fprintf(out, ")\n");
    for (size_t i = 0; i < fs.gil_processes.size(); ++i) {
        const GilProcessStats& p = fs.gil_processes[i];
        const uint64_t span = p.last > p.first ? p.last - p.first : 0;
        // Several GILs in one process: subinterpreters that own theirs (3.12+).
        const bool several = p.index > 0 || (i + 1 < fs.gil_processes.size() && fs.gil_processes[i + 1].pid == p.pid);
        char which[64] = "";
        if (several)
            std::snprintf(which, sizeof which, ", GIL %u at 0x%llx", p.index + 1,
                          static_cast<unsigned long long>(p.address));
        std::fprintf(out,
                     "GIL load of process %d%s: held %.1f%% of %.1f ms, contended %.1f%% (held while others wait), "
                     "up to %u threads waiting\n",
                     p.pid, which, pct(p.held_ns, span), ms(span), pct(p.contended_ns, span), p.max_waiters);
    }
    if (fs.gil_sleep_known)
        std::fprintf(out, "S(GIL)%% = sleeping inside take_gil%s, from %s",
                     fs.stack_stats.py2_gil ? " (Python 2: in PyThread_acquire_lock called by the GIL's takers)" : "",
                     fs.gil_sleep_source.c_str());
    if (fs.gil_sleep_known && fs.gil_sleep_source == "stacks")
        std::fprintf(out, ": %llu sleep stacks unwound to a CPython frame, %llu not (stopped early %llu, failed %llu)",
                     static_cast<unsigned long long>(fs.stack_stats.decided),
                     static_cast<unsigned long long>(fs.stack_stats.stopped_early + fs.stack_stats.failed +
                                                     fs.stack_stats.complete),
                     static_cast<unsigned long long>(fs.stack_stats.stopped_early),
                     static_cast<unsigned long long>(fs.stack_stats.failed));
    if (fs.gil_sleep_known) std::fprintf(out, "\n");
    if (fs.gil_functions_known) print_gil_functions(out, fs);
    if (fs.blame_known) print_blame_table(out, fs);
    if (fs.gil_anomalies.total())
        std::fprintf(out, "GIL anomalies: %llu take without return, %llu return without take, %llu drop without take\n",
                     static_cast<unsigned long long>(fs.gil_anomalies.take_without_return),
                     static_cast<unsigned long long>(fs.gil_anomalies.return_without_take),
                     static_cast<unsigned long long>(fs.gil_anomalies.drop_without_take));
    if (fs.lost_events || fs.lost_samples)
        std::fprintf(out, "lost: %llu events in %llu LOST records, %llu samples dropped\n",
                     static_cast<unsigned long long>(fs.lost_events), static_cast<unsigned long long>(fs.lost_records),
                     static_cast<unsigned long long>(fs.lost_samples));
}

}  // namespace gilscan
