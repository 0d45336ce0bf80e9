#include "gilscan/cli/batch.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gilscan/pipeline.h"
#include "gilscan/cli/batch_inputs.h"
#include "gilscan/cli/options.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/error.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/temp_files.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kDefaultMaxUnpacked = 64ull << 30;

}  // namespace


namespace {

struct Result {
    std::string path;
    std::string error;
    bool write_error = false;  // the recording was read; its trace could not be written
    std::string date;
    nlohmann::json summary;    // summary_json() of the recording, from its analysing process
};

const char* kColumns[] = {"recording", "error",      "host",        "cmdline",     "date",       "pid",
                          "tid",       "comm",       "main_thread", "span_us",     "running_us", "runnable_us",
                          "sleep_us",  "sleep_count", "gil_sleep_us", "gil_wait_us", "gil_hold_us", "no_gil_us",
                          "lost_events", "lost_samples", "warnings"};

// `all`: summary_json() of the recording (null for one that could not be read).
std::vector<nlohmann::json> rows_of(const Result& r, const nlohmann::json& all) {
    using nlohmann::json;
    std::vector<json> rows;
    auto base = [&]() {
        json j;
        for (const char* c : kColumns) j[c] = nullptr;
        j["recording"] = r.path;
        return j;
    };
    if (!r.error.empty()) {
        json j = base();
        j["error"] = r.error;
        rows.push_back(j);
        return rows;
    }
    std::string warnings;
    for (const auto& w : all["warnings"]) warnings += (warnings.empty() ? "" : " | ") + w.get<std::string>();
    auto common = [&](json& j) {
        j["host"] = all["hostname"];
        j["cmdline"] = all["cmdline"];
        j["date"] = r.date;
        j["lost_events"] = all["lost_events"];
        j["lost_samples"] = all["lost_samples"];
        j["warnings"] = warnings;
    };
    for (const auto& t : all["threads"]) {
        json j = base();
        common(j);
        for (const char* k : {"pid", "tid", "comm", "main_thread", "span_us", "running_us", "runnable_us", "sleep_us",
                              "sleep_count", "gil_sleep_us", "gil_wait_us", "gil_hold_us", "no_gil_us"})
            j[k] = t[k];
        rows.push_back(j);
    }
    if (rows.empty()) {  // read fine, but no thread to report
        json j = base();
        common(j);
        rows.push_back(j);
    }
    return rows;
}

// --gil-functions: one row per recording, process and Python function
// (FileSummary::gil_functions, as --summary-json has them).
const char* kFunctionColumns[] = {"recording", "pid", "function", "sleep_count", "sleep_us"};

std::vector<nlohmann::json> function_rows_of(const Result& r, const nlohmann::json& all) {
    std::vector<nlohmann::json> rows;
    if (!r.error.empty()) return rows;  // its error is in the summary rows
    for (const auto& f : all.value("gil_functions", nlohmann::json::array())) {
        nlohmann::json j;
        j["recording"] = r.path;
        for (const char* k : {"pid", "function", "sleep_count", "sleep_us"}) j[k] = f[k];
        rows.push_back(j);
    }
    return rows;
}

// --blame: one row per recording, process and blamed function: the
// summary JSON's gil_blame rows, each with its recording.
const char* kBlameColumns[] = {"recording", "pid",        "function",   "native",  "module",   "contended_us",
                               "on_cpu_us", "off_cpu_us", "hold_us",    "threads", "held_while_blocked", "inferred"};

std::vector<nlohmann::json> blame_rows_of(const Result& r, const nlohmann::json& all) {
    std::vector<nlohmann::json> rows;
    if (!r.error.empty()) return rows;
    for (const auto& b : all.value("gil_blame", nlohmann::json::array())) {
        nlohmann::json j = b;
        j["recording"] = r.path;
        rows.push_back(j);
    }
    return rows;
}

std::string csv_field(const nlohmann::json& v) {
    std::string s = v.is_null() ? "" : v.is_string() ? valid_utf8(v.get<std::string>()) : json_dump(v);
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
}

std::string trace_name(const std::string& path, size_t index) {
    std::string base = fs::path(path).filename().string();
    for (std::string_view suf : {".zst", ".data"})
        if (base.size() > suf.size() && base.ends_with(suf)) base.resize(base.size() - suf.size());
    return std::to_string(index) + "-" + base + ".json";
}

// Rows as CSV (a header line first) or JSON lines, by the file's name.
std::string rows_text(const std::vector<nlohmann::json>& rows, const char* const* columns, size_t n_columns, bool csv) {
    std::string text;
    if (csv) {
        for (size_t c = 0; c < n_columns; ++c) text += std::string(c ? "," : "") + columns[c];
        text += "\n";
    }
    for (const auto& row : rows) {
        if (csv) {
            for (size_t c = 0; c < n_columns; ++c) {
                if (c) text += ',';
                text += csv_field(row[columns[c]]);
            }
            text += "\n";
        } else {
            text += json_dump(row) + "\n";
        }
    }
    return text;
}

struct BatchOptions {
    unsigned jobs = all_cores();
    std::string summary_path, traces_dir, symfs, time, evidence = "auto", functions_path, blame_path, perf_maps = "/tmp";
    std::string cache_dir = default_debuginfo_cache_dir();
    uint64_t max_unpacked = kDefaultMaxUnpacked;
    std::vector<std::string> paths;
    Shard shard;
};

constexpr const char* kAbout =
    "Analyses many recordings (files, or directories searched for *.data, *.data.zst,\n"
    "perf.data*) in parallel, each in a process of its own: one summary row per recording\n"
    "and thread. A recording that cannot be read, or whose analysis crashes, is a row\n"
    "with its error; the exit status is 1 if nothing could be read or anything could not\n"
    "be written.";

// Returns nullopt for --help (printed).
std::optional<BatchOptions> parse_batch_args(int argc, char** argv) {
    BatchOptions o;
    OptionTable t("gilscan batch", "[options] PATH...", kAbout);
    t.section("Outputs");
    t.value("--summary", "out.jsonl|out.csv", "one row per recording and thread (CSV by the name)",
            [&](const std::string& v) { o.summary_path = v; });
    t.value("--traces", "DIR", "one Chrome trace per recording, in DIR", [&](const std::string& v) { o.traces_dir = v; });
    t.value("--gil-functions", "out.jsonl|out.csv", "GIL waits by Python function, per recording and process",
            [&](const std::string& v) { o.functions_path = non_empty("--gil-functions", v, "a file"); });
    t.value("--blame", "out.jsonl|out.csv", "GIL blame rows, per recording, process and function",
            [&](const std::string& v) { o.blame_path = non_empty("--blame", v, "a file"); });
    t.section("Analysis (as gilscan FILE's)");
    t.value("--gil-evidence", "MODE", "auto|stacks|probes: what labels a sleep S(GIL)", [&](const std::string& v) {
        if (v != "auto" && v != "stacks" && v != "probes") throw UsageError("--gil-evidence takes auto, stacks or probes");
        o.evidence = v;
    });
    t.value("--time", "START,STOP", "only seconds START to STOP from each recording's first sample",
            [&](const std::string& v) {
                try {
                    TimeWindow::parse(v);
                } catch (const std::invalid_argument& e) {
                    throw UsageError(e.what());
                }
                o.time = v;
            });
    t.value("--symfs", "DIR", "look for the recorded binaries under DIR first", [&](const std::string& v) { o.symfs = v; });
    t.value("--perf-maps", "DIR", "perf maps and jitdumps for JIT frames (default /tmp)",
            [&](const std::string& v) { o.perf_maps = non_empty("--perf-maps", v, "a directory"); });
    t.flag("--no-perf-maps", "leave JIT frames unnamed", [&] { o.perf_maps.clear(); });
    t.value("--cache-dir", "DIR", "keep the cache in DIR/gilscan-cache (default ~/.cache)", [&](const std::string& v) {
        o.cache_dir = cache_entries_dir(non_empty("--cache-dir", v, "a directory"));
    });
    t.flag("--no-cache", "neither use nor fill the cache", [&] { o.cache_dir.clear(); });
    t.section("Running");
    t.value("--shard", "K/N", "only share K of N (by path hash): N jobs split the recordings",
            [&](const std::string& v) { o.shard = Shard::parse(v); });
    t.value("-j", "N", "recordings analysed at once (default: all cores)",
            [&](const std::string& v) { o.jobs = cli_number<unsigned>("-j", v, 1, 1024); });
    t.value("--max-unpacked", "MIB", "the most a .zst archive may unpack to (default 65536)", [&](const std::string& v) {
        o.max_unpacked = cli_number<uint64_t>("--max-unpacked", v, 1, 1ull << 40) << 20;
    });
    t.operands("PATH", [&](const std::string& v) { o.paths.push_back(v); });
    t.epilogue("Archives unpack under $TMPDIR (else /tmp), never into the last tenth of its free space.\n"
               "Every option in detail: docs/usage.md.");
    if (!t.parse(argc, argv, 2)) return std::nullopt;
    if (o.paths.empty()) throw UsageError("no recordings given");
    return o;
}

std::string temp_dir() {
    const char* t = std::getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

// The analysing process's argument vector for recording i (batch_one_main reads it).
std::vector<std::string> one_args(const BatchOptions& o, const std::string& input, size_t i, unsigned jobs) {
    std::vector<std::string> a{"gilscan", kBatchOneCommand, input, "--gil-evidence", o.evidence, "-j",
                               std::to_string(jobs), "--max-unpacked", std::to_string(o.max_unpacked >> 20),
                               "--parent", std::to_string(::getpid())};
    if (!o.symfs.empty()) a.insert(a.end(), {"--symfs", o.symfs});
    if (!o.time.empty()) a.insert(a.end(), {"--time", o.time});
    if (o.perf_maps.empty()) a.push_back("--no-perf-maps");
    else a.insert(a.end(), {"--perf-maps", o.perf_maps});
    if (o.cache_dir.empty()) a.push_back("--no-cache");
    else a.insert(a.end(), {"--cache-entries", o.cache_dir});
    if (!o.functions_path.empty()) a.push_back("--gil-functions");
    if (!o.traces_dir.empty()) a.insert(a.end(), {"-o", (fs::path(o.traces_dir) / trace_name(input, i)).string()});
    return a;
}

std::string signal_name(int sig) {
    const char* d = ::sigdescr_np(sig);
    return "signal " + std::to_string(sig) + (d ? std::string(" (") + d + ")" : "");
}

// Runs one recording's analysis in a process of its own (this executable,
// no shell) and reads its one JSON answer: a crash, or memory it cannot
// get, ends that process and becomes this recording's error.
void analyse_in_child(const std::vector<std::string>& args, Result& r) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw Error(r.path, Error::no_offset, std::string("pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    if (rc != 0) {
        ::close(out[0]);
        throw Error(r.path, Error::no_offset, std::string("cannot start its analysis: ") + std::strerror(rc));
    }
    std::string answer;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFSIGNALED(status)) {
        r.error = r.path + ": the analysis crashed: " + signal_name(WTERMSIG(status));
        return;
    }
    nlohmann::json j = nlohmann::json::parse(answer, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        r.error = r.path + ": the analysis ended without a result (exit status " +
                  std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
        return;
    }
    if (j.contains("error")) {
        r.error = j["error"].get<std::string>();
        r.write_error = j.value("write_error", false);
        return;
    }
    r.summary = std::move(j["summary"]);
    r.date = j.value("date", "");
}

// batch may die without waiting for this process (kill -9, a cluster's time
// limit): the kernel then sends it SIGTERM, whose handler removes its
// temporaries, rather than letting it analyse on for nobody. A parent gone
// before the request took effect shows as another parent (the reaper).
void die_with_parent(pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::raise(SIGTERM);
}

void print_or_write(const std::unique_ptr<OutputFile>& out, const std::string& text) {
    if (out) {
        out->write(text);
        return;
    }
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
        throw Error("stdout", Error::no_offset, std::string("write failed: ") + std::strerror(errno ? errno : EIO));
}

}  // namespace

// One recording, in the process batch_main started for it: its summary (or
// its error) as one JSON object on stdout.
int batch_one_main(int argc, char** argv) {
    AnalysisOptions o;
    uint64_t max_unpacked = kDefaultMaxUnpacked;
    if (argc < 3) throw UsageError("no recording given");
    o.input = argv[2];  // first, whatever its name (one_args puts it there)
    // The options one_args passes on; not a command for users (no help).
    OptionTable t(kBatchOneCommand, "FILE [options]", "");
    t.value("--gil-evidence", "E", "", [&](const std::string& v) { o.gil_evidence = v; });
    t.value("-j", "N", "", [&](const std::string& v) { o.jobs = cli_number<unsigned>("-j", v, 1, 1024); });
    t.value("--max-unpacked", "MIB", "", [&](const std::string& v) {
        max_unpacked = cli_number<uint64_t>("--max-unpacked", v, 1, 1ull << 40) << 20;
    });
    t.value("--symfs", "DIR", "", [&](const std::string& v) { o.symfs = v; });
    t.value("--time", "W", "", [&](const std::string& v) { o.window = TimeWindow::parse(v); });
    t.value("--perf-maps", "DIR", "", [&](const std::string& v) { o.perf_maps = v; });
    t.flag("--no-perf-maps", "", [&] { o.perf_maps.clear(); });
    t.value("--cache-entries", "DIR", "", [&](const std::string& v) { o.debuginfo_cache = v; });
    t.flag("--no-cache", "", [&] { o.debuginfo_cache.clear(); });
    t.flag("--gil-functions", "", [&] { o.gil_functions = true; });
    t.value("-o", "FILE", "", [&](const std::string& v) { o.output = v; });
    pid_t parent = 0;
    t.value("--parent", "PID", "",
            [&](const std::string& v) { parent = cli_number<pid_t>("--parent", v, 1, 0x3fffffff); });
    if (!t.parse(argc, argv, 3)) return 0;
    if (parent) die_with_parent(parent);
    const std::string path = o.input;
    nlohmann::json answer;
    try {
        int unpacked = -1;
        if (path.ends_with(".zst")) {
            unpacked = unpack_zstd_archive(path, temp_dir(), max_unpacked);
            o.input = "/proc/self/fd/" + std::to_string(unpacked);
            o.display_name = path;
        }
        check_outputs({{"a trace", o.output}}, {path});
        FileSummary s = analyse_recording(o);
        if (unpacked >= 0) ::close(unpacked);
        s.file = path;
        // The recording's own clock data, else (as perf report does) the file's mtime.
        struct stat st {};
        const std::string date = !s.date.empty() ? s.date
                                 : ::stat(path.c_str(), &st) == 0
                                     ? iso8601_utc(static_cast<int64_t>(st.st_mtime) * 1000000000)
                                     : "";
        answer = {{"summary", summary_json(s)}, {"date", date}};
    } catch (const Error& e) {
        answer = {{"error", e.what()}, {"write_error", !o.output.empty() && e.file() == o.output}};
    } catch (const std::bad_alloc&) {
        answer = {{"error", path + ": out of memory"}};
    } catch (const std::exception& e) {
        answer = {{"error", path + ": " + e.what()}};
    }
    const std::string text = json_dump(answer);
    return std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0 ? 0 : 1;
}

// The tables, rows in input order whatever order the workers finished in;
// each recording's error said. Returns how many traces could not be written.
size_t write_tables(const BatchOptions& opt, const std::vector<Result>& results, size_t& row_count) {
    std::vector<nlohmann::json> rows, function_rows, blame_rows;
    size_t write_failures = 0;
    for (const auto& r : results) {
        const nlohmann::json& all = r.error.empty() ? r.summary : nlohmann::json();
        for (auto& row : rows_of(r, all)) rows.push_back(std::move(row));
        if (!opt.functions_path.empty())
            for (auto& row : function_rows_of(r, all)) function_rows.push_back(std::move(row));
        if (!opt.blame_path.empty())
            for (auto& row : blame_rows_of(r, all)) blame_rows.push_back(std::move(row));
        if (r.write_error) ++write_failures;
        if (!r.error.empty()) std::fprintf(stderr, "gilscan: error: %s\n", r.error.c_str());
    }
    // Every file complete, or none changed (OutputFile: written aside, renamed at commit).
    std::unique_ptr<OutputFile> out, fn_out, blame_out;
    if (!opt.summary_path.empty()) out = std::make_unique<OutputFile>(opt.summary_path);
    if (!opt.functions_path.empty()) fn_out = std::make_unique<OutputFile>(opt.functions_path);
    if (!opt.blame_path.empty()) blame_out = std::make_unique<OutputFile>(opt.blame_path);
    print_or_write(out, rows_text(rows, kColumns, std::size(kColumns), opt.summary_path.ends_with(".csv")));
    if (fn_out) fn_out->write(rows_text(function_rows, kFunctionColumns, std::size(kFunctionColumns),
                                        opt.functions_path.ends_with(".csv")));
    if (blame_out)
        blame_out->write(rows_text(blame_rows, kBlameColumns, std::size(kBlameColumns), opt.blame_path.ends_with(".csv")));
    if (out) out->commit();
    if (fn_out) fn_out->commit();
    if (blame_out) blame_out->commit();
    row_count = rows.size();
    return write_failures;
}

int batch_main(int argc, char** argv) {
    const std::optional<BatchOptions> parsed = parse_batch_args(argc, argv);
    if (!parsed) return std::fflush(stdout) == 0 ? 0 : 1;
    const BatchOptions& opt = *parsed;
    const std::vector<BatchInput> every = batch_inputs(opt.paths);
    if (every.empty()) {
        std::fprintf(stderr, "gilscan: error: no recordings found under the given paths\n");
        return 1;
    }
    // A share may be empty (few recordings, many jobs): its tables are empty too.
    const std::vector<BatchInput> inputs = opt.shard.all() ? every : shard_of(every, opt.shard);
    std::vector<std::string> all_paths;
    for (const BatchInput& in : every) all_paths.push_back(in.path);
    check_outputs({{"--summary", opt.summary_path}, {"--gil-functions", opt.functions_path}, {"--blame", opt.blame_path}},
                  all_paths);
    remove_temporaries_on_signals();
    if (!opt.traces_dir.empty()) fs::create_directories(opt.traces_dir);

    std::vector<Result> results(inputs.size());
    std::atomic<size_t> next{0}, done{0}, failed{0};
    std::mutex progress_mu;
    const bool tty = ::isatty(2);
    auto progress = [&]() {
        std::lock_guard<std::mutex> l(progress_mu);
        size_t d = done.load(), n = inputs.size();
        if (tty) {
            const int width = 30;
            int filled = static_cast<int>(width * d / n);
            std::fprintf(stderr, "\r[%s%s] %zu/%zu recordings, %zu unreadable", std::string(filled, '#').c_str(),
                         std::string(width - filled, '.').c_str(), d, n, failed.load());
            if (d == n) std::fputc('\n', stderr);
        }
    };
    // The threads split between the recordings analysed at once: many
    // recordings, one thread each; fewer than -j, several.
    const unsigned each =
        std::max(1u, opt.jobs / static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(opt.jobs, inputs.size()))));
    auto worker = [&]() {
        for (size_t i = next++; i < inputs.size(); i = next++) {
            Result& r = results[i];
            r.path = inputs[i].path;
            try {
                analyse_in_child(one_args(opt, r.path, inputs[i].index, each), r);
            } catch (const std::exception& e) {
                r.error = e.what();
            }
            if (!r.error.empty() && !r.write_error) ++failed;
            ++done;
            progress();
        }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < std::min<size_t>(opt.jobs, inputs.size()); ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();

    size_t row_count = 0;
    const size_t write_failures = write_tables(opt, results, row_count);
    if (!opt.shard.all())
        std::fprintf(stderr, "gilscan batch: share %u/%u: %zu of %zu recordings\n", opt.shard.k, opt.shard.n,
                     inputs.size(), every.size());
    std::fprintf(stderr, "gilscan batch: %zu recordings, %zu read, %zu unreadable, %zu rows%s\n", inputs.size(),
                 inputs.size() - failed.load() - write_failures, failed.load(), row_count,
                 write_failures ? (", " + std::to_string(write_failures) + " trace(s) not written").c_str() : "");
    return (!inputs.empty() && failed.load() == inputs.size()) || write_failures ? 1 : 0;
}

}  // namespace gilscan
