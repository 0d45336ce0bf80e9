#include "gilscan/batch.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include "gilscan/analysis.h"
#include "gilscan/debuginfo_cache.h"
#include "gilscan/error.h"
#include "gilscan/output_file.h"
#include "gilscan/utf8.h"

namespace gilscan {

namespace fs = std::filesystem;

namespace {

bool wanted(const fs::path& p) {
    const std::string name = p.filename().string();
    return name.ends_with(".data") || name.ends_with(".data.zst") || name.starts_with("perf.data");
}

// A .zst archive, decompressed into a private temporary file.
struct Unpacked {
    std::string path;
    ~Unpacked() {
        if (!path.empty()) std::remove(path.c_str());
    }
};

void unzstd(const std::string& in, Unpacked& out) {
    std::ifstream src(in, std::ios::binary);
    if (!src) throw Error(in, Error::no_offset, "cannot open");
    char tmpl[] = "/tmp/gilscan-batch-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd < 0) throw Error(in, Error::no_offset, "cannot create a temporary file");
    out.path = tmpl;
    FILE* dst = ::fdopen(fd, "wb");
    ZSTD_DCtx* d = ZSTD_createDCtx();
    std::vector<char> ibuf(ZSTD_DStreamInSize()), obuf(ZSTD_DStreamOutSize());
    size_t last = 0;
    bool any = false;
    while (src.read(ibuf.data(), static_cast<std::streamsize>(ibuf.size())) || src.gcount() > 0) {
        ZSTD_inBuffer ib{ibuf.data(), static_cast<size_t>(src.gcount()), 0};
        any = true;
        while (ib.pos < ib.size) {
            ZSTD_outBuffer ob{obuf.data(), obuf.size(), 0};
            last = ZSTD_decompressStream(d, &ob, &ib);
            if (ZSTD_isError(last)) {
                ZSTD_freeDCtx(d);
                std::fclose(dst);
                throw Error(in, Error::no_offset, std::string("not a zstd archive: ") + ZSTD_getErrorName(last));
            }
            std::fwrite(obuf.data(), 1, ob.pos, dst);
        }
    }
    ZSTD_freeDCtx(d);
    std::fclose(dst);
    if (!any) throw Error(in, Error::no_offset, "empty file");
    if (last != 0) throw Error(in, Error::no_offset, "zstd archive is cut short");
}

struct Result {
    std::string path;
    std::string error;
    std::string date;
    FileSummary summary;
};

const char* kColumns[] = {"recording", "error",      "host",        "cmdline",     "date",       "pid",
                          "tid",       "comm",       "main_thread", "span_us",     "running_us", "runnable_us",
                          "sleep_us",  "sleep_count", "gil_sleep_us", "gil_wait_us", "gil_hold_us", "no_gil_us",
                          "lost_events", "lost_samples", "warnings"};

// `all`: summary_json(r.summary), made once per recording for both tables
// (null for a recording that could not be read).
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
    const FileSummary& fs = r.summary;
    std::string warnings;
    for (const auto& w : fs.warnings) warnings += (warnings.empty() ? "" : " | ") + w;
    auto common = [&](json& j) {
        j["host"] = fs.hostname;
        j["cmdline"] = fs.cmdline;
        j["date"] = r.date;
        j["lost_events"] = fs.lost_events;
        j["lost_samples"] = fs.lost_samples;
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

constexpr const char* kUsage =
    "usage: gilscan batch [-j N] [--summary out.jsonl|out.csv] [--traces DIR] [--symfs DIR]\n"
    "                     [--gil-evidence auto|stacks|probes] [--gil-functions out.jsonl|out.csv]\n"
    "                     [--perf-maps DIR | --no-perf-maps] PATH...\n\n"
    "Analyses many recordings (files, or directories searched for *.data, *.data.zst,\n"
    "perf.data*) in parallel: one summary row per recording and thread. Unreadable files\n"
    "get a row with their error; the exit status is 1 only if nothing could be read.\n"
    "--gil-functions writes GIL waits by Python function (gilscan --gil-functions), one\n"
    "row per recording, process and function, naming JIT frames from DIR/perf-PID.map\n"
    "(--perf-maps; default /tmp, as perf).\n";

}  // namespace

std::vector<std::string> batch_inputs(const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const auto& p : paths) {
        std::error_code ec;
        if (fs::is_directory(p, ec)) {
            std::vector<std::string> found;
            for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
                 it != fs::recursive_directory_iterator(); it.increment(ec)) {
                if (ec) break;
                if (it->is_regular_file(ec) && wanted(it->path())) found.push_back(it->path().string());
            }
            std::sort(found.begin(), found.end());
            out.insert(out.end(), found.begin(), found.end());
        } else {
            out.push_back(p);  // named explicitly: analysed whatever its name
        }
    }
    return out;
}

int batch_main(int argc, char** argv) {
    unsigned jobs = all_cores();
    std::string summary_path, traces_dir, symfs, evidence = "auto", functions_path, perf_maps = "/tmp";
    std::vector<std::string> paths;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw Error("gilscan batch", Error::no_offset, a + " needs a value");
            return argv[++i];
        };
        if (a == "-j") {
            long n = std::strtol(value().c_str(), nullptr, 10);
            if (n < 1 || n > 1024) throw Error("gilscan batch", Error::no_offset, "-j takes 1..1024");
            jobs = static_cast<unsigned>(n);
        } else if (a == "--summary") {
            summary_path = value();
        } else if (a == "--traces") {
            traces_dir = value();
        } else if (a == "--symfs") {
            symfs = value();
        } else if (a == "--gil-evidence") {
            evidence = value();
        } else if (a == "--gil-functions") {
            functions_path = value();
            if (functions_path.empty()) throw Error("gilscan batch", Error::no_offset, "--gil-functions needs a file");
        } else if (a == "--perf-maps") {
            perf_maps = value();
            if (perf_maps.empty()) throw Error("gilscan batch", Error::no_offset, "--perf-maps needs a directory");
        } else if (a == "--no-perf-maps") {
            perf_maps.clear();
        } else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (!a.empty() && a[0] == '-') {
            throw Error("gilscan batch", Error::no_offset, "unknown option " + a);
        } else {
            paths.push_back(a);
        }
    }
    if (paths.empty()) throw Error("gilscan batch", Error::no_offset, "no recordings given");
    const std::vector<std::string> inputs = batch_inputs(paths);
    if (inputs.empty()) {
        std::fprintf(stderr, "gilscan: error: no recordings found under the given paths\n");
        return 1;
    }
    if (!traces_dir.empty()) fs::create_directories(traces_dir);
    const bool csv = summary_path.ends_with(".csv");

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
    auto worker = [&]() {
        for (size_t i = next++; i < inputs.size(); i = next++) {
            Result& r = results[i];
            r.path = inputs[i];
            try {
                Unpacked tmp;
                AnalysisOptions o;
                o.input = r.path;
                if (r.path.ends_with(".zst")) {
                    unzstd(r.path, tmp);
                    o.input = tmp.path;
                    o.display_name = r.path;
                }
                o.symfs = symfs;
                o.gil_evidence = evidence;
                o.gil_functions = !functions_path.empty();
                o.perf_maps = perf_maps;
                o.debuginfo_cache = default_debuginfo_cache_dir();
                // The threads split between the recordings analysed at once:
                // many recordings, one thread each; fewer than -j, several.
                o.jobs = std::max(1u, jobs / static_cast<unsigned>(std::min<size_t>(jobs, inputs.size())));
                if (!traces_dir.empty()) o.output = (fs::path(traces_dir) / trace_name(r.path, i)).string();
                r.summary = analyse_recording(o);
                r.summary.file = r.path;
                // The recording's own clock data, else (as perf report does) the file's mtime.
                struct stat st {};
                r.date = !r.summary.date.empty() ? r.summary.date
                         : ::stat(r.path.c_str(), &st) == 0
                             ? iso8601_utc(static_cast<int64_t>(st.st_mtime) * 1000000000)
                             : "";
            } catch (const std::exception& e) {
                r.error = e.what();
                ++failed;
            }
            ++done;
            progress();
        }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < std::min<size_t>(jobs, inputs.size()); ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();

    // Rows in input order, whatever order the workers finished in.
    std::vector<nlohmann::json> rows, function_rows;
    for (const auto& r : results) {
        const nlohmann::json all = r.error.empty() ? summary_json(r.summary) : nlohmann::json();
        for (auto& row : rows_of(r, all)) rows.push_back(std::move(row));
        if (!functions_path.empty())
            for (auto& row : function_rows_of(r, all)) function_rows.push_back(std::move(row));
        if (!r.error.empty()) std::fprintf(stderr, "gilscan: error: %s\n", r.error.c_str());
    }
    // Both files complete, or neither changed (OutputFile: written aside, renamed at commit).
    std::unique_ptr<OutputFile> out, fn_out;
    if (!summary_path.empty()) out = std::make_unique<OutputFile>(summary_path);
    if (!functions_path.empty()) fn_out = std::make_unique<OutputFile>(functions_path);
    const std::string text = rows_text(rows, kColumns, std::size(kColumns), csv);
    if (out) {
        out->write(text);
    } else {
        std::fputs(text.c_str(), stdout);
    }
    if (fn_out) fn_out->write(rows_text(function_rows, kFunctionColumns, std::size(kFunctionColumns),
                                        functions_path.ends_with(".csv")));
    if (out) out->commit();
    if (fn_out) fn_out->commit();
    const size_t n_rows = rows.size();
    std::fprintf(stderr, "gilscan batch: %zu recordings, %zu read, %zu unreadable, %zu rows\n", inputs.size(),
                 inputs.size() - failed.load(), failed.load(), n_rows);
    return failed.load() == inputs.size() ? 1 : 0;
}

}  // namespace gilscan
