// gilscan — where the GIL costs a Python program, from perf.data.
//
//   gilscan perf.data -o trace.json [--summary-json s.json] [--running]
//
// main picks the command (record, batch, probe, help, or the analysis of a
// FILE), parses its options (cli/options.h) and runs it; the analysis
// itself, stage by stage, is analyse_recording (pipeline.h).
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
#include "gilscan/cli/batch_child.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/error.h"
#include "gilscan/output/output_checks.h"
#include "gilscan/output/output_file.h"
#include "gilscan/cli/probe.h"
#include "gilscan/cli/record.h"
#include "gilscan/cli/top.h"
#include "gilscan/output/summary.h"
#include "gilscan/output/temp_files.h"

namespace {

struct Options {
    std::string input;
    std::string output;
    std::string summary_json;
    std::string html;  // --html
    std::string summary;           // the table to this file ("": stdout, or stderr as below)
    bool table_on_stderr = false;  // under record: stdout is the recorded program's
    bool quiet_warnings = false;   // record -q: its warnings only in the summary JSON
    bool running = false, runnable = true, sleeping = true, quiet = false;
    bool viztracer = false;  // --viztracer
    bool progress = false;
    bool all_threads = false;
    std::string gil_evidence = "auto";
    std::string symfs;
    std::string perf_maps = "/tmp";
    unsigned sleep_stacks = 0;
    bool gil_functions = false;
    bool blame = true;
    size_t top = 10;
    std::string blame_folded, wait_folded;
    unsigned jobs = gilscan::all_cores();
    std::unordered_set<int32_t> pids;
    gilscan::TimeWindow window;  // --time
    std::string cache_dir = gilscan::default_debuginfo_cache_dir();
};

constexpr const char* kAbout =
    R"(Where the GIL costs a Python program, and who holds it while others wait. Also:
  gilscan record [options] -- PROGRAM   record a program with perf, then analyse it
  gilscan top [options] -p PID          a live view of a running Python (or -- PROGRAM)
  gilscan batch [options] PATH...       many recordings: one summary row per thread
  gilscan probe [options] [PYTHON...]   place the GIL uprobes for a perf record of your own)";

// The analysis options: `gilscan FILE`'s table (and its --help).
gilscan::OptionTable analysis_table(Options& o) {
    using gilscan::cli_number;
    gilscan::OptionTable t("gilscan", "FILE [options]", kAbout);
    t.section("Outputs");
    t.value("-o, --output", "FILE", "the trace: Chrome JSON, Perfetto's with .pftrace (\"-\": stdout; .gz/.zst: compressed)",
            [&](const std::string& v) { o.output = v; });
    t.value("--summary-json", "FILE", "the per-thread summary as JSON", [&](const std::string& v) { o.summary_json = v; });
    t.value("--html", "FILE", "a report to open in a browser: table, timeline, flame graphs (no network)",
            [&](const std::string& v) { o.html = gilscan::non_empty("--html", v, "a file"); });
    t.flag("-q, --quiet", "no summary table on stdout", [&] { o.quiet = true; });
    t.flag("--all-threads", "table: also threads of processes without GIL events", [&] { o.all_threads = true; });
    t.section("What the trace shows");
    t.flag("--running", "running spans (R) too, as per4m's --running (--no-running: none, the default)",
           [&] { o.running = true; });
    t.flag("--no-running", "", [&] { o.running = false; });
    t.flag("--no-runnable", "leave runnable spans (R+) out (--no-sleeping: sleep spans)", [&] { o.runnable = false; });
    t.flag("--no-sleeping", "", [&] { o.sleeping = false; });
    t.flag("--viztracer", "to merge with a VizTracer trace (viztracer --combine): states on rows of their own",
           [&] { o.viztracer = true; });
    t.value("--pid", "PID[,PID...]", "only these processes (trace and summary)", [&](const std::string& list) {
        size_t pos = 0;
        while (pos <= list.size()) {
            size_t comma = list.find(',', pos);
            if (comma == std::string::npos) comma = list.size();
            o.pids.insert(cli_number<int32_t>("--pid", list.substr(pos, comma - pos), 1, gilscan::kMaxPid));
            pos = comma + 1;
        }
    });
    t.value("--time", "START,STOP", "only seconds START to STOP from the first sample (every output; either may be empty)",
            [&](const std::string& v) {
                try {
                    o.window = gilscan::TimeWindow::parse(v);
                } catch (const std::invalid_argument& e) {
                    throw gilscan::UsageError(e.what());
                }
            });
    t.value("--sleep-stacks", "N", "each sleep's symbolized stack, up to N user frames", [&](const std::string& v) {
        o.sleep_stacks = cli_number<unsigned>("--sleep-stacks", v, 1, 1024);
    });
    t.section("The GIL");
    t.value("--gil-evidence", "MODE", "auto|stacks|probes: what labels a sleep S(GIL) (auto: uprobes, else stacks)",
            [&](const std::string& v) {
                if (v != "auto" && v != "stacks" && v != "probes")
                    throw gilscan::UsageError("--gil-evidence takes auto, stacks or probes");
                o.gil_evidence = v;
            });
    t.flag("--gil-functions", "GIL waits by Python function (-X perf or -X perf_jit stacks)",
           [&] { o.gil_functions = true; });
    t.value("--top", "N", "blame table: the N most contended rows (default 10)",
            [&](const std::string& v) { o.top = cli_number<size_t>("--top", v, 1, 1000000); });
    t.value("--blame-folded", "FILE", "holders' stacks, folded, in us of contended hold (flame graphs)",
            [&](const std::string& v) { o.blame_folded = v; });
    t.value("--wait-folded", "FILE", "waiters' stacks, folded, in us of GIL wait sleep",
            [&](const std::string& v) { o.wait_folded = v; });
    t.flag("--no-blame", "no blame table (and no CPU sample unwound)", [&] { o.blame = false; });
    t.section("Binaries, JIT maps, the cache, running");
    t.value("--symfs", "DIR", "look for the recorded binaries under DIR first", [&](const std::string& v) { o.symfs = v; });
    t.value("--perf-maps", "DIR", "perf-PID.map / jit-PID.dump files for JIT frames (default /tmp)",
            [&](const std::string& v) { o.perf_maps = gilscan::non_empty("--perf-maps", v, "a directory"); });
    t.flag("--no-perf-maps", "leave JIT frames unnamed", [&] { o.perf_maps.clear(); });
    t.value("--cache-dir", "DIR", "keep the cache in DIR/gilscan-cache (default ~/.cache; --no-cache: none)",
            [&](const std::string& v) {
        o.cache_dir = gilscan::cache_entries_dir(gilscan::non_empty("--cache-dir", v, "a directory"));
    });
    t.flag("--no-cache", "", [&] { o.cache_dir.clear(); });
    t.value("-j, --jobs", "N", "threads (default and 0: all cores); results are the same at any N",
            [&](const std::string& v) {
                const unsigned n = cli_number<unsigned>("-j", v, 0, 256);
                o.jobs = n == 0 ? gilscan::all_cores() : n;
            });
    t.flag("--version", "print the version", [] {
        std::puts("gilscan 0.1.0");
        std::exit(0);
    });
    t.operands("FILE", [&](const std::string& v) {
        if (!o.input.empty()) throw gilscan::UsageError("more than one input file");
        o.input = v;
    });
    t.epilogue("gilscan help COMMAND: a command's options. Every option in detail: docs/usage.md.");
    return t;
}

[[noreturn]] void usage_error(const std::string& command, const std::string& msg) {
    std::fprintf(stderr, "gilscan: error: %s\n(see gilscan help%s)\n", msg.c_str(),
                 command == "gilscan" ? "" : (" " + command.substr(8)).c_str());
    std::exit(2);
}

Options parse_args(int argc, char** argv) {
    Options o;
    gilscan::OptionTable t = analysis_table(o);
    try {
        if (!t.parse(argc, argv, 1)) std::exit(std::fflush(stdout) == 0 ? 0 : 1);
        if (o.input.empty()) throw gilscan::UsageError("no input file");
        if (o.viztracer) gilscan::require_json_trace("-o", o.output);
    } catch (const gilscan::UsageError& e) {
        usage_error(t.command(), e.what());
    }
    return o;
}

// What a run writes, by option, for check_outputs.
std::vector<std::pair<std::string, std::string>> outputs_of(const Options& o) {
    return {{"-o", o.output},
            {"--summary-json", o.summary_json},
            {"--html", o.html},
            {"--summary", o.summary},
            {"--blame-folded", o.blame_folded},
            {"--wait-folded", o.wait_folded}};
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
    a.trace = {opt.running, opt.runnable, opt.sleeping, opt.pids, opt.viztracer};
    a.pids = opt.pids;
    a.window = opt.window;
    a.gil_evidence = opt.gil_evidence;
    a.symfs = opt.symfs;
    a.perf_maps = opt.perf_maps;
    a.sleep_stacks = opt.sleep_stacks;
    a.gil_functions = opt.gil_functions;
    a.blame = opt.blame;
    a.blame_top = opt.top;
    a.blame_folded = opt.blame_folded;
    a.html = opt.html;
    a.wait_folded = opt.wait_folded;
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
    // record -q: the summary JSON keeps them.
    if (!opt.quiet_warnings)
        for (const auto& w : summary.warnings) std::fprintf(stderr, "gilscan: warning: %s: %s\n", opt.input.c_str(), w.c_str());
    if (!opt.quiet && !opt.summary.empty()) {
        // Formatted in memory, then written as every output file is (in place when complete).
        char* text = nullptr;
        size_t n = 0;
        std::FILE* mem = ::open_memstream(&text, &n);
        if (!mem) throw gilscan::Error(opt.summary, gilscan::Error::no_offset, "out of memory");
        gilscan::print_summary_table(mem, summary, opt.all_threads);
        std::fclose(mem);
        const std::string table(text, n);
        std::free(text);
        gilscan::OutputFile f(opt.summary, false);
        f.write(table);
        f.commit();
    } else if (!opt.quiet) {
        gilscan::print_summary_table(opt.output == "-" || opt.table_on_stderr ? stderr : stdout, summary,
                                     opt.all_threads);
    }
    finish_stdout();
}

// exit_when_done: the process ends as soon as every output is complete
// (AnalysisOptions::on_complete), leaving the run's memory to the kernel.
int run(const Options& opt, bool exit_when_done = false) {
    gilscan::check_outputs(outputs_of(opt), {opt.input});
    gilscan::remove_temporaries_on_signals();
    // The stages, in order: gilscan::analyse_recording (src/pipeline.cc).
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

// A subcommand's one-line error and exit status for anything it throws; a
// usage error says where the command's options are, and exits 2.
template <class F>
int guarded(const std::string& command, int status_on_error, F&& f) {
    try {
        return f();
    } catch (const gilscan::UsageError& e) {
        usage_error("gilscan " + command, e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gilscan: error: %s\n", e.what());
        return status_on_error;
    }
}

// `gilscan help [COMMAND]`: the command's --help.
int help_main(int argc, char** argv) {
    if (argc < 3) {
        Options o;
        const std::string h = analysis_table(o).help();
        std::fwrite(h.data(), 1, h.size(), stdout);
        return std::fflush(stdout) == 0 ? 0 : 1;
    }
    const std::string cmd = argv[2];
    if (cmd != "record" && cmd != "batch" && cmd != "probe" && cmd != "top") usage_error("gilscan", "no command " + cmd);
    char help[] = "--help";
    char* args[] = {argv[0], argv[2], help, nullptr};
    if (cmd == "record") return gilscan::record_main(3, args).status;
    if (cmd == "top") return gilscan::top_main(3, args);
    return cmd == "batch" ? gilscan::batch_main(3, args) : gilscan::probe_main(3, args);
}

}  // namespace

int main(int argc, char** argv) {
    hold_standard_fds();
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "help") return help_main(argc, argv);
    if (cmd == "probe") return guarded(cmd, 1, [&] { return gilscan::probe_main(argc, argv); });
    if (cmd == "batch") return guarded(cmd, 2, [&] { return gilscan::batch_main(argc, argv); });
    if (cmd == "top") return guarded(cmd, 1, [&] { return gilscan::top_main(argc, argv); });
    if (cmd == gilscan::kBatchOneCommand)
        return guarded(cmd, 1, [&] { return gilscan::batch_one_main(argc, argv); });
    if (cmd == "record") {
        return guarded(cmd, 1, [&] {
            gilscan::RecordResult r = gilscan::record_main(argc, argv);
            if (!r.analyse) return r.status;
            Options opt;
            opt.input = r.data_file;
            opt.output = r.trace;
            opt.summary_json = r.summary_json;
            opt.summary = r.summary;
            opt.table_on_stderr = true;  // stdout is the program's
            opt.quiet_warnings = r.quiet;
            opt.quiet = r.quiet;
            opt.gil_functions = r.gil_functions;
            opt.viztracer = r.viztracer;
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
