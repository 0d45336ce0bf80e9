// How `gilscan record` runs perf and the program, so that the program
// behaves as when run directly.
//
//   RecordTarget t; t.command = {"python3", "app.py"};
//   RunOutcome o = run_recording(perf_args, t, quiet);
//
// The program is gilscan's own child, in gilscan's process group (the
// terminal's foreground group: it reads the terminal, and Ctrl-C reaches it
// as SIGINT, so its KeyboardInterrupt handlers run). It is held, stopped
// just after its exec (PTRACE_TRACEME; where ptrace is refused, just before
// its exec), until perf, attached to it with -p (or recording -a), has its
// events enabled (perf's control channel answers a ping). perf runs in a process
// group of its own, which the terminal's Ctrl-C does not reach: it records
// until the program has exited, and is then told to stop.
//
// Signals to gilscan: a terminal's SIGINT, SIGQUIT or SIGHUP has reached the
// program too and is not passed on; one sent to gilscan alone (kill), and
// SIGTERM, is passed to the program. With no program (attach, -a alone) any
// of them stops the recording, as --duration does. If gilscan dies, perf
// and the program get SIGTERM (PR_SET_PDEATHSIG).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gilscan {

struct RecordTarget {
    std::vector<std::string> command;  // the program gilscan starts (empty: attach or -a alone)
    int32_t pid = 0;                   // -p: the running process to attach to
    bool system_wide = false;          // -a
    double duration = 0;               // --duration: seconds, then stop (0 = none; a program then gets SIGINT)
    // perf's stdout (gilscan top: a pipe it reads perf -o - from), or -1:
    // gilscan's. Taken over: closed in gilscan once perf has it, set to -1.
    int* perf_stdout = nullptr;
    // Asked from gilscan itself (gilscan top's q): set, it stops the run as
    // --duration does. Read at each tick.
    const std::atomic<bool>* stop = nullptr;
    // gilscan top: perf is asked (a ping on its control channel) every tick
    // to write out what its buffers hold, so the stream keeps up with the
    // program within a tick or two whatever the event rate.
    bool live = false;
    // With live: set to the time (CLOCK_MONOTONIC ns, the recording's
    // clock) a ping was sent once perf has answered the next one. perf
    // answers a ping, then reads all its buffers and writes out what they
    // held, before it reads the next: at that answer every record up to
    // the earlier ping is on perf's stdout.
    std::atomic<uint64_t>* flushed_to = nullptr;
};

struct RunOutcome {
    int program_status = 0;   // the program's wait status (0 when there is none)
    int perf_status = 0;      // perf record's wait status
    bool perf_started = false;  // perf answered before the program was let go
    bool interrupted = false;   // stopped by a signal (no program), not by its end or --duration
    bool program_not_run = false;  // the program's exec failed (said on its stderr); perf never started
};

// Whether what a record run named after its pid (pid: the text in the name)
// was left by a run that is gone: pid is a number, and no gilscan runs as
// that pid. (A run killed by SIGKILL cannot clean up; the next one does.)
bool left_by_ended_run(const std::string& pid);

// CLOCK_MONOTONIC now, in ns: the clock of gilscan record's recordings.
uint64_t monotonic_ns();

// A wait status as a shell's $?: the exit code, or 128 + the signal.
int exit_status(int wait_status);

// perf_args: "perf", "record", options and events, without a target; the
// target (-p PID / -a) and the control channel are added here.
RunOutcome run_recording(const std::vector<std::string>& perf_args, const RecordTarget& target, bool quiet);

}  // namespace gilscan
