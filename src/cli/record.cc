#include "gilscan/cli/record.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include <sys/wait.h>
#include <unistd.h>

#include "gilscan/cli/options.h"
#include "gilscan/cli/record_access.h"
#include "gilscan/cli/record_run.h"
#include "gilscan/cli/thread_names.h"
#include "gilscan/error.h"
#include "gilscan/gil/probe_plan.h"

namespace gilscan {

namespace {

bool on_path(const std::string& cmd) {
    if (cmd.find('/') != std::string::npos) return ::access(cmd.c_str(), X_OK) == 0;
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

[[noreturn]] void fail(const std::string& what) { throw Error("gilscan record", Error::no_offset, what); }

// Between the binary's name and the pid in the group a record run makes.
constexpr const char* kOwnGroupMark = "_pid";

}  // namespace

std::vector<std::string> perf_record_args(const std::string& out, bool gil, bool state, bool stacks,
                                          const std::string& probe_group, bool cpu_samples) {
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
    return a;
}

namespace {

// What the command line asks for.
struct RecordRequest {
    RecordResult r;
    RecordTarget target;
    bool gil = false, state = false, stacks = false, analyse = true;
    bool no_state = false;        // --no-state: no scheduler tracepoints
    bool keep_probes = false;     // --keep-probes: the GIL uprobes in the shared group, left in place
    bool thread_names = true;     // the startup hook that names threads (thread_names.h)
    std::string python;           // --python PATH: the interpreter the program runs, where the command hides it
    std::string own_group;        // the probe group this run made, removed when it ends
    bool gil_by_default = false;  // neither --gil nor --state given
    bool blame = false;           // --blame: CPU samples with stacks too
};

constexpr const char* kAbout =
    "Records PROGRAM (python3 script.py, python3 -m module), or a running Python (-p PID),\n"
    "or the whole system (-a), with perf record -k CLOCK_MONOTONIC, placing the GIL uprobes\n"
    "it needs, then analyses the recording as gilscan FILE does.\n"
    "Default: --gil --state; --state comes with any choice unless --no-state.\n"
    "Ctrl-C reaches the program as SIGINT; gilscan waits for it and exits with its status.";

int32_t parse_pid(const std::string& v) {
    char* end = nullptr;
    const long p = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || p <= 0 || p > 0x3fffffff) throw UsageError("-p needs a process id, not " + v);
    return static_cast<int32_t>(p);
}

void add_target_options(OptionTable& t, RecordRequest& q) {
    t.section("What to record it from");
    t.value("-p", "PID", "attach to the running process PID (until it exits, Ctrl-C or --duration)",
            [&](const std::string& v) { q.target.pid = parse_pid(v); });
    t.flag("-a", "the whole system, while PROGRAM runs (or until Ctrl-C or --duration)",
           [&] { q.target.system_wide = true; });
    t.value("--duration", "S", "stop after S seconds (-p, or -a with no PROGRAM)",
            [&](const std::string& v) { q.target.duration = cli_seconds("--duration", v); });
    t.value("--python", "PATH", "the Python to probe (for wrappers: uv run, poetry run, ...; and -a)",
            [&](const std::string& v) { q.python = non_empty("--python", v, "an interpreter or libpython"); });
    t.flag("--no-thread-names", "leave threads named as Python names them (< 3.14: after the process)",
           [&] { q.thread_names = false; });
}

// Returns nullopt for --help (printed).
std::optional<RecordRequest> parse_record_args(int argc, char** argv) {
    RecordRequest q;
    q.r.data_file = "perf.data";
    q.r.trace = "trace.json";
    OptionTable t("gilscan record", "[options] [--] PROGRAM [ARGS...] | -p PID | -a", kAbout);
    t.section("What to record");
    t.flag("--gil", "take_gil/drop_gil uprobes on the Python that runs", [&] { q.gil = true; });
    t.flag("--state", "scheduler tracepoints: sleeps, runnable time", [&] { q.state = true; });
    t.flag("--no-state", "no scheduler tracepoints (GIL figures from the uprobes alone)", [&] { q.no_state = true; });
    t.flag("--stacks", "DWARF user stacks on sched_switch (sleeps classified from stacks)", [&] { q.stacks = true; });
    t.flag("--gil-functions", "GIL waits by Python function: --state --stacks, perf support on",
           [&] { q.r.gil_functions = true; });
    t.flag("--blame", "what GIL blame needs: --gil --state --stacks, CPU samples, perf support on",
           [&] { q.blame = true; });
    add_target_options(t, q);
    t.section("Outputs");
    t.value("-o", "FILE", "the perf.data to write (default perf.data)", [&](const std::string& v) { q.r.data_file = v; });
    t.value("--trace", "FILE", "the Chrome trace to write (default trace.json)", [&](const std::string& v) { q.r.trace = v; });
    t.value("--summary-json", "FILE", "the per-thread summary as JSON", [&](const std::string& v) { q.r.summary_json = v; });
    t.value("--summary", "FILE", "the table to FILE (default: stderr; stdout is the program's)",
            [&](const std::string& v) { q.r.summary = v; });
    t.flag("--viztracer", "the trace laid out to merge with a VizTracer trace (viztracer --combine)",
           [&] { q.r.viztracer = true; });
    t.flag("--no-analyse", "only record", [&] { q.analyse = false; });
    t.flag("--keep-probes", "leave the GIL uprobes in place, in gilscan probe's group (default: removed)",
           [&] { q.keep_probes = true; });
    t.flag("-q", "no table, no notes, none of perf's \"[ perf record: ... ]\" lines", [&] { q.r.quiet = true; });
    t.operands("PROGRAM", [&](const std::string& v) { q.target.command.push_back(v); }, /*rest=*/true);
    t.epilogue("Every option in detail: docs/usage.md.");
    if (!t.parse(argc, argv, 2)) return std::nullopt;
    const RecordTarget& g = q.target;
    if (g.command.empty() && !g.pid && !g.system_wide)
        throw UsageError("nothing to record: gilscan record -- python3 script.py, -p PID, or -a");
    if (g.pid && (!g.command.empty() || g.system_wide))
        throw UsageError("-p attaches to a running process: give no PROGRAM and no -a with it");
    if (q.r.viztracer) require_json_trace("--trace", q.r.trace);
    if (g.duration > 0 && !g.command.empty())
        throw UsageError("--duration stops a recording that has no PROGRAM (-p, -a); a PROGRAM's ends when it exits");
    return q;
}

// --gil-functions and the defaults decide the events.
void choose_events(RecordRequest& q) {
    // The function that waits is the first -X perf trampoline past take_gil
    // on the GIL wait's stack: with --gil too, take_gil's return probes are
    // plain ones on its rets, which leave the stack whole (plan_gil_probes
    // refuses where it would need a uretprobe).
    if (q.no_state && (q.state || q.r.gil_functions || q.blame))
        throw UsageError(std::string("--no-state and ") +
                         (q.state ? "--state" : q.blame ? "--blame (it reads the sleeps)" : "--gil-functions (it reads the sleeps)") +
                         " contradict each other");
    if (q.r.gil_functions) q.state = q.stacks = true;
    if (q.blame) {
        // Holders from the uprobes (Python 2's default drops them, as
        // plan_gil_probes says), their sleeps' and CPU samples' stacks.
        q.gil = true;
        q.state = q.stacks = true;
    }
    // The sleeps and runnable time are what the table is read by: the
    // scheduler tracepoints come with --gil or --stacks too.
    q.gil_by_default = !q.gil && !q.state;
    if (q.gil_by_default) q.gil = true;
    if (!q.no_state) q.state = true;
    if (q.no_state && !q.gil && !q.stacks) throw UsageError("--no-state leaves nothing to record: add --gil or --stacks");
}

// The command's interpreter: past `env` and its options and NAME=VALUE
// settings (`env -u X A=1 python3 x.py`); else the command itself (an
// interpreter, a pyenv shim, a script with a shebang).
std::string command_python(const std::vector<std::string>& command) {
    size_t i = 0;
    if (std::filesystem::path(command[0]).filename() == "env") {
        for (i = 1; i < command.size(); ++i) {
            const std::string& a = command[i];
            if (a == "-u" || a == "-C" || a == "--unset" || a == "--chdir") ++i;  // takes a value
            else if (a.empty() || (a[0] != '-' && a.find('=') == std::string::npos)) break;
        }
        if (i >= command.size()) fail("env runs no program here; name the Python with --python PATH");
    }
    return command[i];
}

// A running process's Python: the libpython it has mapped, else its
// executable, both as the process sees them (through /proc/PID/root, for
// a process in another mount namespace).
std::string attached_python(int32_t pid) {
    const std::string proc = "/proc/" + std::to_string(pid);
    std::ifstream maps(proc + "/maps");
    if (!maps) fail("no process " + std::to_string(pid) + " to attach to (or /proc/" + std::to_string(pid) + "/maps is not readable)");
    for (std::string line; std::getline(maps, line);) {
        const size_t slash = line.find('/');
        if (slash == std::string::npos) continue;
        const std::string path = line.substr(slash);
        const std::string name = std::filesystem::path(path).filename().string();
        if (name.rfind("libpython", 0) == 0 && name.find(".so") != std::string::npos) return proc + "/root" + path;
    }
    std::error_code ec;
    const std::string exe = std::filesystem::read_symlink(proc + "/exe", ec).string();
    if (ec || exe.empty()) fail("cannot read " + proc + "/exe: name the Python with --python PATH");
    return proc + "/root" + exe;
}

// The Python the GIL probes go on ("" for -a with no program and no --python).
std::string python_to_probe(const RecordRequest& q) {
    if (!q.python.empty()) return q.python;
    if (!q.target.command.empty()) return command_python(q.target.command);
    if (q.target.pid) return attached_python(q.target.pid);
    return "";
}

// The GIL uprobes' plan for the Python the program runs, or nullopt when
// none are placed (Python 2 by default records stacks; -a alone by default
// has no Python to probe).
std::optional<ProbePlan> plan_gil_probes(RecordRequest& q) {
    const std::string what = python_to_probe(q);
    if (what.empty()) {
        if (!q.gil_by_default) fail("-a with no PROGRAM probes the Python --python PATH names; give it, or leave out --gil");
        q.gil = false;
        if (!q.r.quiet)
            std::fputs("gilscan: note: -a with no PROGRAM and no --python PATH: recording the scheduler only "
                       "(--python names the Python whose GIL to probe)\n", stderr);
        return std::nullopt;
    }
    std::string python;
    try {
        python = resolve_python_binary(what);
    } catch (const Error& e) {
        fail("no Python found to place GIL probes on (" + std::string(e.what()) + "); " +
             (q.python.empty() ? "a wrapper (uv run, poetry run, ...) hides it: name it with --python PATH, "
                                 "or record without --gil"
                               : "--python names an interpreter or libpython"));
    }
    // A group of this run's own (gilscan_<binary>_pid<pid>): another run, a
    // `gilscan probe` group or a perf record using either is never touched,
    // and removing it at the end cannot pull probes from under anyone.
    const bool own = !q.keep_probes && ::geteuid() == 0;
    ProbePlan plan = plan_probes(python, own ? default_probe_group(python) + kOwnGroupMark + std::to_string(::getpid()) : "");
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
        return std::nullopt;
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
    if (take_uretprobe && q.stacks && !plan.python2 && !q.r.quiet)
        std::fputs("gilscan: note: take_gil's return probe ends GIL waits' stacks at take_gil; to see the "
                   "callers that wait, record with --state --stacks instead (and python3 -X perf, 3.12+, "
                   "for Python functions)\n",
                   stderr);
    return plan;
}

// The groups record runs made that are still there because their gilscan
// was killed (SIGKILL leaves no time to remove them): a group whose run's
// pid is no longer a gilscan. Returns how many were removed.
size_t remove_stale_groups(const std::string& tracefs) {
    size_t removed = 0;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(tracefs + "/events", ec), end; !ec && it != end; it.increment(ec)) {
        const std::string g = it->path().filename().string();
        const size_t mark = g.rfind(kOwnGroupMark);
        if (g.rfind(kProbeGroupPrefix, 0) != 0 || mark == std::string::npos) continue;
        if (left_by_ended_run(g.substr(mark + std::strlen(kOwnGroupMark))))
            removed += remove_probes(g, tracefs) ? 1 : 0;
    }
    return removed;
}

// Every probe of the plan already in tracefs (placed by gilscan probe).
bool probes_in_place(const ProbePlan& plan, const std::string& tracefs) {
    std::error_code ec;
    for (const UprobeSpec& p : plan.probes)
        if (!std::filesystem::exists(tracefs + "/events/" + plan.group + "/" + p.event, ec)) return false;
    return !plan.probes.empty();
}

// Where tracefs is mounted, from /proc/mounts ("" when it is not): a user
// who may not look inside it still learns where it is.
std::string tracefs_mount_point() {
    std::ifstream mounts("/proc/mounts");
    for (std::string dev, dir, type, rest; mounts >> dev >> dir >> type && std::getline(mounts, rest);)
        if (type == "tracefs") return dir;
    return "";
}

std::string tracefs_or_fail() {
    if (!on_path("perf")) fail("perf is not installed: apt-get install linux-perf (Debian) or linux-tools-$(uname -r) (Ubuntu)");
    try {
        return tracefs_dir(true);
    } catch (const Error& e) {
        // Not root: what it may not read is one of the permission lines.
        if (::geteuid() != 0 && !tracefs_mount_point().empty()) return tracefs_mount_point();
        fail(std::string("tracefs is needed for tracepoints and uprobes and is missing: ") + e.what());
    }
}

// The permissions the recording needs, each missing one in a line of its
// own with its fix (record_access.h); then the probes, placed.
void fail_if_missing(const AccessNeeds& needs) {
    const std::vector<std::string> missing = missing_permissions(needs);
    if (missing.empty()) return;
    std::string all = "cannot record, " + std::to_string(missing.size()) + " permission(s) missing:";
    for (const std::string& m : missing) all += "\n  - " + m;
    fail(all);
}

std::string prepare(RecordRequest& q, const std::string& tracefs) {
    AccessNeeds needs;
    needs.tracefs = tracefs;
    needs.attach_pid = q.target.pid;
    if (q.target.pid) {
        // Another user's process does not show its maps: say what is missing
        // before looking for its Python there.
        const std::string proc = "/proc/" + std::to_string(q.target.pid);
        if (::access(proc.c_str(), F_OK) != 0) fail("no process " + std::to_string(q.target.pid) + " to attach to");
        needs.place_uprobes = q.gil && ::geteuid() != 0;
        if (!std::ifstream(proc + "/maps")) fail_if_missing(needs);  // (its mode says 0444 all the same)
    }
    std::optional<ProbePlan> plan = q.gil ? plan_gil_probes(q) : std::nullopt;
    const bool placed = plan && ::geteuid() != 0 && probes_in_place(*plan, tracefs);
    needs.place_uprobes = plan && !placed;
    needs.python = plan ? plan->binary : "";
    fail_if_missing(needs);
    if (!q.target.command.empty() && !on_path(q.target.command[0]))
        fail("no program " + q.target.command[0] + " to run (not found, or not executable)");
    if (!plan) return "";
    if (!placed) {
        if (::geteuid() == 0) remove_stale_groups(tracefs);
        install_probes(*plan, tracefs);
        if (!q.keep_probes) q.own_group = plan->group;
    }
    if (!q.r.quiet) {
        std::fprintf(stderr, "gilscan: GIL probes on %s (group %s%s)\n", plan->binary.c_str(), plan->group.c_str(),
                     placed ? ", placed by gilscan probe" : "");
        for (const auto& n : plan->loc.notes) std::fprintf(stderr, "gilscan: note: %s\n", n.c_str());
    }
    return plan->group;
}

// perf record on the target, with the thread-name hook for a Python
// program (thread_names.h) and perf support for stacks that name Python
// functions. Returns how the run went.
RunOutcome run_perf(const RecordRequest& q, const std::string& group) {
    std::vector<std::string> args = perf_record_args(q.r.data_file, q.gil, q.state, q.stacks, group, q.blame);
    // Live (gilscan top): 8 MiB of ring buffer per CPU, where perf's default
    // is 512 KiB, so a moment in which the analysis falls behind (a slow
    // spell of the machine) does not make perf drop events. Root only: an
    // unprivileged user's locked memory is limited (perf_event_mlock_kb).
    if (q.target.live && ::geteuid() == 0) args.insert(args.begin() + 2, {"-m", "8M"});
    // A recording of the program's tasks (not -a) sees a thread switched in
    // by another process's task only through a switch record, which perf
    // writes in the task's own context: with them, running and waiting for
    // a CPU are exact (timeline.h).
    if (q.state && !q.target.system_wide) args.push_back("--switch-events");
    // CPython 3.12+ then writes /tmp/perf-PID.map (as under -X perf), which
    // names its trampolines; earlier Pythons ignore it, and the analysis
    // says no stack reached a named frame. A value the user set is kept (0
    // turns it off).
    if (q.r.gil_functions || q.blame) ::setenv("PYTHONPERFSUPPORT", "1", /*overwrite=*/0);
    std::unique_ptr<ThreadNameHook> hook;
    if (q.thread_names && !q.target.command.empty()) hook = std::make_unique<ThreadNameHook>();
    return run_recording(args, q.target, q.r.quiet);
}

}  // namespace

RunOutcome record_live(const LiveRecordRequest& req) {
    RecordRequest q;
    q.target = req.target;
    q.python = req.python;
    q.blame = req.blame;
    q.gil = true;
    q.thread_names = req.thread_names;
    q.r.data_file = "-";
    q.r.quiet = true;
    choose_events(q);
    const std::string tracefs = tracefs_or_fail();
    RunOutcome run;
    try {
        run = run_perf(q, prepare(q, tracefs));
    } catch (...) {
        if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
        throw;
    }
    if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
    if (!run.perf_started && !run.program_not_run) {
        if (run.interrupted) fail("interrupted before perf record had started");
        fail("perf record did not start (exit status " + std::to_string(exit_status(run.perf_status)) + ")");
    }
    return run;
}

RecordResult record_main(int argc, char** argv) {
    std::optional<RecordRequest> parsed = parse_record_args(argc, argv);
    if (!parsed) return {};  // --help
    RecordRequest& q = *parsed;
    choose_events(q);
    const std::string tracefs = tracefs_or_fail();
    RunOutcome run;
    try {
        const std::string group = prepare(q, tracefs);
        run = run_perf(q, group);
    } catch (...) {
        if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
        throw;
    }
    // perf has exited: nothing records this run's probes any more.
    if (!q.own_group.empty()) remove_probes(q.own_group, tracefs);
    RecordResult r = q.r;
    r.status = q.target.command.empty() ? 0 : exit_status(run.program_status);
    if (run.program_not_run) return r;  // nothing recorded; the program said why
    if (!run.perf_started) {
        if (run.interrupted) fail("interrupted before perf record had started; nothing was recorded");
        fail("perf record did not start (exit status " + std::to_string(exit_status(run.perf_status)) +
             "); see its message above");
    }
    std::error_code ec;
    r.analyse = q.analyse && std::filesystem::file_size(r.data_file, ec) > 0 && !ec;
    if (!r.analyse && q.analyse)
        fail("perf record wrote no recording (exit status " + std::to_string(exit_status(run.perf_status)) +
             "); see perf's message above");
    return r;
}

}  // namespace gilscan
