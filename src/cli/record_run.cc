#include "gilscan/cli/record_run.h"

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gilscan/cli/stderr_relay.h"
#include "gilscan/error.h"

namespace gilscan {

namespace {

volatile sig_atomic_t g_program = 0;  // the program, once let go (0: none, or it has ended)
volatile sig_atomic_t g_stop = 0;     // a signal that stops a recording with no program

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// A terminal's Ctrl-C, Ctrl-\ or hang-up is sent by the kernel (SI_KERNEL)
// to the whole foreground process group, the program included: passing it
// on would deliver it twice. One sent to gilscan alone is passed on.
void on_signal(int sig, siginfo_t* info, void*) {
    const bool from_terminal = info && info->si_code == SI_KERNEL;
    if (g_program > 0) {
        if (sig == SIGTERM || !from_terminal) ::kill(g_program, sig);
    } else {
        g_stop = sig;
    }
}

[[noreturn]] void fail(const std::string& what) { throw Error("gilscan record", Error::no_offset, what); }

// The signal dispositions of the run, restored when it ends. SIGPIPE is
// ignored: the program may die before it is let go.
class RunSignals {
public:
    RunSignals() {
        struct sigaction sa {};
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO;  // no SA_RESTART: the waits below return at once
        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &sa, &old_[i]);
        struct sigaction ign {};
        ign.sa_handler = SIG_IGN;
        ::sigaction(SIGPIPE, &ign, &old_pipe_);
        g_stop = 0;
    }
    ~RunSignals() {
        for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &old_[i], nullptr);
        ::sigaction(SIGPIPE, &old_pipe_, nullptr);
        g_program = 0;
    }
    RunSignals(const RunSignals&) = delete;
    RunSignals& operator=(const RunSignals&) = delete;

private:
    struct sigaction old_[std::size(kForwarded)] {};
    struct sigaction old_pipe_ {};
};

// In a child between fork and exec (async-signal-safe calls only): the
// dispositions a program started from a shell has, and death with gilscan.
bool child_setup(pid_t parent, int stderr_fd) {
    for (int sig : kForwarded) ::signal(sig, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) return false;
    return stderr_fd < 0 || ::dup2(stderr_fd, STDERR_FILENO) >= 0;
}

std::vector<char*> argv_of(std::vector<std::string>& args) {
    std::vector<char*> v;
    for (auto& s : args) v.push_back(s.data());
    v.push_back(nullptr);
    return v;
}

void write_all(int fd, const char* s) {
    for (size_t left = std::strlen(s); left;) {
        const ssize_t n = ::write(fd, s, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        s += n;
        left -= static_cast<size_t>(n);
    }
}

bool reaped(pid_t pid, int& status) {
    pid_t w;
    while ((w = ::waitpid(pid, &status, WNOHANG)) < 0 && errno == EINTR) {}
    return w == pid || w < 0;
}

struct Pipe {
    int fd[2] = {-1, -1};
    Pipe() {
        if (::pipe2(fd, O_CLOEXEC) != 0) fail(std::string("pipe: ") + std::strerror(errno));
    }
    ~Pipe() { close_both(); }
    void close_end(int i) {
        if (fd[i] >= 0) ::close(fd[i]);
        fd[i] = -1;
    }
    void close_both() { close_end(0), close_end(1); }
};

// How the program waits for perf: stopped by the kernel right after its
// exec (PTRACE_TRACEME), so that the exec is not in the recording (perf
// script 6.1 unwinds the stacks of a thread that exec'd while recorded no
// further than one frame); where ptrace is refused (Yama's ptrace_scope 3,
// a seccomp profile), before its exec, on the `go` pipe.
enum class Hold { Traced, BeforeExec };

// The program, forked and held (Hold reported on `report`).
pid_t start_held_program(std::vector<std::string> command, Pipe& go, Pipe& report, int stderr_fd) {
    std::vector<char*> argv = argv_of(command);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
    if (pid != 0) return pid;
    if (!child_setup(parent, stderr_fd)) ::_exit(127);
    ::close(go.fd[1]);
    ::close(report.fd[0]);
    const bool traced = ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) == 0;
    write_all(report.fd[1], traced ? "T" : "H");
    if (!traced) {
        char c = 0;
        ssize_t n;
        while ((n = ::read(go.fd[0], &c, 1)) < 0 && errno == EINTR) {}
        if (n != 1) ::_exit(127);  // perf did not start: gilscan let go of the pipe
    }
    ::execvp(argv[0], argv.data());
    const int err = errno;
    write_all(STDERR_FILENO, "gilscan: error: cannot run ");
    write_all(STDERR_FILENO, argv[0]);
    write_all(STDERR_FILENO, ": ");
    write_all(STDERR_FILENO, std::strerror(err));
    write_all(STDERR_FILENO, "\n");
    ::_exit(127);
}

// How the program is held; for a traced one, waits for the stop after its
// exec. False when it ended instead (its exec failed: status set).
bool wait_held(pid_t program, Pipe& report, Hold& hold, int& status) {
    report.close_end(1);
    char how = 0;
    ssize_t n;
    while ((n = ::read(report.fd[0], &how, 1)) < 0 && errno == EINTR) {}
    hold = how == 'T' ? Hold::Traced : Hold::BeforeExec;
    if (n != 1 || hold == Hold::BeforeExec) return n == 1 || !reaped(program, status);
    pid_t w;
    while ((w = ::waitpid(program, &status, 0)) < 0 && errno == EINTR) {}
    return w == program && WIFSTOPPED(status);
}

// Lets the held program run: detached (its exec's SIGTRAP not delivered),
// or its exec allowed.
void release(pid_t program, Hold hold, Pipe& go) {
    if (hold == Hold::Traced) ::ptrace(PTRACE_DETACH, program, nullptr, nullptr);
    else write_all(go.fd[1], "g");
}

// perf record in a process group of its own, its control channel on ctl
// (commands in) and ack (answers out), stdin /dev/null.
pid_t start_perf(std::vector<std::string> args, Pipe& ctl, Pipe& ack, int stderr_fd, int stdout_fd) {
    args.push_back("--control");
    args.push_back("fd:" + std::to_string(ctl.fd[0]) + "," + std::to_string(ack.fd[1]));
    std::vector<char*> argv = argv_of(args);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
    if (pid != 0) {
        ::setpgid(pid, pid);  // also here: whichever of the two runs first
        return pid;
    }
    ::setpgid(0, 0);
    if (!child_setup(parent, stderr_fd)) ::_exit(127);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    if (stdout_fd >= 0 && ::dup2(stdout_fd, STDOUT_FILENO) < 0) ::_exit(127);
    if (::fcntl(ctl.fd[0], F_SETFD, 0) != 0 || ::fcntl(ack.fd[1], F_SETFD, 0) != 0) ::_exit(127);
    ::execvp("perf", argv.data());
    write_all(STDERR_FILENO, "gilscan: error: cannot run perf: ");
    write_all(STDERR_FILENO, std::strerror(errno));
    write_all(STDERR_FILENO, "\n");
    ::_exit(127);
}

// Waits out one tick: relays stderr when there is a relay, else sleeps. A
// signal ends it early.
void tick(StderrRelay* relay, bool& relay_open) {
    if (relay && relay_open) relay_open = relay->pump(100);
    else ::poll(nullptr, 0, 100);
}

// perf has opened and enabled its events once it answers a ping on its
// control channel (it reads the channel only from its main loop). False
// when perf exits first, or a signal asks to stop.
bool wait_until_recording(pid_t perf, Pipe& ctl, Pipe& ack, StderrRelay* relay, bool& relay_open, int& perf_status,
                          bool& perf_done) {
    write_all(ctl.fd[1], "ping\n");
    for (;;) {
        pollfd p{ack.fd[0], POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) {
            char buf[16];
            const ssize_t n = ::read(ack.fd[0], buf, sizeof buf);
            if (n >= 3 && std::memcmp(buf, "ack", 3) == 0) return true;
            if (n == 0) return false;  // perf closed it: it is exiting
        }
        if (g_stop) return false;
        if (reaped(perf, perf_status)) {
            perf_done = true;
            return false;
        }
        tick(relay, relay_open);
    }
}

// The pings to perf (live: one a tick) and its answers ("ack\n" each, in
// order), read so that its channel never fills. perf handles one command
// per turn of its loop, and each turn reads all its buffers first: the
// answer to a ping proves every record up to the ping before it written.
class PerfPings {
public:
    explicit PerfPings(std::atomic<uint64_t>* flushed_to) : flushed_to_(flushed_to) {}
    void ping(Pipe& ctl, Pipe& ack) {
        sent_.push_back(monotonic_ns());
        write_all(ctl.fd[1], "ping\n");
        char buf[256];
        for (pollfd p{ack.fd[0], POLLIN, 0}; ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);) {
            const ssize_t n = ::read(ack.fd[0], buf, sizeof buf);
            if (n <= 0) break;
            for (ssize_t i = 0; i < n; ++i)
                if (buf[i] == '\n') answered();
        }
    }

private:
    void answered() {
        if (sent_.empty()) return;
        if (before_ && flushed_to_) flushed_to_->store(before_, std::memory_order_release);
        before_ = sent_.front();
        sent_.pop_front();
    }
    std::atomic<uint64_t>* flushed_to_;
    std::deque<uint64_t> sent_;
    uint64_t before_ = 0;  // when the last answered ping was sent (0: none yet)
};

// Until perf and the program (if any) have exited: perf is told to stop
// (SIGINT: it writes what it has) once the program has exited, or, with no
// program, on a signal or at --duration.
void wait_for_end(const RecordTarget& target, pid_t perf, pid_t program, bool perf_done, bool stop_sent,
                  StderrRelay* relay, bool& relay_open, Pipe& ctl, Pipe& ack, RunOutcome& out) {
    const bool has_program = program > 0;
    bool program_done = !has_program, program_interrupted = false;
    const auto start = std::chrono::steady_clock::now();
    PerfPings pings(target.flushed_to);
    while (!(perf_done && program_done)) {
        tick(relay, relay_open);
        if (target.live && !perf_done && !stop_sent) pings.ping(ctl, ack);
        if (!program_done && reaped(program, out.program_status)) {
            program_done = true;
            g_program = 0;
        }
        if (!perf_done && reaped(perf, out.perf_status)) perf_done = true;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const bool timed_out = (target.duration > 0 && elapsed >= target.duration) || (target.stop && *target.stop);
        // A program stopped early ends as after a Ctrl-C: perf stops when it has.
        if (has_program && timed_out && !program_done && !program_interrupted) {
            ::kill(program, SIGINT);
            program_interrupted = true;
        }
        const bool stop = has_program ? program_done : (g_stop || timed_out);
        if (stop && !perf_done && !stop_sent) {
            out.interrupted = !has_program && g_stop && !timed_out;
            ::kill(perf, SIGINT);
            stop_sent = true;
        }
    }
}

}  // namespace

uint64_t monotonic_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

int exit_status(int wait_status) {
    return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : 1;
}

bool left_by_ended_run(const std::string& pid) {
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) return false;
    std::ifstream comm("/proc/" + pid + "/comm");
    std::string name;
    return !(comm >> name && name == "gilscan");
}

RunOutcome run_recording(const std::vector<std::string>& perf_args, const RecordTarget& target, bool quiet) {
    RunOutcome out;
    std::unique_ptr<StderrRelay> relay;
    if (quiet) relay = std::make_unique<StderrRelay>();
    const int child_stderr = relay ? relay->writer() : -1;
    RunSignals signals;
    Pipe go, report, ctl, ack;
    const bool has_program = !target.command.empty();
    Hold hold = Hold::BeforeExec;
    pid_t program = 0;
    if (has_program) {
        program = start_held_program(target.command, go, report, child_stderr);
        go.close_end(0);
        if (!wait_held(program, report, hold, out.program_status)) {
            if (relay) relay->finish();
            out.program_not_run = true;  // its exec failed, and said so on its stderr
            return out;
        }
    }
    std::vector<std::string> args = perf_args;
    if (target.system_wide) args.push_back("-a");
    else args.insert(args.end(), {"-p", std::to_string(has_program ? program : target.pid)});
    const pid_t perf = start_perf(args, ctl, ack, child_stderr, target.perf_stdout ? *target.perf_stdout : -1);
    if (target.perf_stdout && *target.perf_stdout >= 0) {
        ::close(*target.perf_stdout);  // perf's now: its end is the reader's end of input
        *target.perf_stdout = -1;
    }
    ctl.close_end(0);
    ack.close_end(1);
    if (relay) relay->close_writer();

    bool relay_open = true, perf_done = false;
    out.perf_started = wait_until_recording(perf, ctl, ack, relay.get(), relay_open, out.perf_status, perf_done);
    out.interrupted = g_stop != 0;
    if (has_program) {
        if (out.perf_started) {
            g_program = program;
            release(program, hold, go);
        } else {
            ::kill(program, SIGKILL);  // it has not run a line of its own
        }
    }
    go.close_end(1);
    // What a caller waiting for the recording to begin reads (gilscan's
    // Python module); a program's own output is not preceded by it.
    if (out.perf_started && !has_program && !quiet) {
        if (target.system_wide) std::fputs("gilscan: recording the system (Ctrl-C to stop)\n", stderr);
        else std::fprintf(stderr, "gilscan: recording process %d (Ctrl-C to stop)\n", target.pid);
        std::fflush(stderr);
    }
    if (!out.perf_started && !perf_done) ::kill(perf, SIGINT);
    wait_for_end(target, perf, program, perf_done, !out.perf_started, relay.get(), relay_open, ctl, ack, out);
    if (relay) relay->finish();
    return out;
}

}  // namespace gilscan
