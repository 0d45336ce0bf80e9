// Stage (part of symbols): the perf maps JIT code leaves for profilers,
// /tmp/perf-PID.map, one "START SIZE NAME" line per function (hex, no 0x).
// CPython 3.12+ run with `-X perf` (or PYTHONPERFSUPPORT=1) writes one: each
// Python function called gets a small trampoline in anonymous executable
// memory, named "py::qualname:/path/file.py".
//
//   PerfMaps maps("/tmp");                           // the directory perf reads them from
//   std::shared_ptr<const PerfMap> m = maps.of(as);  // read once per pid; never nullptr
//   if (const PerfMapSymbol* s = m->find(pc)) ... s->name, pc - s->start
//   maps.problems()                                  // "no perf map /tmp/perf-123.map ..."
//
// Why: a sleep stack through a -X perf trampoline otherwise shows
// "0x7f... (anon)" where the Python function that waits for the GIL is. On
// a CPython built without frame pointers (pyenv's, Debian's) a DWARF unwind
// also ends at that frame: the trampoline (sub $8,%rsp; call *%rcx; ...)
// has no CFI and keeps no frame pointer, so the innermost Python function
// is the one a stack can name, as in `perf script`.
//
// A jitdump (jitdump.h) names a process's JIT code the same way where it
// left no perf map: CPython 3.13+'s -X perf_jit writes /tmp/jit-PID.dump,
// which perf reads only through `perf inject --jit`.
//
// Like perf (util/map.c, map__new), a map names only pcs in a process's
// anonymous executable memory (is_jit_mapping()), never a file's pcs. Unlike
// perf, a map or jitdump none of whose symbols lies in the process's recorded
// JIT memory is not used for it (a problem line says so): it was left by an
// earlier process with the same pid (pids wrap at pid_max, and CPython never
// removes its map), whose JIT code was elsewhere (ASLR); the next place is
// looked in. A map file is auxiliary: a line that does not parse is skipped
// and counted (perf skips it too), never an error.
//
// Processes in containers (pid and mount namespaces) and services with a
// private /tmp leave their maps where the host's /tmp does not show them;
// while such a process still runs, its map is read through its own root,
// as perf does (live_process.h). A jitdump is also found by the path the
// process mapped it at (named by the pid it saw), as `perf inject --jit`
// finds it, in the directory or at that path.
//
// Thread-safe: the -j threads share one PerfMaps; a PerfMap never changes
// once read.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include <utility>

#include "gilscan/symbols/jit_cfi.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/process_maps.h"

namespace gilscan {

struct PerfMapSymbol {
    uint64_t start = 0, size = 0;
    std::string name;
    uint32_t cfi_first = 0, cfi_count = 0;  // its rows in PerfMap's CFI (a jitdump's code with unwinding info)
};

class PerfMap {
public:
    // The text of a map file. Lines are "START SIZE NAME" (START and SIZE
    // hex, an optional 0x accepted), the name the rest of the line (it may
    // hold spaces). Lines with no name or a zero size are skipped.
    static PerfMap parse(std::string_view text);
    // A jitdump's codes (jitdump.h), named as a map of them would be; a
    // later load at the same start wins, as a later line does.
    static PerfMap from_jitdump(const JitDump& d);

    // The symbol covering pc: of those starting at or below pc, the one
    // starting last; among equal starts, the line written last (a JIT that
    // reuses an address writes its new code's line after the old one).
    // nullptr when that symbol ends at or before pc.
    const PerfMapSymbol* find(uint64_t pc) const;

    // The call-frame rule at pc from a jitdump's unwinding info
    // (jit_cfi.h), or nullptr (none recorded for that code, or a perf map).
    const CfiRule* cfi_at(uint64_t pc) const;

    // Whether a symbol overlaps one of the ranges [start, end) (by start).
    bool names_any(std::span<const std::pair<uint64_t, uint64_t>> ranges) const;

    size_t size() const { return symbols_.size(); }
    uint64_t skipped_lines() const { return skipped_; }
    // The file's name, as a frame's text names it: "perf-PID.map" or
    // "jit-PID.dump" (PerfMaps::of_pid; "" for one parsed from text).
    const std::string& source() const { return source_; }
    void set_source(std::string s) { source_ = std::move(s); }

private:
    std::vector<PerfMapSymbol> symbols_;  // by start; equal starts in file order
    uint64_t skipped_ = 0;
    std::string source_;
    std::vector<JitCfiRow> cfi_;
};

// A mapping perf would name from a perf map: anonymous memory, which perf
// records as "//anon" (or "/dev/zero", "/anon_hugepage", a named "[anon:...]").
bool is_jit_mapping(std::string_view path);

class PerfMaps {
public:
    // dir: where the maps are ("/tmp" as perf; "": none read, every map
    // empty). proc: where procfs is (another directory in tests).
    explicit PerfMaps(std::string dir, std::string proc = "/proc")
        : dir_(std::move(dir)), proc_(std::move(proc)), owner_(::geteuid()) {}
    // The map of the process of an address space, read on first use (an
    // empty map when there is none), the first found of:
    //   DIR/perf-PID.map;
    //   DIR/jit-PID.dump (CPython 3.13+'s -X perf_jit writes that instead, jitdump.h);
    //   while the process still runs (live_process.h), the same two in its
    //   own /tmp, named by its pid there (PROC/PID/root/tmp/perf-NSPID.map);
    //   the jitdump it mapped (jit-N.dump, N the pid it saw): DIR/jit-N.dump,
    //   then the mapped path itself. (A forked child keeps its parent's
    //   mapping beside its own: the first by address is read.)
    // A file with symbols, none of them in the space's JIT mappings, is
    // another process's: passed over.
    std::shared_ptr<const PerfMap> of(const AddressSpace& as);
    // gilscan top: a process still running writes to its map (or jitdump)
    // as it meets new functions. Forgets the pid's map when its file in the
    // directory has grown since it was read (looked at most every 200 ms
    // per pid), so that the next of() reads it again; true then.
    bool forget_if_grown(int32_t pid);
    // The same for a pid alone: the directory's two files only.
    std::shared_ptr<const PerfMap> of_pid(int32_t pid) { return lookup(pid, {}, {}); }
    // One line per map that was wanted and unreadable or had skipped
    // lines, then per missing map, by pid: past kMissingShown of those, one
    // line says how many more.
    std::vector<std::string> problems() const;
    static constexpr size_t kMissingShown = 4;
    const std::string& dir() const { return dir_; }
    // Whose maps are read besides root's (open_foreign_file): the
    // recording's user. Default: gilscan's own.
    void set_owner(uid_t uid) { owner_ = uid; }
    static constexpr uint64_t kMaxMapBytes = 256ull << 20;   // read whole
    static constexpr uint64_t kMaxDumpBytes = 16ull << 30;   // mapped

private:
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    // jit: the process's JIT mappings, [start, end) by start (none: of_pid,
    // nothing to check a file against).
    std::shared_ptr<const PerfMap> lookup(int32_t pid, std::string_view marker, const Ranges& jit);
    // Under mu_: whether out, just read from path, can be process pid's
    // (names_any(jit), or nothing to tell by); if not, it is emptied and a
    // problem line says why.
    bool plausible(PerfMap& out, const std::string& path, int32_t pid, const Ranges& jit);
    // Under mu_: a map or jitdump read into out and plausible for pid (err:
    // why a map is not: an errno, or kAnotherProcess).
    static constexpr int kAnotherProcess = -1;
    bool map_at(const std::string& file, std::string name, PerfMap& out, int& err, int32_t pid, const Ranges& jit);
    bool dump_at(const std::string& file, std::string name, PerfMap& out, int32_t pid, const Ranges& jit);
    // Under mu_: the running process's own /tmp, by its pid there; the
    // jitdump it mapped. Where else was looked, when found in neither, is
    // appended to also.
    bool in_live_tmp(int32_t pid, const Ranges& jit, PerfMap& out, std::string& also);
    bool mapped_dump(std::string_view marker, const std::string& dump_name, int32_t pid, const Ranges& jit, PerfMap& out,
                     std::string& also);
    // Under mu_: the file read into out when it can be opened (its trouble
    // kept in problems_); err: why not.
    bool read_map(const std::string& path, std::string name, PerfMap& out, int& err);
    bool read_dump(const std::string& path, std::string name, PerfMap& out);

    std::string dir_, proc_;
    uid_t owner_;
    mutable std::mutex mu_;
    std::unordered_map<int32_t, std::shared_ptr<const PerfMap>> by_pid_;
    struct Seen {  // forget_if_grown: the files' sizes when read, and when last looked at
        uint64_t map_size = 0, dump_size = 0;
        std::chrono::steady_clock::time_point looked{};
    };
    std::unordered_map<int32_t, Seen> seen_;
    std::vector<std::string> problems_;
    std::map<int32_t, std::string> missing_;  // pid -> its line
};

}  // namespace gilscan
