#include "gilscan/cli/top.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "gilscan/cli/options.h"
#include "gilscan/cli/record.h"
#include "gilscan/error.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/summary.h"
#include "gilscan/output/top_view.h"
#include "gilscan/pipeline.h"
#include "gilscan/symbols/debuginfo_cache.h"

namespace gilscan {

namespace {

struct TopRequest {
    LiveRecordRequest rec;
    double interval = 1.0;
    bool batch = false, json = false;
    size_t top = 10;
    std::string summary_json;
};

constexpr const char* kAbout =
    "A live view of a Python's threads and GIL, refreshed every second: per thread its CPU,\n"
    "GIL held and GIL wait shares; per process the GIL's load and waiters; the functions\n"
    "holding the GIL while others wait. perf records as gilscan record --blame does and\n"
    "streams into gilscan (no file). q or Ctrl-C leaves; the probes are removed.";

std::optional<TopRequest> parse_top_args(int argc, char** argv) {
    TopRequest q;
    RecordTarget& g = q.rec.target;
    OptionTable t("gilscan top", "[options] -p PID | [--] PROGRAM [ARGS...]", kAbout);
    t.section("What to watch");
    t.value("-p", "PID", "attach to the running Python PID", [&](const std::string& v) {
        g.pid = cli_number<int32_t>("-p", v, 1, 0x3fffffff);
    });
    t.value("--python", "PATH", "the Python to probe (for wrappers: uv run, poetry run, ...)",
            [&](const std::string& v) { q.rec.python = non_empty("--python", v, "an interpreter or libpython"); });
    t.flag("--no-blame", "no CPU samples or stacks: the GIL figures alone, lighter", [&] { q.rec.blame = false; });
    t.flag("--no-thread-names", "leave a PROGRAM's threads named as Python names them",
           [&] { q.rec.thread_names = false; });
    t.section("How");
    t.value("--interval", "S", "refresh every S seconds (default 1)",
            [&](const std::string& v) { q.interval = cli_seconds("--interval", v, 0.2); });
    t.value("--duration", "S", "stop after S seconds (a PROGRAM then gets SIGINT)",
            [&](const std::string& v) { g.duration = cli_seconds("--duration", v); });
    t.flag("--batch", "plain snapshots one after another on stdout, not a screen (logs, tests)", [&] { q.batch = true; });
    t.flag("--json", "with --batch: one JSON object per interval", [&] { q.json = q.batch = true; });
    t.value("--top", "N", "blamed functions shown (default 10)",
            [&](const std::string& v) { q.top = cli_number<size_t>("--top", v, 1, 1000); });
    t.value("--summary-json", "FILE", "the whole run's summary as JSON, at the end (as gilscan FILE writes it)",
            [&](const std::string& v) { q.summary_json = v; });
    t.operands("PROGRAM", [&](const std::string& v) { g.command.push_back(v); }, /*rest=*/true);
    t.epilogue("Every option in detail: docs/usage.md.");
    if (!t.parse(argc, argv, 2)) return std::nullopt;
    if (g.command.empty() == !g.pid)
        throw UsageError(g.pid ? "-p attaches to a running process: give no PROGRAM with it"
                               : "nothing to watch: gilscan top -p PID, or gilscan top -- python3 app.py");
    return q;
}

// The terminal while the view is on it: the alternate screen, no cursor,
// keys read one at a time without echo (Ctrl-C still signals). Put back as
// it was at the end.
class Screen {
public:
    explicit Screen(bool on) : on_(on && ::isatty(STDOUT_FILENO)) {
        if (!on_) return;
        keys_ = ::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_) == 0;
        if (keys_) {
            termios raw = saved_;
            raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
            raw.c_cc[VMIN] = 0;
            raw.c_cc[VTIME] = 0;
            ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
        }
        std::fputs("\x1b[?1049h\x1b[?25l\x1b[H\x1b[Jgilscan top: starting perf ...\n", stdout);
        std::fflush(stdout);
    }
    ~Screen() {
        if (!on_) return;
        if (keys_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
        std::fputs("\x1b[?25h\x1b[?1049l", stdout);
        std::fflush(stdout);
    }
    Screen(const Screen&) = delete;
    Screen& operator=(const Screen&) = delete;

    bool on() const { return on_; }
    // q (or Q) typed since the last look.
    bool quit_typed() const {
        if (!keys_) return false;
        char c[64];
        const int fl = ::fcntl(STDIN_FILENO, F_GETFL);
        ::fcntl(STDIN_FILENO, F_SETFL, fl | O_NONBLOCK);
        const ssize_t n = ::read(STDIN_FILENO, c, sizeof c);
        ::fcntl(STDIN_FILENO, F_SETFL, fl);
        for (ssize_t i = 0; i < n; ++i)
            if (c[i] == 'q' || c[i] == 'Q') return true;
        return false;
    }
    void draw(const std::string& text) const {
        std::string frame = "\x1b[H";
        for (size_t at = 0; at < text.size();) {
            const size_t nl = text.find('\n', at);
            frame.append(text, at, nl - at);
            frame += "\x1b[K\n";
            at = nl == std::string::npos ? text.size() : nl + 1;
        }
        frame += "\x1b[J";
        std::fwrite(frame.data(), 1, frame.size(), stdout);
        std::fflush(stdout);
    }
    void size(size_t& width, size_t& height) const {
        winsize ws{};
        width = 100, height = 30;
        if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) width = ws.ws_col, height = ws.ws_row;
    }

private:
    bool on_ = false, keys_ = false;
    termios saved_{};
};

// What is watched, for the view's first line.
std::string watched(const TopRequest& q) {
    if (q.rec.target.pid) return "pid " + std::to_string(q.rec.target.pid);
    std::string cmd;
    for (const std::string& a : q.rec.target.command) cmd += (cmd.empty() ? "" : " ") + a;
    return cmd;
}

// The view at each interval, on the analysis's thread.
class Shower {
public:
    Shower(const TopRequest& q, const Screen& screen, std::atomic<bool>& stop)
        : q_(q), screen_(screen), stop_(stop), view_(q.top), what_(watched(q)),
          step_(static_cast<uint64_t>(q.interval * 1e9)), next_(monotonic_ns() + step_) {}

    // Called at every read of a busy stream: the keys are looked at every
    // 100 ms, the figures every interval.
    void on_live(const LiveAnalysis& a) {
        const uint64_t now = monotonic_ns();
        if (now >= next_keys_) {
            next_keys_ = now + 100'000'000;
            if (screen_.quit_typed()) stop_ = true;
        }
        if (now < next_) return;
        LiveFigures f = a.figures(now);
        // Less than half an interval known past the moment shown last (perf
        // has written nothing since, or not been seen to: starved of CPU,
        // say): looked at again at the next call.
        if (f.time < view_.time() + step_ / 2) return;
        next_ = std::max(next_ + step_, now + step_ / 2);
        view_.update(std::move(f));
        show();
    }
    // The end: the last moment is the recording's last event.
    void finish(const FileSummary& fs) {
        if (fs.last_time <= view_.time()) return;
        view_.update(live_figures_of(fs));
        show();
    }

private:
    void show() {
        if (q_.json) {
            std::string line = json_dump(view_.json()) + "\n";
            std::fwrite(line.data(), 1, line.size(), stdout);
            std::fflush(stdout);
        } else if (screen_.on()) {
            size_t w, h;
            screen_.size(w, h);
            screen_.draw(view_.text(w, h - 1, what_) + "(q quits)");
        } else {
            std::string block = view_.text(200, 0, what_) + "\n";
            std::fwrite(block.data(), 1, block.size(), stdout);
            std::fflush(stdout);
        }
    }

    const TopRequest& q_;
    const Screen& screen_;
    std::atomic<bool>& stop_;
    TopView view_;
    std::string what_;
    uint64_t step_, next_, next_keys_ = 0;
};

// The stream's analysis, on a thread of its own: the view at each
// interval, the summary at the end (or the exception, and a stop asked).
struct Analysis {
    std::optional<FileSummary> summary;
    std::exception_ptr failed;
    std::thread thread;

    Analysis(const TopRequest& q, int fd, const std::atomic<uint64_t>& flushed, Shower& shower,
             std::atomic<bool>& stop) {
        thread = std::thread([this, &q, fd, &flushed, &shower, &stop] {
            AnalysisOptions a;
            a.input_fd = fd;  // the session's: closed when it ends, which stops perf if it was early
            a.stream_flushed = &flushed;
            a.display_name = "perf record -o -";
            a.jobs = 1;
            a.blame = q.rec.blame;
            a.blame_top = q.top;
            a.perf_maps = "/tmp";  // where CPython's -X perf writes them
            a.debuginfo_cache = default_debuginfo_cache_dir();
            // The watched process's maps are its user's (a program gilscan runs is gilscan's user's).
            struct stat st {};
            const std::string proc = "/proc/" + std::to_string(q.rec.target.pid);
            a.perf_map_owner = q.rec.target.pid && ::stat(proc.c_str(), &st) == 0 ? st.st_uid : ::geteuid();
            a.on_live = [&shower](const LiveAnalysis& l) { shower.on_live(l); };
            try {
                summary = analyse_recording(a);
            } catch (...) {
                failed = std::current_exception();
                stop = true;
            }
        });
    }
};

// The whole run's table and summary JSON once the view is gone.
void report(const TopRequest& q, const FileSummary& summary, std::optional<OutputFile>& summary_out) {
    if (!q.json) print_summary_table(stdout, summary);
    if (summary_out) {
        write_summary_json(*summary_out, summary);
        summary_out->commit();
    }
}

}  // namespace

int top_main(int argc, char** argv) {
    std::optional<TopRequest> parsed = parse_top_args(argc, argv);
    if (!parsed) return 0;
    TopRequest& q = *parsed;
    std::optional<OutputFile> summary_out;
    if (!q.summary_json.empty()) summary_out.emplace(q.summary_json);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw Error("gilscan top", Error::no_offset, "pipe failed");
    // A wider pipe absorbs the analysis's start (the first stacks load
    // the binaries' unwinding tables) without stalling perf into losing events.
    ::fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    int perf_out = fds[1];
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> flushed{0};  // perf's answers to the pings: every record up to there is in the pipe
    q.rec.target.perf_stdout = &perf_out;
    q.rec.target.flushed_to = &flushed;
    q.rec.target.stop = &stop;
    q.rec.target.live = true;

    std::optional<Screen> screen(std::in_place, !q.batch);
    Shower shower(q, *screen, stop);
    Analysis analysis(q, fds[0], flushed, shower, stop);
    RunOutcome run;
    std::exception_ptr record_failed;
    try {
        run = record_live(q.rec);
    } catch (...) {
        record_failed = std::current_exception();
    }
    if (perf_out >= 0) ::close(perf_out);  // perf never had it: the analysis ends
    analysis.thread.join();
    // A program's end is the recording's; an attached process runs on
    // after perf stops, each of its events disabled at a slightly different
    // moment, so that last stretch is not shown as an interval.
    if (analysis.summary && !q.rec.target.command.empty()) shower.finish(*analysis.summary);
    screen.reset();  // the terminal as it was, for what follows
    if (record_failed) std::rethrow_exception(record_failed);
    if (run.program_not_run) return exit_status(run.program_status);
    if (analysis.failed) std::rethrow_exception(analysis.failed);
    if (analysis.summary) report(q, *analysis.summary, summary_out);
    return q.rec.target.command.empty() ? 0 : exit_status(run.program_status);
}

}  // namespace gilscan
