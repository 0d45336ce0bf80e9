#include "gilscan/pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/gil/gil_probes.h"
#include "gilscan/gil/gil_stacks.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/name_store.h"
#include "gilscan/output/output_file.h"
#include "gilscan/symbols/preload.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/gil/reader_stacks.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/timeline.h"
#include "gilscan/output/trace_relay.h"
#include "gilscan/output/trace_writer.h"

namespace gilscan {

namespace {

// A CALLCHAIN with user frames: PERF_CONTEXT_USER and an address after it.
bool has_user_callchain(const Sample& s) {
    for (size_t i = 0; i + 1 < s.callchain.size(); ++i)
        if (s.callchain[i] == PERF_CONTEXT_USER) return s.callchain[i + 1] < PERF_CONTEXT_MAX;
    return false;
}

}  // namespace

unsigned all_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

FileSummary analyse_recording(const AnalysisOptions& opt) {
    // 1-2. File, header, features, tracing formats; records in time order.
    Session session(opt.input);
    if (opt.progress) session.set_progress(opt.progress);

    // -j 1: everything on this one thread (records read inline, the trace
    // written as it is made, kernel symbols read when first needed). -j 2
    // and up: the reader thread (for data sections from 4 MiB), a thread
    // that writes the trace, and kernel symbols read in the background.
    const bool one_thread = opt.jobs <= 1;
    if (one_thread) session.set_threaded(false);
    else if (opt.reader_thread) session.set_threaded(*opt.reader_thread);
    // A cache entry made during this run inflates on both threads from -j 2.
    set_debuginfo_cache(opt.debuginfo_cache, one_thread ? 1 : 2);

    // Outputs are opened up front but only committed when everything worked.
    std::unique_ptr<OutputFile> trace_out;
    if (!opt.output.empty()) trace_out = std::make_unique<OutputFile>(opt.output, !one_thread);
    struct NullSink : SpanSink {
        void span(const Span&) override {}
        bool wants_spans() const override { return false; }
    } null_sink;
    std::unique_ptr<TraceWriter> trace;
    if (trace_out) trace = std::make_unique<TraceWriter>(*trace_out, opt.trace);
    // From -j 2 the events are formatted by the reader thread while it
    // would wait for the stages (trace_relay.h).
    std::unique_ptr<TraceRelay> relay;
    if (trace && !one_thread) {
        relay = std::make_unique<TraceRelay>(*trace);
        session.set_reader_idle([r = relay.get()] { return r->format_some(); });
    }
    TraceSink* const trace_sink = relay ? static_cast<TraceSink*>(relay.get()) : trace.get();

    // 3-7. Process maps, binaries and unwinding, GIL uprobes, then the
    // per-thread state machines. The GIL tracker sees each event before the
    // timeline, so a switch-out knows whether its thread is inside take_gil.
    ProcessMaps maps;
    ModuleOptions mopt;
    mopt.symfs = opt.symfs;
    mopt.perf_maps = opt.perf_maps;
    // perf writes the recording as the user it records for: that user's
    // perf maps are read, and root's, no one else's.
    if (struct stat st {}; ::stat(opt.input.c_str(), &st) == 0) mopt.perf_map_owner = st.st_uid;
    for (const auto& b : session.features().build_ids) mopt.build_ids[b.filename] = to_hex(b.build_id);
    // Frame names kept from earlier runs, in the cache directory (name_store.h).
    if (!opt.debuginfo_cache.empty()) mopt.name_store = std::make_shared<NameStore>(opt.debuginfo_cache);
    ModuleCache modules(mopt);
    // The recording's kernel, for naming kernel frames: its identity from
    // the header, its maps as the records come.
    const RecordedKernel kernel = recorded_kernel(session.features());
    maps.set_kernel_log(kernel.maps);
    // -j 3 and up with --sleep-stacks: sleep stacks unwound and symbolized
    // on jobs - 2 workers while this thread decodes (the reader being the
    // second thread). Only for --sleep-stacks: classifying a sleep alone
    // (unwinding to its first CPython frame by cached CFI rules) takes about
    // a microsecond, less than copying its stack to a worker.
    const bool workers = opt.jobs > 2 && opt.sleep_stacks > 0;
    // -j 2 (and -j 3 and up without --sleep-stacks): the reader thread
    // classifies sleeps too while the stages are behind (reader_stacks.h).
    // Only for recordings that can carry stacks: pipe mode's attrs are not
    // known yet, a file's are.
    bool can_have_stacks = session.header().pipe;
    for (const auto& ev : session.events()) can_have_stacks |= (ev.attr.sample_type & PERF_SAMPLE_STACK_USER) != 0;
    const bool reader_stacks = !one_thread && !workers && opt.gil_evidence != "probes" && can_have_stacks &&
                               opt.reader_stacks.value_or(true);
    // The two classifiers share frame names; each names the frames it meets
    // first through its own Dwfl, at the same time as the other (no shared
    // symbolizer: see NameCache::pending).
    std::shared_ptr<GilStackClassifier::NameCache> names;
    if (reader_stacks)
        names = std::make_shared<GilStackClassifier::NameCache>(kernel, opt.sleep_stacks > 0);
    // (With workers this one is unused, and reads no kernel symbols.)
    GilStackClassifier stacks(&maps, modules, workers ? 0 : opt.sleep_stacks, kernel,
                              names, !one_thread);
    std::unique_ptr<ReaderStacks> ahead;
    if (reader_stacks) {
        ahead = std::make_unique<ReaderStacks>(modules, names, opt.sleep_stacks, kernel,
                                               session.swap(), opt.gil_evidence == "auto");
        if (opt.reader_stacks) {
            ahead->set_always(*opt.reader_stacks);
            ahead->set_wait(*opt.reader_stacks);  // forced on (tests): every sleep the reader's, deterministically
        }
        session.set_reader_stage(ahead.get());
    }
    StackStats ahead_stats;  // of the labels the reader made and the stages used

    // The binaries the stages will unwind through, loaded while they wait
    // for the reader's first records (preload.h). -j 3 and up: the workers
    // have module caches of their own.
    std::unique_ptr<ModulePreloader> preloader;
    if (!one_thread && !workers && opt.gil_evidence != "probes" && can_have_stacks) {
        preloader = std::make_unique<ModulePreloader>(modules);
        session.set_mmap_seen([p = preloader.get()](const MmapEvent& e) { return p->on_mmap(e); });
        session.set_stages_idle([p = preloader.get()] { return p->work(); });
    }

    std::unique_ptr<ParallelStackClassifier> parallel;
    if (workers)
        parallel = std::make_unique<ParallelStackClassifier>(opt.jobs - 2, mopt, opt.sleep_stacks,
                                                             kernel);
    Timeline timeline(session, trace_sink ? static_cast<SpanSink&>(*trace_sink) : null_sink);
    // With workers, spans wait for their labels: the GIL tracker's events wait with them.
    std::optional<InOrderTraceSink> in_order;
    if (parallel && trace_sink) in_order.emplace(timeline, *trace_sink);
    GilTracker gil(in_order ? &*in_order : trace_sink, session.swap());
    // Labels made off the timeline carry texts only when the timeline reads
    // them (SleepLabel::text), as its own do.
    if (ahead) ahead->set_text(timeline.spans_wanted());
    if (parallel) parallel->set_text(timeline.spans_wanted());
    if (opt.gil_functions) {
        stacks.set_gil_functions(true);
        if (ahead) ahead->set_gil_functions(true);
        if (parallel) parallel->set_gil_functions(true);
        timeline.set_gil_functions(true);
    }
    auto by_probes = gil_probe_classifier(gil);
    // Called at every switch-out into S or D: nothing here allocates.
    const bool only_probes = opt.gil_evidence == "probes", auto_evidence = opt.gil_evidence == "auto";
    bool used_probes = false, used_stacks = false;
    uint64_t fp_chain_sleeps = 0;  // sleeps with a user callchain and no user stack: perf record -g
    timeline.set_classifier([&](const Sample& s, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        if (only_probes || (auto_evidence && gil.seen_probes())) {
            used_probes |= gil.seen_probes();
            by_probes(s, ev, ps, label);
            return;
        }
        if (s.regs_user_abi == 0 || s.stack_user.empty()) {
            if (ps.cls == StateClass::Sleeping && has_user_callchain(s)) ++fp_chain_sleeps;
            return;
        }
        used_stacks = true;
        if (parallel) {
            if (ps.cls == StateClass::Sleeping) label.ticket = parallel->submit(maps.snapshot(s.pid), s);
            return;
        }
        if (const ReaderStacks::Note* n = ReaderStacks::note_of(s)) {  // the reader got there first
            label = n->label;  // copied into the thread's label: its strings keep their capacity
            ahead_stats += n->delta;
            ++ahead_stats.from_reader;
            return;
        }
        stacks.classify(s, ev, ps, label);
    });
    if (parallel) timeline.set_resolver([&](int64_t t, bool wait) { return parallel->resolve(t, wait); });
    FanOutOf<ProcessMaps, GilTracker, Timeline> stages(maps, gil, timeline);
    session.run(stages);
    const uint64_t end = session.stats().last_time;
    gil.finish(end);
    timeline.finish(end);
    if (parallel) parallel->finish();
    if (relay) relay->close();  // every event formatted: the writer is this thread's again
    if (mopt.name_store) mopt.name_store->save();  // the names this run gave libdw's answers for

    // 8. Outputs.
    const auto threads = timeline.threads();
    FileSummary summary = build_summary(session, threads, opt.pids, &gil, timeline.cpu_wide());
    StackStats sst = parallel ? parallel->stats() : stacks.stats();
    sst += ahead_stats;
    summary.stack_stats = sst;
    for (const auto& p : parallel ? parallel->problems() : modules.problems())
        summary.warnings.push_back("cannot unwind through " + p);
    for (const auto& p : parallel ? parallel->perf_map_problems() : modules.perf_maps().problems())
        summary.warnings.push_back(p);
    if (sst.stopped_early + sst.failed)
        summary.warnings.push_back(std::to_string(sst.stopped_early + sst.failed) + " of " +
                                   std::to_string(sst.sleeps_seen) +
                                   " sleep stacks could not be unwound to a CPython frame; those sleeps stay \"S\"");
    // Stacks that reached no CPython frame (binaries missing) tell nothing.
    // Probes, once seen, decide every later sleep ("auto"): they win.
    std::string evidence_used = used_probes ? "uprobes" : used_stacks ? "stacks" : "";
    if (evidence_used == "stacks" && sst.decided == 0) evidence_used.clear();
    // perf record -g (frame pointers, perf's default call graph): glibc and
    // CPython before 3.12 are built without them, so a sleep's chain ends
    // in glibc's wait (then addresses read off the stack as if frame
    // records), short of take_gil. Nothing to label from: say what would be.
    if (evidence_used.empty() && fp_chain_sleeps)
        summary.warnings.push_back(
            std::to_string(fp_chain_sleeps) +
            " sleep(s) carry frame-pointer call chains only (perf record -g): they end in glibc's wait, short of "
            "take_gil, so no sleep is labelled S(GIL). Record --call-graph dwarf on sched:sched_switch "
            "(gilscan record --state --stacks), or the GIL uprobes (gilscan record)");
    if (!evidence_used.empty() && timeline.sched_events() > 0) {
        summary.gil_sleep_known = true;
        summary.gil_sleep_source = evidence_used;
        for (auto& t : summary.threads) {
            t.gil_sleep_ns = t.st.gil_sleep_ns;
            t.gil_sleep_count = t.st.gil_sleep_count;
        }
    }
    if (opt.gil_functions) {
        summary.gil_functions_known = true;
        for (auto& f : timeline.gil_functions())
            if (opt.pids.empty() || opt.pids.count(f.tgid)) summary.gil_functions.push_back(std::move(f));
        std::stable_sort(summary.gil_functions.begin(), summary.gil_functions.end(),
                         [](const GilFunctionStats& a, const GilFunctionStats& b) { return a.sleep_ns > b.sleep_ns; });
        if (evidence_used != "stacks")
            summary.warnings.push_back(
                "--gil-functions: no GIL waits were found from stacks" +
                std::string(evidence_used == "uprobes" ? " (sleeps were classified by the GIL uprobes; "
                                                         "--gil-evidence stacks reads the stacks)"
                                                       : "") +
                "; record --call-graph dwarf without take_gil return uprobes, python3 -X perf (3.12+)");
        else if (!summary.gil_functions.empty() && std::none_of(summary.gil_functions.begin(), summary.gil_functions.end(),
                              [](const GilFunctionStats& f) { return !f.function.empty(); }))
            summary.warnings.push_back(
                "--gil-functions: no GIL wait's stack reached a Python function named by a perf map or jitdump "
                "(python3 -X perf, 3.12+, writes /tmp/perf-PID.map, -X perf_jit, 3.13+, /tmp/jit-PID.dump; "
                "take_gil return uprobes end the stacks early)");
    }
    if (timeline.decoder().field_errors())
        summary.warnings.push_back(std::to_string(timeline.decoder().field_errors()) +
                                   " tracepoint sample(s) too short for their format");
    if (timeline.sched_events() == 0 && !gil.seen_probes())
        summary.warnings.push_back("no sched:sched_switch / sched_waking / sched_wakeup events: "
                                   "record them to see thread states");
    if (trace) {
        for (const auto& p : summary.gil_processes)
            trace->name_thread(p.pid, gil_track_tid(p.pid, p.index),
                               p.index ? "GIL holder (GIL " + std::to_string(p.index + 1) + ")" : "GIL holder");
        TraceMeta meta{opt.display_name.empty() ? opt.input : opt.display_name, summary.clock, summary.hostname,
                       summary.cmdline};
        trace->finish(threads, meta);
        trace_out->commit();
    }
    if (!opt.display_name.empty()) summary.file = opt.display_name;
    if (opt.on_complete) opt.on_complete(summary);
    return summary;
}

}  // namespace gilscan
