#include "gilscan/gil/probe_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gilscan/gil/gil_arg.h"
#include "gilscan/symbols/exit_sites.h"
#include "gilscan/symbols/gil_locator.h"
#include "gilscan/symbols/py2_gil.h"

namespace gilscan {

namespace fs = std::filesystem;

namespace {

bool is_elf(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char m[4] = {};
    f.read(m, 4);
    return f && std::memcmp(m, "\x7f" "ELF", 4) == 0;
}

std::string which(const std::string& cmd) {
    if (cmd.find('/') != std::string::npos) return cmd;
    const char* path = std::getenv("PATH");
    std::stringstream ss(path ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(ss, dir, ':')) {
        fs::path p = fs::path(dir.empty() ? "." : dir) / cmd;
        if (::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p)) return p.string();
    }
    throw Error(cmd, Error::no_offset, "not found on PATH");
}

// First line of a script: "#!/usr/bin/env python3" -> "python3".
std::string shebang_interpreter(const std::string& path) {
    std::ifstream f(path);
    std::string line;
    if (!std::getline(f, line) || line.rfind("#!", 0) != 0) return {};
    std::stringstream ss(line.substr(2));
    std::string prog, arg;
    ss >> prog;
    if (fs::path(prog).filename() == "env") {
        while (ss >> arg)
            if (arg[0] != '-') return arg;
        return {};
    }
    return prog;
}

bool exports_gil_callers(const std::string& path) {
    try {
        ElfFile elf(path);
        const ElfSymbol* s = elf.find_symbol("PyEval_RestoreThread");
        return s && s->dynamic && s->defined;
    } catch (const Error&) {
        return false;
    }
}

// Asks the interpreter itself: its real executable and, when it was built
// with --enable-shared, the libpython it loads.
std::string ask_interpreter(const std::string& interp) {
    // Its own argument vector, no shell: a path with quotes or spaces is a path.
    const char* code =
        "import os, sys, sysconfig; v = sysconfig.get_config_var; "
        "print(os.path.realpath(sys.executable)); print(v('Py_ENABLE_SHARED') or 0); "
        "print(os.path.join(v('LIBDIR') or '', v('INSTSONAME') or ''))";
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw Error(interp, Error::no_offset, "cannot run it to find its libpython");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    const char* argv[] = {interp.c_str(), "-c", code, nullptr};
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, interp.c_str(), &fa, nullptr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; rc == 0 && ((n = ::read(out[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR));)
        if (n > 0) text.append(buf, static_cast<size_t>(n));
    ::close(out[0]);
    int status = -1;
    if (rc == 0)
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    std::vector<std::string> lines;
    for (size_t at = 0; at < text.size();) {
        size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        std::string l = text.substr(at, nl - at);
        while (!l.empty() && l.back() == '\r') l.pop_back();
        lines.push_back(l);
        at = nl + 1;
    }
    if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || lines.size() < 3)
        throw Error(interp, Error::no_offset, "is not a Python 3 interpreter that gilscan can ask (run it with -c failed)");
    if (lines[1] != "0" && fs::exists(lines[2])) return fs::canonical(lines[2]).string();
    return lines[0];
}

}  // namespace

std::string UprobeSpec::line() const {
    char off[32];
    std::snprintf(off, sizeof off, "0x%llx", static_cast<unsigned long long>(offset));
    return std::string(ret ? "r:" : "p:") + group + "/" + event + " " + path + ":" + off + (args.empty() ? "" : " " + args);
}

std::string resolve_python_binary(const std::string& what) {
    std::string path = which(what);
    if (!fs::exists(path)) throw Error(path, Error::no_offset, "no such file");
    if (is_elf(path)) {
        std::string real = fs::canonical(path).string();
        if (exports_gil_callers(real)) return real;  // libpython, or a statically linked python
        return ask_interpreter(real);                // a python linked against libpython
    }
    // A script: a pyenv shim (bash that execs python) or a console script.
    std::string interp = shebang_interpreter(path);
    std::string base = fs::path(path).filename().string();
    if (!interp.empty() && fs::path(interp).filename().string().rfind("python", 0) == 0)
        return resolve_python_binary(interp);
    if (base.rfind("python", 0) == 0) return ask_interpreter(path);  // a shim named python*: it forwards -c
    throw Error(path, Error::no_offset,
                "cannot tell which Python this script runs; name the interpreter or libpython instead");
}

std::string default_probe_group(const std::string& binary) {
    std::string base = fs::path(binary).filename().string();
    for (const char* suffix : {".so.1.0", ".so"}) {
        size_t p = base.find(suffix);
        if (p != std::string::npos) base = base.substr(0, p);
    }
    std::string g = kProbeGroupPrefix;
    for (char ch : base) g += std::isalnum(static_cast<unsigned char>(ch)) ? static_cast<char>(std::tolower(ch)) : '_';
    return g.substr(0, 48);
}

namespace {

// Python 2 (py2_gil.h): the calls of PyThread_acquire_lock and
// PyThread_release_lock in ceval.c's GIL functions, each probed where it is
// made and where it returns, named as take_gil / drop_gil probes are, so
// that the analysis reads them alike.
void plan_python2(const ElfFile& elf, ProbePlan& plan) {
    const auto sites = python2_gil_sites(elf);
    const auto takes = std::count_if(sites.begin(), sites.end(), [](const Py2GilSite& s) { return s.take; });
    if (takes == 0)
        throw Error(plan.binary, Error::no_offset,
                    "Python 2: no call of PyThread_acquire_lock found in ceval.c's GIL functions" +
                        std::string(capstone_available() ? "" : " (install the capstone library)") +
                        "; record stacks instead (gilscan record --state --stacks)");
    plan.python2 = true;
    plan.loc.notes.clear();
    plan.loc.notes.push_back("Python 2: no take_gil; its GIL (interpreter_lock) is taken and dropped by the calls of "
                             "PyThread_acquire_lock / PyThread_release_lock in ceval.c's GIL functions, each probed "
                             "where it is made and where it returns (not a uretprobe: stacks stay whole). It "
                             "switches every 100 bytecodes: four probe hits per switch slow a busy program, and "
                             "their time shows as time without the GIL; stacks (--state --stacks) cost far less");
    unsigned n[2] = {0, 0};
    for (const auto& s : sites) {
        const char* base = s.take ? "take_gil" : "drop_gil";
        unsigned& i = n[s.take];
        const std::string ev = i == 0 ? base : std::string(base) + "_" + std::to_string(i);
        ++i;
        auto off = elf.vaddr_to_offset(s.at);
        auto next = s.next ? elf.vaddr_to_offset(s.next) : off;
        if (!off || !next) throw Error(plan.binary, Error::no_offset, "a GIL call site is not in a loaded segment");
        GilFunction f;
        f.name = s.take ? "PyThread_acquire_lock" : "PyThread_release_lock";
        f.vaddr = s.at;
        f.size = s.next ? s.next - s.at : 0;
        f.how = s.next ? "called in " + s.function + ", probed there and where it returns"
                       : "tail jump in " + s.function + ": that function probed, entry and return";
        // Where the call returns may also be where a branch that skips it
        // lands (SaveThread's `if (interpreter_lock)`): a drop's return
        // without its drop changes nothing; a take's would read as a take
        // whose entry was lost, so the reader is told.
        if (s.next_is_branch_target) {
            f.how += " (a branch lands there too)";
            if (s.take)
                plan.loc.notes.push_back(ev + "__return: a branch in " + s.function +
                                         " lands where the call returns, which then counts as a return without "
                                         "its take (an anomaly the summary reports)");
        }
        (s.take ? plan.loc.take : plan.loc.drop).push_back(f);
        plan.probes.push_back({plan.group, ev, plan.binary, *off, false, {}});
        // A tail jump's function: a return probe on it. A call: a plain probe where it returns.
        plan.probes.push_back({plan.group, ev + "__return", plan.binary, *next, s.next == 0, {}});
    }
}

// The return probes of one function: a plain uprobe on each of its exits
// (exit_sites.h: a uretprobe would cut every stack sampled inside it),
// named <ev>__return, <ev>__return_1, ...; a uretprobe when its exits
// cannot all be known, and a note that says so.
void add_returns(const ElfFile& elf, const std::map<uint64_t, std::string>& plt, const GilFunction& f,
                 const std::string& ev, ProbePlan& plan) {
    FunctionExits exits;
    if (f.size) exits = function_exits(elf, f.vaddr, f.vaddr + f.size, plt);
    else exits.unsure = "its extent is unknown";
    std::vector<uint64_t> offsets;
    for (uint64_t a : exits.at)
        if (auto off = elf.vaddr_to_offset(a)) offsets.push_back(*off);
        else exits.unsure = "an exit is not in a loaded segment";
    if (!exits.unsure.empty()) {
        plan.loc.notes.push_back(ev + "__return: a return probe (uretprobe), as its exits are not all known (" +
                                 exits.unsure + "): stacks sampled inside " + f.name + " stop there");
        plan.probes.push_back({plan.group, ev + "__return", plan.binary, *elf.vaddr_to_offset(f.vaddr), true, {}});
        return;
    }
    for (size_t k = 0; k < offsets.size(); ++k)
        plan.probes.push_back({plan.group, ev + "__return" + (k ? "_" + std::to_string(k) : ""), plan.binary,
                               offsets[k], false, {}});
}

}  // namespace

ProbePlan plan_probes(const std::string& binary, const std::string& group) {
    ElfFile elf(binary);
    ProbePlan plan;
    plan.binary = binary;
    plan.group = group.empty() ? default_probe_group(binary) : group;
    plan.loc = locate_gil(elf);
    if (plan.loc.take.empty() && is_python2(elf)) {
        plan_python2(elf, plan);
        return plan;
    }
    if (plan.loc.take.empty()) {
        std::string why = plan.loc.notes.empty() ? "take_gil not found" : plan.loc.notes.back();
        throw Error(binary, Error::no_offset, why);
    }
    const auto plt = plt_stub_names(elf);
    auto add = [&](const std::vector<GilFunction>& fns, const char* base) {
        for (size_t i = 0; i < fns.size(); ++i) {
            auto off = elf.vaddr_to_offset(fns[i].vaddr);
            if (!off) throw Error(binary, Error::no_offset, std::string(base) + " address is not in a loaded segment");
            // perf's naming: take_gil, take_gil_1, ... and <name>__return
            std::string ev = i == 0 ? base : std::string(base) + "_" + std::to_string(i);
            // Which GIL: the take_gil entry probe reads it (gil_arg.h); the
            // return and drop_gil probes act on the thread's last take (a
            // return probe's registers are the callee's). Only the uncloned
            // function has the ABI's arguments.
            std::string args;
            if (std::string_view(base) == "take_gil" && fns[i].name == base && !fns[i].inlined) {
                std::string why;
                if (auto a = gil_arg_path(binary, base, fns[i].vaddr, &why)) {
                    args = a->fetcharg();
                    plan.loc.notes.push_back(std::string(base) + " reads which GIL: " + args);
                } else {
                    plan.loc.notes.push_back(std::string(base) + ": one GIL per process assumed (" + why + ")");
                }
            }
            plan.probes.push_back({plan.group, ev, binary, *off, false, args});
            if (!fns[i].site) add_returns(elf, plt, fns[i], ev, plan);  // a release point has nothing to return from
        }
    };
    add(plan.loc.take, "take_gil");
    add(plan.loc.drop, "drop_gil");
    return plan;
}

std::string tracefs_dir(bool mount_if_needed) {
    std::error_code ec;  // a non-root user may not even stat these
    for (const char* d : {"/sys/kernel/tracing", "/sys/kernel/debug/tracing"})
        if (fs::exists(std::string(d) + "/uprobe_events", ec)) return d;
    if (::geteuid() != 0 && (fs::exists("/sys/kernel/tracing", ec) || ec))
        throw Error("tracefs", Error::no_offset, "not accessible to this user: run as root (uprobes need root)");
    if (mount_if_needed && ::geteuid() == 0) {
        if (::mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nullptr) == 0 &&
            fs::exists("/sys/kernel/tracing/uprobe_events", ec))
            return "/sys/kernel/tracing";
    }
    throw Error("tracefs", Error::no_offset,
                ::geteuid() == 0 ? "not mounted and could not be mounted: mount -t tracefs nodev /sys/kernel/tracing"
                                 : "not available to this user: run as root (uprobes need root)");
}

namespace {

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path);
    std::vector<std::string> out;
    std::string l;
    while (std::getline(f, l)) out.push_back(l);
    return out;
}

void append_line(const std::string& file, const std::string& line) {
    // One write() per line on an O_APPEND descriptor: that is how tracefs
    // takes commands (stdio's "a" mode is refused there).
    int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        throw Error(file, Error::no_offset,
                    std::string("cannot open: ") + std::strerror(e) +
                        (e == EACCES || e == EPERM ? " (run as root, or use --print)" : ""));
    }
    std::string l = line + "\n";
    ssize_t n = ::write(fd, l.data(), l.size());
    int e = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(l.size()))
        throw Error(file, Error::no_offset,
                    "'" + line + "' refused: " + std::strerror(e) +
                        (e == EBUSY ? " (the probe is in use: stop the perf record using it)" : ""));
}

// "p:group/event /path:0x1234" -> "group/event"
std::string probe_key(const std::string& line) {
    size_t colon = line.find(':');
    size_t sp = line.find(' ');
    if (colon == std::string::npos || sp == std::string::npos || sp < colon) return {};
    return line.substr(colon + 1, sp - colon - 1);
}

}  // namespace

std::vector<std::string> install_probes(const ProbePlan& plan, const std::string& tracefs) {
    const std::string file = tracefs + "/uprobe_events";
    std::vector<std::string> existing = read_lines(file), written;
    for (const auto& p : plan.probes) {
        std::string want = p.line();
        std::string key = p.group + "/" + p.event;
        bool same = false;
        for (const auto& l : existing) {
            if (probe_key(l) != key) continue;
            // "p:group/event PATH:0xOFF [ARGS]". The kernel prints offsets
            // zero-padded: compare by parsed value; the fetch arguments as
            // written (a probe without them reads no GIL address).
            const std::string rest = l.substr(l.find(' ') + 1);
            const size_t sp = rest.find(' ');
            const std::string target = rest.substr(0, sp);
            const std::string args = sp == std::string::npos ? "" : rest.substr(sp + 1);
            const size_t c = target.rfind(':');
            unsigned long long off = c == std::string::npos ? 0 : std::strtoull(target.c_str() + c + 1, nullptr, 16);
            std::string path = target.substr(0, c);
            if (path == p.path && off == p.offset && (l[0] == 'r') == p.ret && args == p.args) same = true;
            else append_line(file, "-:" + key);
        }
        if (same) continue;
        append_line(file, want);
        written.push_back(want);
    }
    return written;
}

size_t remove_probes(const std::string& group, const std::string& tracefs) {
    const std::string file = tracefs + "/uprobe_events";
    size_t n = 0;
    for (const auto& l : read_lines(file)) {
        std::string key = probe_key(l);
        std::string g = key.substr(0, key.find('/'));
        if (group.empty() ? g.rfind(kProbeGroupPrefix, 0) == 0 : g == group) {
            try {
                append_line(file, "-:" + key);
                ++n;
            } catch (const Error& e) {  // EBUSY: a running perf records it; left to that run
                std::fprintf(stderr, "gilscan: %s: not removed: %s\n", key.c_str(), e.what());
            }
        }
    }
    return n;
}

}  // namespace gilscan
