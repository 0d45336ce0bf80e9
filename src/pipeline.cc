// The stages in order, for one recording (docs/design.md, "The stages"):
// perfdata -> sched -> symbols -> gil -> output. analyse_recording builds
// them into one Run, reads every record through them, and turns what they
// found into the summary and the trace.
#include "gilscan/pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "gilscan/output/blame_report.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/symbols/name_store.h"
#include "pipeline_run.h"

namespace gilscan {

namespace pipeline {

// 1. The recording: a file, or (gilscan top) perf's stream as it comes,
// each of whose reads lets the live view look at the stages.
std::unique_ptr<Session> Run::open_session() {
    if (opt.input_fd < 0) return std::make_unique<Session>(opt.input);
    std::function<uint64_t()> flushed;
    if (opt.stream_flushed) flushed = [f = opt.stream_flushed] { return f->load(std::memory_order_acquire); };
    return std::make_unique<Session>(opt.display_name.empty() ? "perf record's output" : opt.display_name,
                                     MappedFile::Stream{opt.input_fd, [this](uint64_t) { live_tick(); }},
                                     std::move(flushed));
}

}  // namespace pipeline

namespace {

using namespace pipeline;

// A CALLCHAIN with user frames: PERF_CONTEXT_USER and an address after it.
bool has_user_callchain(const Sample& s) {
    for (size_t i = 0; i + 1 < s.callchain.size(); ++i)
        if (s.callchain[i] == PERF_CONTEXT_USER) return s.callchain[i + 1] < PERF_CONTEXT_MAX;
    return false;
}

bool has_gil_probes(const Session& session) {
    for (const auto& ev : session.events())
        if (is_gil_probe(ev.gil_kind)) return true;
    return false;
}

// 1. The threads: -j 1 reads records inline; -j 2 and up read them on a
// reader thread (for data sections from 4 MiB).
void plan_threads(Run& r) {
    if (r.opt.progress) r.session.set_progress(r.opt.progress);
    if (r.one_thread) r.session.set_threaded(false);
    else if (r.opt.reader_thread) r.session.set_threaded(*r.opt.reader_thread);
    // A cache entry made during this run inflates on both threads from -j 2.
    set_debuginfo_cache(r.opt.debuginfo_cache, r.one_thread ? 1 : 2);
    // Pipe mode's attrs are not known yet, a file's are.
    bool& can_have_stacks = r.can_have_stacks;
    can_have_stacks = r.session.header().pipe;
    for (const auto& ev : r.session.events()) can_have_stacks |= (ev.attr.sample_type & PERF_SAMPLE_STACK_USER) != 0;
    if (r.one_thread) r.mode = StackMode::OneThread;
    // Blame reads each sleep's label at its switch-out, and GIL uprobes'
    // labels take the stack's details there (add_stack_details): -j
    // workers' labels come later.
    else if (r.opt.jobs > 2 && r.opt.sleep_stacks > 0 && !r.opt.blame && !(r.opt.gil_evidence != "stacks" && has_gil_probes(r.session)))
        r.mode = StackMode::Workers;
    else if (r.opt.gil_evidence != "probes" && can_have_stacks) r.mode = StackMode::ReaderAhead;
    else r.mode = StackMode::StagesOnly;
}

PftraceSystem pftrace_system(const Session& s) {
    const Features& f = s.features();
    return {f.os_release, f.arch, f.nr_cpus_online};
}

// 5. The trace's file and writer, opened up front; from -j 2 a JSON trace's
// events are formatted by the reader thread while it would wait, a
// .pftrace's (the scheduler's events included) by a thread of the relay's
// own (trace_relay.h).
void open_trace(Run& r) {
    if (is_pftrace_name(r.opt.output)) {
        r.trace_out = std::make_unique<OutputFile>(r.opt.output, !r.one_thread);
        r.pftrace = std::make_unique<PftraceWriter>(*r.trace_out, r.opt.trace, pftrace_system(r.session));
        r.trace_sink = r.pftrace.get();
        if (!r.one_thread) {
            r.relay = std::make_unique<TraceRelay>(*r.pftrace, r.pftrace->filter(), r.pftrace.get());
            r.relay->start_thread();
            r.trace_sink = r.relay.get();
        }
    } else if (!r.opt.output.empty()) {
        r.trace_out = std::make_unique<OutputFile>(r.opt.output, !r.one_thread);
        r.trace = std::make_unique<TraceWriter>(*r.trace_out, r.opt.trace);
        r.trace_sink = r.trace.get();
        if (!r.one_thread) {
            r.relay = std::make_unique<TraceRelay>(*r.trace);
            r.session.set_reader_idle([relay = r.relay.get()] { return relay->format_some(); });
            r.trace_sink = r.relay.get();
        }
    }
    if (r.opt.html.empty()) return;  // --html: the report's collector beside the trace
    r.report = std::make_unique<ReportCollector>();
    if (r.trace_sink) r.tee = std::make_unique<TeeTraceSink>(*r.trace_sink, *r.report);
    r.trace_sink = r.tee ? static_cast<TraceSink*>(r.tee.get()) : r.report.get();
}

// 3. Symbols: the binaries the recording names, its kernel, the perf maps.
void open_symbols(Run& r) {
    r.mopt.symfs = r.opt.symfs;
    r.mopt.perf_maps = r.opt.perf_maps;
    // perf writes the recording as the user it records for: that user's
    // perf maps are read, and root's, no one else's.
    if (r.opt.perf_map_owner >= 0) r.mopt.perf_map_owner = static_cast<uid_t>(r.opt.perf_map_owner);
    else if (struct stat st {}; ::stat(r.opt.input.c_str(), &st) == 0) r.mopt.perf_map_owner = st.st_uid;
    for (const auto& b : r.session.features().build_ids) r.mopt.build_ids[b.filename] = to_hex(b.build_id);
    // Frame names kept from earlier runs, in the cache directory (name_store.h).
    if (!r.opt.debuginfo_cache.empty()) r.mopt.name_store = std::make_shared<NameStore>(r.opt.debuginfo_cache);
    r.modules = std::make_unique<ModuleCache>(r.mopt);
    // The recording's kernel, for naming kernel frames: its identity from
    // the header, its maps as the records come.
    r.kernel = recorded_kernel(r.session.features());
    r.maps.set_kernel_log(r.kernel.maps);
}

// 4. Who labels sleeps from their stacks (StackMode). The stages' own
// classifier always exists: with workers it is unused and reads no kernel
// symbols.
void build_stack_labels(Run& r) {
    const bool workers = r.mode == StackMode::Workers;
    // AnalysisOptions::reader_stacks false: the binaries preloaded, no
    // labels made ahead (tests).
    const bool ahead = r.mode == StackMode::ReaderAhead && r.opt.reader_stacks.value_or(true);
    // The reader's classifier and the stages' share frame names; each names
    // the frames it meets first through its own Dwfl, at the same time as
    // the other (no shared symbolizer: see NameCache::pending).
    if (ahead) r.names = std::make_shared<GilStackClassifier::NameCache>(r.kernel, r.opt.sleep_stacks > 0);
    r.stacks = std::make_unique<GilStackClassifier>(&r.maps, *r.modules, workers ? 0 : r.opt.sleep_stacks, r.kernel,
                                                    r.names, !r.one_thread);
    if (ahead) {
        r.ahead = std::make_unique<ReaderStacks>(*r.modules, r.names, r.opt.sleep_stacks, r.kernel, r.session.swap(),
                                                 r.opt.gil_evidence == "auto");
        if (r.opt.reader_stacks) {
            r.ahead->set_always(*r.opt.reader_stacks);
            r.ahead->set_wait(*r.opt.reader_stacks);  // forced on (tests): every sleep the reader's, deterministically
        }
        r.session.set_reader_stage(r.ahead.get());
    }
    if (r.mode == StackMode::ReaderAhead) {
        // The binaries the stages will unwind through, loaded while they
        // wait for the reader's first records (preload.h). -j 3 and up: the
        // workers have module caches of their own.
        r.preloader = std::make_unique<ModulePreloader>(*r.modules);
        r.session.set_mmap_seen([p = r.preloader.get()](const MmapEvent& e) { return p->on_mmap(e); });
        r.session.set_stages_idle([p = r.preloader.get()] { return p->work(); });
    }
    if (workers)
        r.parallel = std::make_unique<ParallelStackClassifier>(r.opt.jobs - 2, r.mopt, r.opt.sleep_stacks, r.kernel);
}

// With the GIL uprobes as the evidence, a sleep's stack still gives what
// was asked of it: --sleep-stacks' stack and --gil-functions' Python
// function (take_gil's return is a plain probe, so the stack reaches past
// it: exit_sites.h). The probes' label stands; only those two are taken.
void add_stack_details(Run& r, const Sample& s, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
    SleepLabel& d = r.details;
    if (const ReaderStacks::Note* n = ReaderStacks::note_of(s)) {
        d = n->label;
    } else {
        d.clear();
        d.text = false;
        r.stacks->classify(s, ev, ps, d);
    }
    std::swap(label.stack_json, d.stack_json);
    label.stack_shared = d.stack_shared;
    if (label.gil && d.gil) label.function = d.function;
}

// The label of one sleep, at its switch-out into S or D: by the GIL
// uprobes once seen ("auto") or when asked, else from its stack by whoever
// StackMode says. Nothing here allocates.
void label_sleep(Run& r, const Sample& s, const EventInfo& ev, const PrevState& ps, SleepLabel& label,
                 const SleepClassifier& by_probes) {
    if (r.only_probes || (r.auto_evidence && r.gil->seen_probes())) {
        r.used_probes |= r.gil->seen_probes();
        by_probes(s, ev, ps, label);
        if (r.stack_details && ps.cls == StateClass::Sleeping && s.regs_user_abi != 0 && !s.stack_user.empty())
            add_stack_details(r, s, ev, ps, label);
        return;
    }
    if (s.regs_user_abi == 0 || s.stack_user.empty()) {
        if (ps.cls == StateClass::Sleeping && has_user_callchain(s)) ++r.fp_chain_sleeps;
        return;
    }
    r.used_stacks = true;
    if (r.parallel) {
        if (ps.cls == StateClass::Sleeping) label.ticket = r.parallel->submit(r.maps.snapshot(s.pid), s);
        return;
    }
    if (const ReaderStacks::Note* n = ReaderStacks::note_of(s)) {  // the reader got there first
        label = n->label;  // copied into the thread's label: its strings keep their capacity
        r.ahead_stats += n->delta;
        ++r.ahead_stats.from_reader;
        return;
    }
    r.stacks->classify(s, ev, ps, label);
}

// 2. and 4. The per-thread state machines and the GIL tracker. The tracker
// sees each event before the timeline, so a switch-out knows whether its
// thread is inside take_gil.
void build_timeline(Run& r) {
    r.timeline = std::make_unique<Timeline>(r.session, r.trace_sink ? static_cast<SpanSink&>(*r.trace_sink) : r.null_sink);
    // With workers, spans wait for their labels: the GIL tracker's events wait with them.
    if (r.parallel && r.trace_sink) r.in_order.emplace(*r.timeline, *r.trace_sink);
    if (r.pftrace) r.timeline->set_sched_tap(r.relay ? static_cast<SchedTap*>(r.relay.get()) : r.pftrace.get());
    r.gil = std::make_unique<GilTracker>(r.in_order ? &*r.in_order : r.trace_sink, r.session.swap());
    // Labels made off the timeline carry texts only when the timeline reads
    // them (SleepLabel::text), as its own do.
    if (r.ahead) r.ahead->set_text(r.timeline->spans_wanted());
    if (r.parallel) r.parallel->set_text(r.timeline->spans_wanted());
    if (r.opt.gil_functions) {
        r.stacks->set_gil_functions(true);
        if (r.ahead) r.ahead->set_gil_functions(true);
        if (r.parallel) r.parallel->set_gil_functions(true);
        r.timeline->set_gil_functions(true);
    }
    r.timeline->set_classifier(
        [&r, by_probes = gil_probe_classifier(*r.gil)](const Sample& s, const EventInfo& ev, const PrevState& ps,
                                                       SleepLabel& label) { label_sleep(r, s, ev, ps, label, by_probes); });
    if (r.window.active()) {
        r.timeline->set_window(&r.window);
        r.gil->set_window(&r.window);
    }
    if (r.parallel) r.timeline->set_resolver([&r](int64_t t, bool wait) { return r.parallel->resolve(t, wait); });
    // Blame names holders by their stacks: a recording without any has
    // nothing to name them by (add_blame says so).
    if (r.opt.blame && r.can_have_stacks) {
        r.blame_stacks = std::make_unique<BlameStacks>(*r.modules);
        const bool folded = !r.opt.blame_folded.empty() || !r.opt.wait_folded.empty() || !r.opt.html.empty();
        r.blame_stacks->set_full_stacks(folded);
        r.blame_stacks->set_live(r.opt.input_fd >= 0);  // gilscan top: the perf maps still grow
        r.blame = std::make_unique<GilBlame>(r.maps, *r.blame_stacks);
        r.blame->set_wait_stacks(!r.opt.wait_folded.empty() || !r.opt.html.empty());
        if (r.window.active()) r.blame->set_window(&r.window);
        r.gil->set_listener(r.blame.get());
        r.timeline->set_observer(r.blame.get());
    }
}

// Every record, in time order, through process maps, GIL tracker and timeline.
void read_records(Run& r) {
    if (r.blame) {
        FanOutOf<ProcessMaps, GilTracker, Timeline, GilBlame> stages(r.maps, *r.gil, *r.timeline, *r.blame);
        r.session.run(stages);
    } else {
        FanOutOf<ProcessMaps, GilTracker, Timeline> stages(r.maps, *r.gil, *r.timeline);
        r.session.run(stages);
    }
    const uint64_t end = r.session.stats().last_time;
    r.gil->finish(end);
    r.timeline->finish(end);
    if (r.blame) r.blame->finish(end);
    if (r.parallel) r.parallel->finish();
    if (r.relay) r.relay->close();  // every event formatted: the writer is this thread's again
    if (r.mopt.name_store) r.mopt.name_store->save();  // the names this run gave libdw's answers for
}
// 5. The trace's last events (track names, metadata), then the file in place.
void write_trace(Run& r, const FileSummary& summary) {
    if (r.pftrace) {
        r.pftrace->finish(r.timeline->threads(), pftrace_system(r.session));
        r.trace_out->commit();
    }
    if (!r.trace) return;
    TraceMeta meta;
    meta.source_file = r.opt.display_name.empty() ? r.opt.input : r.opt.display_name;
    meta.clock = summary.clock;
    meta.hostname = summary.hostname;
    meta.cmdline = summary.cmdline;
    for (const auto& p : summary.gil_processes) {
        meta.holder_tracks.push_back({p.pid, gil_track_tid(p.pid, p.index),
                                      p.index ? "GIL holder (GIL " + std::to_string(p.index + 1) + ")" : "GIL holder"});
        meta.python_pids.insert(p.pid);
    }
    for (const ThreadSummary& t : summary.threads) {
        if (t.gil_wait_ns.value_or(0) || t.gil_hold_ns.value_or(0)) meta.gil_rows.push_back({t.st.tgid, t.st.tid});
        // A process VizTracer ran is Python too (its comm is the script's name).
        if (t.gil_sleep_count.value_or(0) || t.st.comm.starts_with("python") || t.st.comm == "viztracer")
            meta.python_pids.insert(t.st.tgid);
    }
    r.trace->finish(r.timeline->threads(), meta);
    r.trace_out->commit();
}

// 5. Folded stacks of blame (contended hold) and of the waits, made once for
// their files and the HTML report; with no stacks to fold (add_blame's
// warning), the files asked for are written empty.
void write_folded_and_report(const Run& r, const FileSummary& summary) {
    if (r.opt.blame_folded.empty() && r.opt.wait_folded.empty() && !r.report) return;
    auto [blame, waits] = folded_stacks(r.blame.get(), r.blame_stacks.get(), summary, r.opt.pids);
    if (!r.opt.blame_folded.empty()) write_folded(r.opt.blame_folded, blame);
    if (!r.opt.wait_folded.empty()) write_folded(r.opt.wait_folded, waits);
    if (!r.report) return;
    ReportInputs in{summary, *r.report, std::move(waits), std::move(blame),
                    pythons_mapped(r.maps, summary), r.session.features().nr_cpus_online};
    write_html_report(r.opt.html, in);
}

}  // namespace

unsigned all_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

FileSummary analyse_recording(const AnalysisOptions& opt) {
    Run r(opt);                // 1. perfdata: the file, header, features, formats
    plan_threads(r);
    open_trace(r);             // 5. output: opened now, committed at the end
    open_symbols(r);           // 3. symbols
    build_stack_labels(r);     // 4. gil, from stacks
    build_timeline(r);         // 2. sched, and 4. gil from uprobes
    r.live_ready = true;       // gilscan top may look at the stages from here
    read_records(r);           // every record through the stages
    FileSummary summary = summarise(r);  // 5. output: the summary
    write_trace(r, summary);             // 5. output: the trace, committed
    write_folded_and_report(r, summary); // 5. output: folded stacks, the HTML report
    if (!opt.display_name.empty()) summary.file = opt.display_name;
    if (opt.on_complete) opt.on_complete(summary);
    return summary;
}

}  // namespace gilscan
