#include "gilscan/cli/record.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "gilscan/cli/options.h"
#include "gilscan/error.h"
#include "gilscan/gil/probe_plan.h"

namespace gilscan {

namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_resized = 0;

void forward_signal(int sig) {
    if (g_child > 0) ::kill(g_child, sig);
}

void note_resize(int) { g_resized = 1; }

// Our stderr's window size onto the pseudo-terminal pty (either end).
// True when it was set, or when our stderr has none to give.
bool copy_window_size(int pty) {
    winsize ws{};
    return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) != 0 || ::ioctl(pty, TIOCSWINSZ, &ws) == 0;
}

bool on_path(const std::string& cmd) {
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "";
    size_t pos = 0;
    while (pos <= p.size()) {
        size_t c = p.find(':', pos);
        if (c == std::string::npos) c = p.size();
        std::string dir = p.substr(pos, c - pos);
        if (::access((dir + "/" + cmd).c_str(), X_OK) == 0) return true;
        pos = c + 1;
    }
    return false;
}

int paranoid_level() {
    std::ifstream f("/proc/sys/kernel/perf_event_paranoid");
    int v = 2;
    f >> v;
    return v;
}

// perf's stderr (and the program's), from fd, to ours without perf's
// "[ perf record: ... ]" lines (woken up N times, captured and wrote N MB).
// Whatever cannot begin such a line passes at once, so that a progress
// line the program ends with '\r' is not held back.
//
// Until perf (pid; its wait status into status) has exited and fd has
// nothing more (a pipe's end of file, a pseudo-terminal's EIO once every
// writer has closed it): a process the program left running may hold it
// open for as long as it lives, and is not waited for.
//
// pty: fd is a pseudo-terminal's master standing in for our stderr's
// terminal. When that terminal is resized (SIGWINCH, which interrupts the
// poll below) the new size is copied to the pseudo-terminal, where the
// program reads it (os.get_terminal_size(2), a progress bar's width) the
// next time it asks: perf record starts the program with SIGWINCH blocked
// (perf 6.1), so it is not told. Setting the size on a pseudo-terminal that
// is nobody's controlling terminal signals no one.
void filter_perf_lines(int fd, pid_t pid, int& status, bool pty) {
    constexpr std::string_view kPerf = "[ perf record:";
    std::string pending;
    char buf[4096];
    auto emit = [](std::string_view text) {
        while (!text.empty()) {
            const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return;
            text.remove_prefix(static_cast<size_t>(n));
        }
    };
    auto perfs = [&](std::string_view line) { return line.substr(0, kPerf.size()) == kPerf; };
    bool exited = false;
    for (;;) {
        if (pty && g_resized) {
            g_resized = 0;
            copy_window_size(fd);
        }
        pollfd p{fd, POLLIN, 0};
        const int ready = ::poll(&p, 1, exited ? 0 : 100);
        if (ready < 0 && errno == EINTR) continue;  // Ctrl-C, forwarded to perf
        if (ready <= 0) {
            if (exited) break;  // perf is gone and nothing is left to read
            pid_t w;
            while ((w = ::waitpid(pid, &status, WNOHANG)) < 0 && errno == EINTR) {}
            exited = w == pid || w < 0;
            continue;
        }
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        pending.append(buf, static_cast<size_t>(n));
        size_t start = 0;
        for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
            const std::string_view line = std::string_view(pending).substr(start, nl + 1 - start);
            if (!perfs(line)) emit(line);
        }
        pending.erase(0, start);
        // The rest of a line: out now unless it may still become perf's.
        const std::string_view rest = pending;
        if (!rest.empty() && kPerf.substr(0, std::min(rest.size(), kPerf.size())) != rest.substr(0, kPerf.size())) {
            emit(rest);
            pending.clear();
        }
    }
    if (!perfs(pending)) emit(pending);
    if (!exited)
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
}

[[noreturn]] void fail(const std::string& what) { throw Error("gilscan record", Error::no_offset, what); }

// The channel perf's stderr (and the program's) goes through for -q: fds[0]
// is read by filter_perf_lines, fds[1] becomes perf's stderr; both
// close-on-exec. When our stderr is a terminal, a pseudo-terminal of the
// same size, so that the program still finds a terminal there (progress
// bars, colours: isatty(2)); its output processing is off, so the bytes
// come through as written ("\n" not turned into "\r\n"). Otherwise, or if
// no pty can be had, a pipe, as our stderr is not a terminal either.
// True for a pseudo-terminal.
bool open_stderr_relay(int fds[2]) {
    if (::isatty(STDERR_FILENO)) {
        const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (master >= 0 && ::grantpt(master) == 0 && ::unlockpt(master) == 0) {
            char name[128];
            const int slave = ::ptsname_r(master, name, sizeof name) == 0 ? ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC) : -1;
            termios t{};
            if (slave >= 0 && ::tcgetattr(STDERR_FILENO, &t) == 0) {
                t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
                if (::tcsetattr(slave, TCSANOW, &t) == 0 && copy_window_size(slave)) {
                    fds[0] = master;
                    fds[1] = slave;
                    return true;
                }
            }
            if (slave >= 0) ::close(slave);
        }
        if (master >= 0) ::close(master);
    }
    if (::pipe2(fds, O_CLOEXEC) != 0) fail(std::string("pipe: ") + std::strerror(errno));
    return false;
}

}  // namespace

std::vector<std::string> perf_record_args(const std::string& out, bool gil, bool state, bool stacks,
                                          const std::string& probe_group, const std::vector<std::string>& command,
                                          bool cpu_samples) {
    std::vector<std::string> a = {"perf", "record", "-k", "CLOCK_MONOTONIC", "-o", out};
    // GIL blame's on-CPU holders: what each was running, at a rate whose
    // DWARF stacks stay a modest share of the recording.
    if (cpu_samples) a.insert(a.end(), {"-e", "cpu-clock/freq=499,call-graph=dwarf/"});
    if (state) {
        a.insert(a.end(), {"-e", stacks ? "sched:sched_switch/call-graph=dwarf/" : "sched:sched_switch", "-e",
                           "sched:sched_wakeup", "-e", "sched:sched_waking", "-e", "sched:sched_process_fork", "-e",
                           "sched:sched_process_exit"});
    } else if (stacks) {
        a.insert(a.end(), {"-e", "sched:sched_switch/call-graph=dwarf/"});
    }
    if (gil) a.insert(a.end(), {"-e", probe_group + ":*"});
    a.push_back("--");
    a.insert(a.end(), command.begin(), command.end());
    return a;
}

namespace {

// What the command line asks for.
struct RecordRequest {
    RecordResult r;
    bool gil = false, state = false, stacks = false, analyse = true;
    bool no_state = false;        // --no-state: no scheduler tracepoints
    bool keep_probes = false;     // --keep-probes: the GIL uprobes in the shared group, left in place
    std::string python;           // --python PATH: the interpreter the program runs, where the command hides it
    std::string own_group;        // the probe group this run made, removed when it ends
    bool gil_by_default = false;  // neither --gil nor --state given
    bool blame = false;           // --blame: CPU samples with stacks too
    std::vector<std::string> command;
};

constexpr const char* kAbout =
    "Records PROGRAM (python3 script.py, python3 -m module) with perf record -k CLOCK_MONOTONIC,\n"
    "placing the GIL uprobes it needs, then analyses the recording as gilscan FILE does.\n"
    "Default: --gil --state; --state comes with any choice unless --no-state.\n"
    "The program's exit status is gilscan's.";

// Returns nullopt for --help (printed).
std::optional<RecordRequest> parse_record_args(int argc, char** argv) {
    RecordRequest q;
    q.r.data_file = "perf.data";
    q.r.trace = "trace.json";
    OptionTable t("gilscan record", "[options] [--] PROGRAM [ARGS...]", kAbout);
    t.section("What to record");
    t.flag("--gil", "take_gil/drop_gil uprobes on the Python that runs", [&] { q.gil = true; });
    t.flag("--state", "scheduler tracepoints: sleeps, runnable time", [&] { q.state = true; });
    t.flag("--no-state", "no scheduler tracepoints (GIL figures from the uprobes alone)", [&] { q.no_state = true; });
    t.flag("--stacks", "DWARF user stacks on sched_switch (sleeps classified from stacks)", [&] { q.stacks = true; });
    t.flag("--gil-functions", "GIL waits by Python function: --state --stacks, perf support on",
           [&] { q.r.gil_functions = true; });
    t.flag("--blame", "what GIL blame needs: --gil --state --stacks, CPU samples, perf support on",
           [&] { q.blame = true; });
    t.section("Outputs");
    t.value("-o", "FILE", "the perf.data to write (default perf.data)", [&](const std::string& v) { q.r.data_file = v; });
    t.value("--trace", "FILE", "the Chrome trace to write (default trace.json)", [&](const std::string& v) { q.r.trace = v; });
    t.value("--summary-json", "FILE", "the per-thread summary as JSON", [&](const std::string& v) { q.r.summary_json = v; });
    t.value("--summary", "FILE", "the table to FILE (default: stderr; stdout is the program's)",
            [&](const std::string& v) { q.r.summary = v; });
    t.flag("--no-analyse", "only record", [&] { q.analyse = false; });
    t.value("--python", "PATH", "the Python the program runs (for wrappers: uv run, poetry run, ...)",
            [&](const std::string& v) { q.python = non_empty("--python", v, "an interpreter or libpython"); });
    t.flag("--keep-probes", "leave the GIL uprobes in place, in gilscan probe's group (default: removed)",
           [&] { q.keep_probes = true; });
    t.flag("-q", "no table, no notes, none of perf's \"[ perf record: ... ]\" lines", [&] { q.r.quiet = true; });
    t.operands("PROGRAM", [&](const std::string& v) { q.command.push_back(v); }, /*rest=*/true);
    t.epilogue("Every option in detail: docs/usage.md.");
    if (!t.parse(argc, argv, 2)) return std::nullopt;
    if (q.command.empty()) throw UsageError("no program to record: gilscan record -- python3 script.py");
    return q;
}

// --gil-functions and the defaults decide the events.
void choose_events(RecordRequest& q) {
    // The function that waits is the first -X perf trampoline past take_gil
    // on the GIL wait's stack: with --gil too, take_gil's return probes are
    // plain ones on its rets, which leave the stack whole (place_gil_probes
    // refuses where it would need a uretprobe).
    if (q.no_state && (q.state || q.r.gil_functions || q.blame))
        throw UsageError(std::string("--no-state and ") +
                         (q.state ? "--state" : q.blame ? "--blame (it reads the sleeps)" : "--gil-functions (it reads the sleeps)") +
                         " contradict each other");
    if (q.r.gil_functions) q.state = q.stacks = true;
    if (q.blame) {
        // Holders from the uprobes (Python 2's default drops them, as
        // place_gil_probes says), their sleeps' and CPU samples' stacks.
        q.gil = true;
        q.state = q.stacks = true;
    }
    // The sleeps and runnable time are what the table is read by: the
    // scheduler tracepoints come with --gil or --stacks too.
    q.gil_by_default = !q.gil && !q.state;
    if (q.gil_by_default) q.gil = true;
    if (!q.no_state) q.state = true;
}

// The problems users hit, one sentence each with the fix. Returns tracefs.
std::string check_can_record() {
    if (!on_path("perf")) fail("perf is not installed: apt-get install linux-perf (Debian) or linux-tools-$(uname -r) (Ubuntu)");
    if (::geteuid() != 0 && paranoid_level() > -1)
        fail("recording scheduler tracepoints and uprobes needs root or kernel.perf_event_paranoid=-1 (now " +
             std::to_string(paranoid_level()) + "): run as root, or sysctl kernel.perf_event_paranoid=-1");
    try {
        return tracefs_dir(true);
    } catch (const Error& e) {
        fail(std::string("tracefs is needed for tracepoints and uprobes and is missing: ") + e.what());
    }
}

// The command's interpreter: --python when given; past `env` and its
// options and NAME=VALUE settings (`env -u X A=1 python3 x.py`); else the
// command itself (an interpreter, a pyenv shim, a script with a shebang).
std::string command_python(const RecordRequest& q) {
    if (!q.python.empty()) return q.python;
    size_t i = 0;
    if (std::filesystem::path(q.command[0]).filename() == "env") {
        for (i = 1; i < q.command.size(); ++i) {
            const std::string& a = q.command[i];
            if (a == "-u" || a == "-C" || a == "--unset" || a == "--chdir") ++i;  // takes a value
            else if (a.empty() || (a[0] != '-' && a.find('=') == std::string::npos)) break;
        }
        if (i >= q.command.size()) fail("env runs no program here; name the Python with --python PATH");
    }
    return q.command[i];
}

// Places the GIL uprobes for the Python the program runs; returns their
// group ("" when none were placed: Python 2 by default records stacks).
std::string place_gil_probes(RecordRequest& q, const std::string& tracefs) {
    std::string python;
    const std::string what = command_python(q);
    try {
        python = resolve_python_binary(what);
    } catch (const Error& e) {
        fail("no Python found to place GIL probes on (" + std::string(e.what()) + "); " +
             (q.python.empty() ? "a wrapper (uv run, poetry run, ...) hides it: name it with --python PATH, "
                                 "or record without --gil"
                               : "--python names an interpreter or libpython"));
    }
    // A group of this run's own (gilscan_<binary>_<pid>): another run, a
    // `gilscan probe` group or a perf record using either is never touched,
    // and removing it at the end cannot pull probes from under anyone.
    ProbePlan plan = plan_probes(python, q.keep_probes ? "" : default_probe_group(python) + "_" + std::to_string(::getpid()));
    // Python 2 takes and drops its GIL every 100 bytecodes: with four probe
    // hits per switch (py2_gil.h) a spinning thread spends a large share of
    // its time in the probes, which the figures then show as time without
    // the GIL. Its stacks tell its GIL waits at no such cost: by default
    // they are recorded instead; --gil probes it anyway.
    if (q.gil_by_default && plan.python2) {
        q.gil = false;
        q.stacks = true;
        if (!q.r.quiet)
            std::fprintf(stderr, "gilscan: note: %s is Python 2, which switches the GIL every 100 bytecodes, "
                         "too often for uprobes: recording stacks instead (--state --stacks), from which its "
                         "GIL waits are told (--gil probes it anyway)\n",
                         python.c_str());
        return "";
    }
    // A uretprobe swaps the probed function's return address for the
    // kernel's trampoline ([uprobes]) while it runs: every stack sampled
    // inside it then ends there. Plain probes on the rets are placed where
    // every exit is known (exit_sites.h); where not, take_gil keeps one.
    const bool take_uretprobe = std::any_of(plan.probes.begin(), plan.probes.end(), [](const UprobeSpec& p) {
        return p.ret && p.event.rfind("take_gil", 0) == 0;
    });
    if (take_uretprobe && q.r.gil_functions && !plan.python2)
        fail("--gil-functions reads GIL waits' stacks past take_gil, and " + python +
             " needs a return probe (uretprobe) on it, which cuts them short: leave out --gil");
    if (!q.keep_probes) q.own_group = plan.group;
    install_probes(plan, tracefs);
    if (!q.r.quiet) {
        std::fprintf(stderr, "gilscan: GIL probes on %s (group %s)\n", python.c_str(), plan.group.c_str());
        for (const auto& n : plan.loc.notes) std::fprintf(stderr, "gilscan: note: %s\n", n.c_str());
        if (take_uretprobe && q.stacks && !plan.python2)
            std::fputs("gilscan: note: take_gil's return probe ends GIL waits' stacks at take_gil; to see the "
                       "callers that wait, record with --state --stacks instead (and python3 -X perf, 3.12+, "
                       "for Python functions)\n",
                       stderr);
    }
    return plan.group;
}

// Runs perf record on the program, forwarding Ctrl-C and SIGTERM; returns
// its wait status.
int run_perf(const RecordRequest& q, const std::string& group) {
    // -q: perf's own "[ perf record: ... ]" lines are left out, its errors
    // are not (perf's -q would hide those too): perf's stderr becomes a pipe
    // or a pseudo-terminal read here (open_stderr_relay). The program, which
    // perf starts with perf's descriptors, writes there too. (Not wrapped to
    // get the real stderr back: the wrapper's exec would be in the
    // recording, and perf script then unwinds the program's stacks no
    // further than one frame.)
    int err_relay[2] = {-1, -1};
    const bool relay_pty = q.r.quiet && open_stderr_relay(err_relay);
    std::vector<std::string> args =
        perf_record_args(q.r.data_file, q.gil, q.state, q.stacks, group, q.command, q.blame);
    std::vector<char*> cargs;
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);

    // For perf and the program it starts (set here, not between fork and
    // exec, where only async-signal-safe calls belong): CPython 3.12+ then
    // writes /tmp/perf-PID.map (as under -X perf), which names its
    // trampolines; earlier Pythons ignore it, and the analysis says no stack
    // reached a named frame. A value the user set is kept (0 turns it off).
    if (q.r.gil_functions || q.blame) ::setenv("PYTHONPERFSUPPORT", "1", /*overwrite=*/0);
    pid_t pid = ::fork();
    if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        // Only async-signal-safe calls here: dup2 clears FD_CLOEXEC on the copy.
        if (q.r.quiet && ::dup2(err_relay[1], STDERR_FILENO) < 0) ::_exit(127);
        ::execvp("perf", cargs.data());
        std::fprintf(stderr, "gilscan: error: cannot run perf: %s\n", std::strerror(errno));
        ::_exit(127);
    }
    g_child = pid;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    if (relay_pty) {
        struct sigaction wa {};
        wa.sa_handler = note_resize;  // no SA_RESTART: the filter's poll returns at once
        ::sigaction(SIGWINCH, &wa, nullptr);
        g_resized = 1;  // a resize between the relay's opening and here
    }
    int status = 0;
    if (q.r.quiet) {
        ::close(err_relay[1]);
        filter_perf_lines(err_relay[0], pid, status, relay_pty);
        ::close(err_relay[0]);
    } else {
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    }
    g_child = 0;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (relay_pty) signal(SIGWINCH, SIG_DFL);
    return status;
}

}  // namespace

RecordResult record_main(int argc, char** argv) {
    std::optional<RecordRequest> parsed = parse_record_args(argc, argv);
    if (!parsed) return {};  // --help
    RecordRequest& q = *parsed;
    choose_events(q);
    const std::string tracefs = check_can_record();
    const std::string group = q.gil ? place_gil_probes(q, tracefs) : "";
    int status = 0;
    try {
        status = run_perf(q, group);
    } catch (...) {
        if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
        throw;
    }
    // perf has exited: nothing records this run's probes any more.
    if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
    RecordResult r = q.r;
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::error_code ec;
    r.analyse = q.analyse && std::filesystem::file_size(r.data_file, ec) > 0 && !ec;
    if (!r.analyse && q.analyse)
        fail("perf record wrote no recording (exit status " + std::to_string(r.status) + "); see perf's message above");
    return r;
}

}  // namespace gilscan
