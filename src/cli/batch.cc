#include "gilscan/cli/batch.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gilscan/pipeline.h"
#include "gilscan/cli/batch_child.h"
#include "gilscan/cli/batch_inputs.h"
#include "gilscan/cli/options.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/error.h"
#include "gilscan/output/output_checks.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/temp_files.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

namespace fs = std::filesystem;

namespace {

const char* kColumns[] = {"recording", "error",      "host",        "cmdline",     "date",       "pid",
                          "tid",       "comm",       "main_thread", "span_us",     "running_us", "runnable_us",
                          "sleep_us",  "sleep_count", "gil_sleep_us", "gil_wait_us", "gil_hold_us", "no_gil_us",
                          "lost_events", "lost_samples", "warnings"};

// `all`: summary_json() of the recording (null for one that could not be read).
std::vector<nlohmann::json> rows_of(const BatchResult& r, const nlohmann::json& all) {
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

std::vector<nlohmann::json> function_rows_of(const BatchResult& r, const nlohmann::json& all) {
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

std::vector<nlohmann::json> blame_rows_of(const BatchResult& r, const nlohmann::json& all) {
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
    double timeout_s = 0;  // 0: none
    std::vector<std::string> paths;
    Shard shard;
};

constexpr const char* kAbout =
    "Analyses many recordings (files, or directories searched for *.data, *.data.zst,\n"
    "perf.data*) in parallel, each in a process of its own: one summary row per recording\n"
    "and thread. A recording that cannot be read, or whose analysis crashes or outlasts\n"
    "--timeout, is a row with its error; the exit status is 1 if nothing could be read or\n"
    "anything could not be written.";

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
    t.value("--timeout", "S", "stop a recording's analysis after S seconds: its row says so",
            [&](const std::string& v) { o.timeout_s = cli_seconds("--timeout", v); });
    t.operands("PATH", [&](const std::string& v) { o.paths.push_back(v); });
    t.epilogue("Archives unpack under $TMPDIR (else /tmp), never into the last tenth of its free space.\n"
               "Every option in detail: docs/usage.md.");
    if (!t.parse(argc, argv, 2)) return std::nullopt;
    if (o.paths.empty()) throw UsageError("no recordings given");
    return o;
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

void print_or_write(const std::unique_ptr<OutputFile>& out, const std::string& text) {
    if (out) {
        out->write(text);
        return;
    }
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
        throw Error("stdout", Error::no_offset, std::string("write failed: ") + std::strerror(errno ? errno : EIO));
}

}  // namespace

// The tables, rows in input order whatever order the workers finished in;
// each recording's error said. Returns how many traces could not be written.
size_t write_tables(const BatchOptions& opt, const std::vector<BatchResult>& results, size_t& row_count) {
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

    std::vector<BatchResult> results(inputs.size());
    std::atomic<size_t> next{0}, done{0}, failed{0};
    std::mutex progress_mu;
    const bool tty = ::isatty(2);
    auto progress = [&]() {
        std::lock_guard<std::mutex> l(progress_mu);
        size_t d = done.load(), n = inputs.size();
        if (tty) {
            const int width = 30;
            int filled = static_cast<int>(width * d / n);
            std::fprintf(stderr, "\r[%s%s] %zu/%zu recordings, %zu failed", std::string(filled, '#').c_str(),
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
            BatchResult& r = results[i];
            r.path = inputs[i].path;
            try {
                analyse_in_child(one_args(opt, r.path, inputs[i].index, each), opt.timeout_s, r);
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
    std::fprintf(stderr, "gilscan batch: %zu recordings, %zu read, %zu failed, %zu rows%s\n", inputs.size(),
                 inputs.size() - failed.load() - write_failures, failed.load(), row_count,
                 write_failures ? (", " + std::to_string(write_failures) + " trace(s) not written").c_str() : "");
    return (!inputs.empty() && failed.load() == inputs.size()) || write_failures ? 1 : 0;
}

}  // namespace gilscan
