#include "gilscan/cli/batch_child.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gilscan/pipeline.h"
#include "gilscan/cli/batch.h"
#include "gilscan/cli/options.h"
#include "gilscan/error.h"
#include "gilscan/output/output_checks.h"
#include "gilscan/output/temp_files.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

namespace {

using Clock = std::chrono::steady_clock;

std::string signal_name(int sig) {
    const char* d = ::sigdescr_np(sig);
    return "signal " + std::to_string(sig) + (d ? std::string(" (") + d + ")" : "");
}

// What became of a process past its deadline.
enum class Stop { none, terminated, killed };

// The next step against process `pid` once its deadline has passed:
// SIGTERM (its handler removes its temporaries; SIGCONT, so that a stopped
// process handles it too), then SIGKILL once kStopGraceMs more have passed,
// then, kStopGraceMs after that, giving up on the pipe (a process it started
// may still hold it). Returns false for the last.
bool stop_further(pid_t pid, Stop& stop, Clock::time_point& deadline) {
    if (stop == Stop::killed) return false;
    if (stop == Stop::none) {
        ::kill(pid, SIGTERM);
        ::kill(pid, SIGCONT);
        stop = Stop::terminated;
    } else {
        ::kill(pid, SIGKILL);
        stop = Stop::killed;
    }
    deadline = Clock::now() + std::chrono::milliseconds(kStopGraceMs);
    return true;
}

// The answer on `fd` until its end (or, with a deadline, until the process
// has been stopped as stop_further says).
Stop read_answer(int fd, pid_t pid, std::optional<Clock::time_point> deadline, std::string& answer) {
    Stop stop = Stop::none;
    char buf[65536];
    for (;;) {
        int wait_ms = -1;
        if (deadline) {
            const int64_t left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
            if (left <= 0) {
                if (!stop_further(pid, stop, *deadline)) break;
                continue;
            }
            wait_ms = static_cast<int>(std::min<int64_t>(left, INT_MAX));
        }
        pollfd p{fd, POLLIN, 0};
        const int ready = ::poll(&p, 1, wait_ms);
        if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
        if (ready < 0) break;
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
    }
    return stop;
}

// r's fields from the process's exit status and its answer.
void take_answer(int status, const std::string& answer, BatchResult& r) {
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

}  // namespace

void analyse_in_child(const std::vector<std::string>& args, double timeout_s, BatchResult& r) {
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
    std::optional<Clock::time_point> deadline;
    if (timeout_s > 0)
        deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::string answer;
    const Stop stop = read_answer(out[0], pid, deadline, answer);
    ::close(out[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    // One that finished as it was told to stop keeps its result.
    if (stop != Stop::none && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", timeout_s);
        r.error = r.path + ": the analysis ran past --timeout " + limit + " s and was stopped" +
                  (stop == Stop::killed ? " (SIGKILL)" : "");
        return;
    }
    take_answer(status, answer, r);
}

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

}  // namespace gilscan
