// The stages read out (pipeline.h): the summary of a finished analysis,
// and gilscan top's figures while one runs.
#include <algorithm>
#include <unordered_map>

#include "pipeline_run.h"

namespace gilscan::pipeline {

namespace {

// The stack classifiers' counts and the binaries they could not use.
void add_stack_warnings(const Run& r, FileSummary& summary) {
    StackStats sst = r.parallel ? r.parallel->stats() : r.stacks->stats();
    sst += r.ahead_stats;
    summary.stack_stats = sst;
    for (const auto& p : r.parallel ? r.parallel->problems() : r.modules->problems())
        summary.warnings.push_back("cannot unwind through " + p);
    for (const auto& p : r.parallel ? r.parallel->perf_map_problems() : r.modules->perf_maps().problems())
        summary.warnings.push_back(p);
    if (sst.stopped_early + sst.failed)
        summary.warnings.push_back(std::to_string(sst.stopped_early + sst.failed) + " of " +
                                   std::to_string(sst.sleeps_seen) +
                                   " sleep stacks could not be unwound to a CPython frame; those sleeps stay \"S\"");
}

// Which evidence labelled the sleeps ("uprobes", "stacks" or ""), and the
// threads' S(GIL) figures when there was any.
std::string add_gil_sleeps(const Run& r, FileSummary& summary) {
    // Stacks that reached no CPython frame (binaries missing) tell nothing.
    // Probes, once seen, decide every later sleep ("auto"): they win.
    std::string evidence_used = r.used_probes ? "uprobes" : r.used_stacks ? "stacks" : "";
    if (evidence_used == "stacks" && summary.stack_stats.decided == 0) evidence_used.clear();
    // perf record -g (frame pointers, perf's default call graph): glibc and
    // CPython before 3.12 are built without them, so a sleep's chain ends
    // in glibc's wait (then addresses read off the stack as if frame
    // records), short of take_gil. Nothing to label from: say what would be.
    if (evidence_used.empty() && r.fp_chain_sleeps)
        summary.warnings.push_back(
            std::to_string(r.fp_chain_sleeps) +
            " sleep(s) carry frame-pointer call chains only (perf record -g): they end in glibc's wait, short of "
            "take_gil, so no sleep is labelled S(GIL). Record --call-graph dwarf on sched:sched_switch "
            "(gilscan record --state --stacks), or the GIL uprobes (gilscan record)");
    if (!evidence_used.empty() && r.timeline->sched_events() > 0) {
        summary.gil_sleep_known = true;
        summary.gil_sleep_source = evidence_used;
        for (auto& t : summary.threads) {
            t.gil_sleep_ns = t.st.gil_sleep_ns;
            t.gil_sleep_count = t.st.gil_sleep_count;
        }
    }
    return evidence_used;
}

// --gil-functions: the table of GIL waits by Python function, or why it is empty.
void add_gil_functions(const Run& r, const std::string& evidence_used, FileSummary& summary) {
    summary.gil_functions_known = true;
    for (auto& f : r.timeline->gil_functions())
        if (r.opt.pids.empty() || r.opt.pids.count(f.tgid)) summary.gil_functions.push_back(std::move(f));
    std::stable_sort(summary.gil_functions.begin(), summary.gil_functions.end(),
                     [](const GilFunctionStats& a, const GilFunctionStats& b) { return a.sleep_ns > b.sleep_ns; });
    if (!r.can_have_stacks)
        summary.warnings.push_back("--gil-functions: no event of the recording has user stacks to find functions "
                                   "in; record sched_switch with --call-graph dwarf (gilscan record --gil-functions), "
                                   "python3 -X perf (3.12+)");
    else if (evidence_used.empty())
        summary.warnings.push_back("--gil-functions: no GIL waits were found; record --call-graph dwarf "
                                   "(gilscan record --gil-functions), python3 -X perf (3.12+)");
    else if (!summary.gil_functions.empty() &&
             std::none_of(summary.gil_functions.begin(), summary.gil_functions.end(),
                          [](const GilFunctionStats& f) { return !f.function.empty(); }))
        summary.warnings.push_back(
            "--gil-functions: no GIL wait's stack reached a Python function named by a perf map or jitdump "
            "(python3 -X perf, 3.12+, writes /tmp/perf-PID.map, -X perf_jit, 3.13+, /tmp/jit-PID.dump; "
            "a take_gil return uretprobe, perf probe's %return, ends them at take_gil)");
}

// GIL blame's rows, and what they could not see, once some thread waited.
void add_blame(const Run& r, FileSummary& summary) {
    const bool inferred = r.blame->inferred();
    if (inferred) {
        summary.blame_waiting_ns = r.blame->waiting_ns();
    } else {
        for (const auto& p : summary.gil_processes) summary.blame_waiting_ns[p.pid] += p.waiting_ns;
    }
    uint64_t waiting = 0;
    for (const auto& [pid, ns] : summary.blame_waiting_ns)
        if (r.opt.pids.empty() || r.opt.pids.count(pid)) waiting += ns;
    if (waiting == 0) return;  // no thread waited for a GIL: nothing to blame
    summary.blame_known = true;
    summary.blame_inferred = inferred;
    summary.blame_top = r.opt.blame_top;
    for (auto& row : blame_rows(r.blame->charges(), *r.blame_stacks, inferred))
        if (r.opt.pids.empty() || r.opt.pids.count(row.pid)) summary.gil_blame.push_back(std::move(row));
    if (r.blame->cpu_samples() == 0)
        summary.warnings.push_back("GIL blame: no CPU samples, so on-CPU holders are not named by function (record "
                                   "cpu-clock with --call-graph dwarf: gilscan record --blame)");
    else if (!r.blame_stacks->named_python())
        summary.warnings.push_back("GIL blame: no stack reached a Python function's name, so native frames alone are "
                                   "blamed (CPython 3.12+: python3 -X perf, or PYTHONPERFSUPPORT=1; 3.13: -X perf_jit)");
    if (inferred && r.blame->unattributed_ns())
        summary.warnings.push_back("GIL blame: " + std::to_string(r.blame->unattributed_ns() / 1000) +
                                   " us of waiting after the last hand-off seen have no holder inferred");
}

}  // namespace

// 5. The summary: per thread and per GIL, with every warning the run has.
FileSummary summarise(const Run& r) {
    FileSummary summary = build_summary(r.session, r.timeline->threads(), r.opt.pids, r.gil.get(), r.timeline->cpu_wide());
    add_stack_warnings(r, summary);
    const std::string evidence_used = add_gil_sleeps(r, summary);
    if (r.opt.gil_functions) add_gil_functions(r, evidence_used, summary);
    if (r.blame) add_blame(r, summary);
    else if (r.opt.blame && std::any_of(summary.gil_processes.begin(), summary.gil_processes.end(),
                                        [](const GilProcessStats& p) { return p.contended_ns > 0; }))
        summary.warnings.push_back("GIL blame: no event of the recording has user stacks, so holders cannot be named "
                                   "(record CPU samples and sched_switch with --call-graph dwarf: gilscan record "
                                   "--blame)");
    if (r.timeline->decoder().field_errors())
        summary.warnings.push_back(std::to_string(r.timeline->decoder().field_errors()) +
                                   " tracepoint sample(s) too short for their format");
    // VizTracer's timestamps are CLOCK_MONOTONIC's (its own clock calibrated to it).
    if (r.opt.trace.viztracer && !r.opt.output.empty() && summary.clock != "CLOCK_MONOTONIC")
        summary.warnings.push_back("--viztracer: the recording's clock is " + summary.clock +
                                   ", not VizTracer's: the two traces will not line up in time (record with "
                                   "perf record -k CLOCK_MONOTONIC, as gilscan record does)");
    if (r.timeline->sched_events() == 0 && !r.gil->seen_probes())
        summary.warnings.push_back("no sched:sched_switch / sched_waking / sched_wakeup events: "
                                   "record them to see thread states");
    return summary;
}

void Run::live_tick() {
    if (!live_ready || !opt.on_live) return;
    struct View final : LiveAnalysis {
        const Run& r;
        explicit View(const Run& run) : r(run) {}
        LiveFigures figures(uint64_t now) const override { return live_figures(r, now); }
    };
    opt.on_live(View(*this));
}

// The timeline's threads (those recorded: monitored), with their GIL waits
// and holds from the uprobes (without them, waits from the sleeps' stacks);
// the GILs; blame's rows.
LiveFigures live_figures(const Run& r, uint64_t now) {
    // The stages have every record up to their latest event (records come
    // in time order), and up to the moment the stream is known to be
    // delivered (perf's flushes, Session::delivered_to): the figures are
    // exact up to the later of the two, not past `now`. Open states count
    // up to that moment.
    const uint64_t latest = r.timeline->latest();
    now = std::max(latest, std::min(now, r.session.delivered_to()));
    LiveFigures f;
    f.time = now;
    f.gil_probes = r.gil->seen_probes();
    f.lost_events = r.session.stats().lost_events;
    const std::vector<GilThreadStats> gil_threads = r.gil->live_threads(now);
    std::unordered_map<int32_t, const GilThreadStats*> gil_of;
    for (const GilThreadStats& g : gil_threads) gil_of[g.tid] = &g;
    auto wanted = [&r](int32_t pid) { return r.opt.pids.empty() || r.opt.pids.count(pid) > 0; };
    for (const Timeline::LiveThread& t : r.timeline->live(now)) {
        if (!t.st.monitored || !wanted(t.st.tgid)) continue;
        if (!f.start || t.st.first_seen < f.start) f.start = t.st.first_seen;
        LiveThreadFigures& x = f.threads.emplace_back(t.st, t.alive);
        if (!f.gil_probes) {
            x.gil_wait_ns = t.st.gil_sleep_ns;
        } else if (auto it = gil_of.find(t.st.tid); it != gil_of.end()) {
            x.gil_hold_ns = it->second->hold_ns;
            x.gil_wait_ns = it->second->wait_ns;
        }
    }
    for (const GilTracker::LiveGil& g : r.gil->live_gils(now)) {
        if (!wanted(g.st.pid)) continue;
        f.gils.push_back({g.st.pid, g.st.index, g.st.held_ns, g.st.contended_ns, g.st.waiting_ns, g.holder, g.waiters});
    }
    if (r.blame) {
        f.blame = true;
        for (BlameRow& row : blame_rows(r.blame->charges(), *r.blame_stacks, r.blame->inferred()))
            if (wanted(row.pid)) f.blame_rows.push_back(std::move(row));
    }
    return f;
}

}  // namespace gilscan::pipeline
