// gilscan — where the GIL costs a Python program, from perf.data.
//
//   gilscan perf.data -o trace.json [--summary-json s.json] [--running]
//
// main reads as the ordered list of stages: file/header/features and records
// (Session) -> tracepoint formats and thread state machines (Timeline) ->
// outputs (TraceWriter, summary).
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "gilscan/pipeline.h"
#include "gilscan/cli/options.h"
#include "gilscan/cli/batch.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/error.h"
#include "gilscan/output/output_file.h"
#include "gilscan/cli/probe.h"
#include "gilscan/cli/record.h"
#include "gilscan/output/summary.h"
#include "gilscan/output/temp_files.h"

namespace {

constexpr const char* kUsage = R"(usage: gilscan FILE [options]
       gilscan probe [--print] [--remove] [PYTHON_OR_LIBPYTHON...]
       gilscan record [-o out.data] [--gil] [--state] [--stacks] [--gil-functions] -- python3 script.py
       gilscan batch [-j N] [--summary out.jsonl|out.csv] [--traces DIR]
                     [--gil-functions out.jsonl|out.csv] [options] PATH...
                     (gilscan batch --help)

Reads a perf.data recording (file or pipe mode, plain or zstd -z) of
scheduler tracepoints and writes a Chrome trace and a per-thread summary.

  -o, --output FILE        write the Chrome trace JSON to FILE ("-": stdout)
      --summary-json FILE  write the per-thread summary as JSON
      --running            include running spans ("R") in the trace
      --no-runnable        leave runnable spans ("R+") out of the trace
      --no-sleeping        leave sleep spans out of the trace
      --pid PID[,PID...]   only these processes (trace and summary)
      --gil-evidence auto|stacks|probes
                           what labels a sleep S(GIL): take_gil/drop_gil uprobes, or
                           the DWARF-unwound stack of the switch-out (auto: uprobes
                           when the recording has them, else stacks)
  -j, --jobs N             threads to use (default and 0: all cores). 1: one
                           thread does everything. 2: one thread reads the
                           recording while another runs the stages, and the
                           trace is written by a thread that mostly waits on
                           the disk. 3 and up, with --sleep-stacks: N-2 more
                           threads unwind and symbolize the sleeps' stacks.
                           The results are byte-identical whatever N is
      --sleep-stacks N     put each sleep's symbolized stack in the trace (kernel
                           frames from CALLCHAIN, up to N unwound user frames)
      --gil-functions      summary: GIL waits (S(GIL) sleeps) by the Python function
                           that waits, from stacks unwound past take_gil to
                           their first JIT frame (Python 3.12+ run with -X perf,
                           3.13+ with -X perf_jit; see --perf-maps)
      --symfs DIR          look for the recorded binaries under DIR first (and in a
                           perf build-id cache there)
      --perf-maps DIR      name frames in JIT code (Python 3.12+ run with -X perf)
                           for --sleep-stacks and --gil-functions from
                           DIR/perf-PID.map, as perf does from /tmp (default: /tmp),
                           or DIR/jit-PID.dump (3.13+ with -X perf_jit: names,
                           and the CFI to unwind on through; no perf inject).
                           Where DIR has neither: a process that still runs,
                           in its own /tmp by its pid there (containers); a
                           jitdump by the path and name the process mapped
      --no-perf-maps       leave those frames unnamed
      --cache-dir DIR      keep inflated copies of compressed debug files (Debian's
                           *-dbg packages) in DIR, by build-id, so that later runs
                           skip the inflate, this boot's kernel symbols (read
                           from /proc/kallsyms once), and the names of the frames
                           sleep stacks went through, per binary (so that later
                           runs do not build libdw's naming state for them)
                           (default: $GILSCAN_CACHE_DIR, else
                           $XDG_CACHE_HOME/gilscan, else ~/.cache/gilscan; plus
                           /debuginfo). Safe to delete at any time; kept under
                           $GILSCAN_CACHE_MAX_MB MiB (default 2048), least
                           recently used entries removed first
      --no-cache           neither use nor fill that cache
      --all-threads        table: every thread, also of processes without GIL
                           events when the recording has GIL uprobes
  -q, --quiet              no summary table on stdout
      --version            print the version
  -h, --help               this text

Record with, for example:
  perf record -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_wakeup \
      -e sched:sched_waking -e sched:sched_process_fork -- python3 app.py
)";

struct Options {
    std::string input;
    std::string output;
    std::string summary_json;
    bool running = false, runnable = true, sleeping = true, quiet = false;
    bool progress = false;
    bool all_threads = false;
    std::string gil_evidence = "auto";
    std::string symfs;
    std::string perf_maps = "/tmp";
    unsigned sleep_stacks = 0;
    bool gil_functions = false;
    unsigned jobs = gilscan::all_cores();
    std::unordered_set<int32_t> pids;
    std::string cache_dir = gilscan::default_debuginfo_cache_dir();
};

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "gilscan: error: %s\n(see gilscan --help)\n", msg.c_str());
    std::exit(2);
}

template <class T>
T number(const char* option, const std::string& text, T min, T max) {
    try {
        return gilscan::cli_number<T>(option, text, min, max);
    } catch (const gilscan::UsageError& e) {
        usage_error(e.what());
    }
}

Options parse_args(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char* name) -> std::string {
            if (i + 1 >= argc) usage_error(std::string(name) + " needs a value");
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        } else if (a == "--version") {
            std::puts("gilscan 0.1.0");
            std::exit(0);
        } else if (a == "-o" || a == "--output") {
            o.output = value("-o");
        } else if (a == "--summary-json") {
            o.summary_json = value("--summary-json");
        } else if (a == "--running") {
            o.running = true;
        } else if (a == "--no-running") {
            o.running = false;
        } else if (a == "--no-runnable") {
            o.runnable = false;
        } else if (a == "--no-sleeping") {
            o.sleeping = false;
        } else if (a == "--pid") {
            std::string list = value("--pid");
            size_t pos = 0;
            while (pos <= list.size()) {
                size_t comma = list.find(',', pos);
                if (comma == std::string::npos) comma = list.size();
                o.pids.insert(number<int32_t>("--pid", list.substr(pos, comma - pos), 1, gilscan::kMaxPid));
                pos = comma + 1;
            }
        } else if (a == "--gil-evidence") {
            o.gil_evidence = value("--gil-evidence");
            if (o.gil_evidence != "auto" && o.gil_evidence != "stacks" && o.gil_evidence != "probes")
                usage_error("--gil-evidence takes auto, stacks or probes");
        } else if (a == "-j" || a == "--jobs") {
            const unsigned n = number<unsigned>("-j", value("-j"), 0, 256);
            o.jobs = n == 0 ? gilscan::all_cores() : n;
        } else if (a == "--sleep-stacks") {
            o.sleep_stacks = number<unsigned>("--sleep-stacks", value("--sleep-stacks"), 1, 1024);
        } else if (a == "--gil-functions") {
            o.gil_functions = true;
        } else if (a == "--symfs") {
            o.symfs = value("--symfs");
        } else if (a == "--perf-maps") {
            o.perf_maps = value("--perf-maps");
            if (o.perf_maps.empty()) usage_error("--perf-maps needs a directory");
        } else if (a == "--no-perf-maps") {
            o.perf_maps.clear();
        } else if (a == "--cache-dir") {
            o.cache_dir = value("--cache-dir");
            if (o.cache_dir.empty()) usage_error("--cache-dir needs a directory");
            o.cache_dir = gilscan::cache_entries_dir(o.cache_dir);
        } else if (a == "--no-cache") {
            o.cache_dir.clear();
        } else if (a == "--all-threads") {
            o.all_threads = true;
        } else if (a == "-q" || a == "--quiet") {
            o.quiet = true;
        } else if (!a.empty() && a[0] == '-' && a != "-") {
            usage_error("unknown option " + a);
        } else if (o.input.empty()) {
            o.input = a;
        } else {
            usage_error("more than one input file");
        }
    }
    if (o.input.empty()) usage_error("no input file");
    return o;
}

// What a run writes, by option, for check_outputs.
std::vector<std::pair<std::string, std::string>> outputs_of(const Options& o) {
    return {{"-o", o.output}, {"--summary-json", o.summary_json}};
}

// The table and messages on stdout reached it: a full disk, a closed or
// broken stdout is an error of the run, as for any output file.
void finish_stdout() {
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw gilscan::Error("stdout", gilscan::Error::no_offset,
                             std::string("write failed: ") + std::strerror(errno ? errno : EIO));
}

// A closed standard descriptor would be taken by the first file opened (the
// trace would get the table): each is held by /dev/null, stdout read-only so
// that writing the table there fails as writing to a closed stdout does.
void hold_standard_fds() {
    for (int fd : {0, 1, 2}) {
        if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        const int n = ::open("/dev/null", fd == 2 ? O_WRONLY : O_RDONLY);
        if (n >= 0 && n != fd) {
            ::dup2(n, fd);
            ::close(n);
        }
    }
}

gilscan::AnalysisOptions analysis_options(const Options& opt) {
    gilscan::AnalysisOptions a;
    a.input = opt.input;
    a.output = opt.output;
    a.trace = {opt.running, opt.runnable, opt.sleeping, opt.pids};
    a.pids = opt.pids;
    a.gil_evidence = opt.gil_evidence;
    a.symfs = opt.symfs;
    a.perf_maps = opt.perf_maps;
    a.sleep_stacks = opt.sleep_stacks;
    a.gil_functions = opt.gil_functions;
    a.jobs = opt.jobs;
    a.debuginfo_cache = opt.cache_dir;
    if (opt.progress) {
        a.progress = [input = opt.input](uint64_t done, uint64_t total) {
            std::fprintf(stderr, "\rgilscan: analysing %s: %3d%%", input.c_str(),
                         total ? static_cast<int>(100 * done / total) : 100);
            if (done >= total) std::fputc('\n', stderr);
        };
    }
    return a;
}

// Sanitizers check at exit (leaks): there the run's memory is freed as usual.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kExitWhenDone = false;
#else
constexpr bool kExitWhenDone = true;
#endif

void report(const Options& opt, const gilscan::FileSummary& summary) {
    if (!opt.summary_json.empty()) {
        try {
            gilscan::OutputFile js(opt.summary_json);
            gilscan::write_summary_json(js, summary);
            js.commit();
        } catch (const gilscan::Error& e) {
            // The trace is in place already: say so, the exit status says the rest.
            if (opt.output.empty() || opt.output == "-") throw;
            throw gilscan::Error("", gilscan::Error::no_offset,
                                 std::string(e.what()) + " (the trace " + opt.output + " was written)");
        }
    }
    for (const auto& w : summary.warnings) std::fprintf(stderr, "gilscan: warning: %s: %s\n", opt.input.c_str(), w.c_str());
    if (!opt.quiet) gilscan::print_summary_table(opt.output == "-" ? stderr : stdout, summary, opt.all_threads);
    finish_stdout();
}

// exit_when_done: the process ends as soon as every output is complete
// (AnalysisOptions::on_complete), leaving the run's memory to the kernel.
int run(const Options& opt, bool exit_when_done = false) {
    gilscan::check_outputs(outputs_of(opt), {opt.input});
    gilscan::remove_temporaries_on_signals();
    // The stages, in order, are in gilscan::analyse_recording (src/pipeline.cc):
    // file/header/features -> records -> tracepoint formats -> process maps ->
    // unwinding and symbols -> GIL locator -> thread state machines -> trace.
    gilscan::AnalysisOptions a = analysis_options(opt);
    if (exit_when_done && kExitWhenDone) {
        a.on_complete = [&opt](const gilscan::FileSummary& summary) {
            report(opt, summary);  // may throw: then the usual way out
            std::fflush(stdout);
            std::fflush(stderr);
            std::_Exit(0);
        };
    }
    report(opt, gilscan::analyse_recording(a));
    return 0;
}

// A subcommand's one-line error and exit status for anything it throws.
template <class F>
int guarded(int status_on_error, F&& f) {
    try {
        return f();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gilscan: error: %s\n", e.what());
        return status_on_error;
    }
}

}  // namespace

int main(int argc, char** argv) {
    hold_standard_fds();
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "probe") return guarded(1, [&] { return gilscan::probe_main(argc, argv); });
    if (cmd == "batch") return guarded(2, [&] { return gilscan::batch_main(argc, argv); });
    if (cmd == gilscan::kBatchOneCommand) return guarded(1, [&] { return gilscan::batch_one_main(argc, argv); });
    if (cmd == "record") {
        return guarded(1, [&] {
            gilscan::RecordResult r = gilscan::record_main(argc, argv);
            if (!r.analyse) return r.status;
            Options opt;
            opt.input = r.data_file;
            opt.output = r.trace;
            opt.summary_json = r.summary_json;
            opt.quiet = r.quiet;
            opt.gil_functions = r.gil_functions;
            opt.progress = !r.quiet && ::isatty(2);
            int rc = run(opt);
            if (!r.quiet && !opt.output.empty()) std::fprintf(stderr, "gilscan: wrote %s\n", opt.output.c_str());
            return rc != 0 ? rc : r.status;
        });
    }
    Options opt = parse_args(argc, argv);
    try {
        return run(opt, /*exit_when_done=*/true);
    } catch (const gilscan::Error& e) {
        std::fprintf(stderr, "gilscan: error: %s\n", e.what());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "gilscan: error: %s: out of memory\n", opt.input.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gilscan: error: %s: %s\n", opt.input.c_str(), e.what());
    }
    return 1;
}
