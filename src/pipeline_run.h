// The parts of one analysis (pipeline.h), shared by the files that build
// them (pipeline.cc) and read them out (pipeline_summary.cc). Internal to
// the library.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "gilscan/gil/blame.h"
#include "gilscan/gil/blame_stacks.h"
#include "gilscan/gil/gil_probes.h"
#include "gilscan/gil/gil_stacks.h"
#include "gilscan/gil/reader_stacks.h"
#include "gilscan/output/html_report.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/pftrace_writer.h"
#include "gilscan/output/trace_relay.h"
#include "gilscan/output/trace_writer.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/pipeline.h"
#include "gilscan/sched/timeline.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/preload.h"
#include "gilscan/symbols/process_maps.h"

namespace gilscan::pipeline {

// Who unwinds and labels the sleeps' stacks.
//   OneThread:    -j 1: the stages' thread, as it meets each sleep.
//   ReaderAhead:  -j 2 (and -j 3 and up without --sleep-stacks): the reader
//                 thread too, ahead of the stages while they are behind
//                 (reader_stacks.h), with the binaries preloaded (preload.h).
//                 Only for recordings that can carry stacks.
//   Workers:      -j 3 and up with --sleep-stacks: jobs - 2 workers unwind
//                 and symbolize while the stages' thread decodes. Only then:
//                 labelling a sleep alone (unwinding to its first CPython
//                 frame by cached CFI rules) costs less than copying its
//                 stack to a worker.
//   StagesOnly:   -j 2 and up where stacks cannot help (--gil-evidence
//                 probes, or a file whose attrs carry no user stacks).
enum class StackMode { OneThread, ReaderAhead, Workers, StagesOnly };

struct NullSink final : SpanSink {
    void span(const Span&) override {}
    bool wants_spans() const override { return false; }
};

// Everything one analysis holds, in the order it is built (and so torn down
// in reverse: each part outlives those that point at it).
struct Run {
    explicit Run(const AnalysisOptions& o)
        : opt(o), owned_session(open_session()), session(*owned_session), one_thread(o.jobs <= 1), window(o.window) {
        if (window.active()) session.set_window(&window);
    }
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;

    const AnalysisOptions& opt;
    // gilscan top (AnalysisOptions::on_live): called while a stream is
    // read, once the stages are built (live_ready). Declared before the
    // session, whose constructor already reads the stream.
    bool live_ready = false;
    void live_tick();
    // 1. perfdata: the file, header, features, formats (or a stream's header)
    std::unique_ptr<Session> open_session();
    std::unique_ptr<Session> owned_session;
    Session& session;
    const bool one_thread;
    TimeWindow window;  // --time: anchored by the session at the first sample
    StackMode mode = StackMode::OneThread;
    bool can_have_stacks = false;  // some event records user stacks (or a pipe's events are not known yet)
    // --gil-evidence, read at every sleep.
    const bool only_probes = opt.gil_evidence == "probes", auto_evidence = opt.gil_evidence == "auto";
    // Sleep stacks or GIL functions asked for: read from the stacks even where the uprobes label.
    const bool stack_details = opt.sleep_stacks > 0 || opt.gil_functions;
    SleepLabel details;  // the stack's label, beside the probes' (add_stack_details)

    // 5. output, opened first and committed only when everything worked.
    std::unique_ptr<OutputFile> trace_out;
    NullSink null_sink;
    std::unique_ptr<TraceWriter> trace;
    std::unique_ptr<PftraceWriter> pftrace;  // -o x.pftrace: Perfetto's format instead of JSON
    std::unique_ptr<TraceRelay> relay;
    std::unique_ptr<ReportCollector> report;  // --html
    std::unique_ptr<TeeTraceSink> tee;        // the trace and the report
    TraceSink* trace_sink = nullptr;

    // 3. symbols.
    ProcessMaps maps;
    ModuleOptions mopt;
    std::unique_ptr<ModuleCache> modules;
    RecordedKernel kernel;

    // 4. gil, from stacks: whoever labels the sleeps (StackMode).
    std::shared_ptr<GilStackClassifier::NameCache> names;
    std::unique_ptr<GilStackClassifier> stacks;
    std::unique_ptr<ReaderStacks> ahead;
    std::unique_ptr<ModulePreloader> preloader;
    std::unique_ptr<ParallelStackClassifier> parallel;

    // 2. sched, and 4. gil from uprobes.
    std::unique_ptr<Timeline> timeline;
    std::optional<InOrderTraceSink> in_order;
    std::unique_ptr<GilTracker> gil;
    // 4. gil: blame, after the timeline (it reads the sleeps' labels).
    std::unique_ptr<BlameStacks> blame_stacks;
    std::unique_ptr<GilBlame> blame;


    // What labelled the sleeps.
    bool used_probes = false, used_stacks = false;
    uint64_t fp_chain_sleeps = 0;  // sleeps with a user callchain and no user stack: perf record -g
    StackStats ahead_stats;        // of the labels the reader made and the stages used
};

// 5. The summary: per thread and per GIL, with every warning the run has.
FileSummary summarise(const Run& r);

// gilscan top: every figure up to `now` (pipeline.h, LiveAnalysis).
LiveFigures live_figures(const Run& r, uint64_t now);

}  // namespace gilscan::pipeline
