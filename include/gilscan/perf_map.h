// Stage (part of symbols): the perf maps JIT code leaves for profilers,
// /tmp/perf-PID.map, one "START SIZE NAME" line per function (hex, no 0x).
// CPython 3.12+ run with `-X perf` (or PYTHONPERFSUPPORT=1) writes one: each
// Python function called gets a small trampoline in anonymous executable
// memory, named "py::qualname:/path/file.py".
//
//   PerfMaps maps("/tmp");                           // the directory perf reads them from
//   std::shared_ptr<const PerfMap> m = maps.of_pid(pid);   // read once per pid; never nullptr
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
// Like perf (util/map.c, map__new), a map names only pcs in a process's
// anonymous executable memory (is_jit_mapping()), never a file's pcs: a
// stale map of an earlier process with the same pid can then misname only
// JIT frames. A map file is auxiliary: a line that does not parse is skipped
// and counted (perf skips it too), never an error.
//
// Thread-safe: the -j threads share one PerfMaps; a PerfMap never changes
// once read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gilscan {

struct PerfMapSymbol {
    uint64_t start = 0, size = 0;
    std::string name;
};

class PerfMap {
public:
    // The text of a map file. Lines are "START SIZE NAME" (START and SIZE
    // hex, an optional 0x accepted), the name the rest of the line (it may
    // hold spaces). Lines with no name or a zero size are skipped.
    static PerfMap parse(std::string_view text);

    // The symbol covering pc: of those starting at or below pc, the one
    // starting last; among equal starts, the line written last (a JIT that
    // reuses an address writes its new code's line after the old one).
    // nullptr when that symbol ends at or before pc.
    const PerfMapSymbol* find(uint64_t pc) const;

    size_t size() const { return symbols_.size(); }
    uint64_t skipped_lines() const { return skipped_; }

private:
    std::vector<PerfMapSymbol> symbols_;  // by start; equal starts in file order
    uint64_t skipped_ = 0;
};

// A mapping perf would name from a perf map: anonymous memory, which perf
// records as "//anon" (or "/dev/zero", "/anon_hugepage", a named "[anon:...]").
bool is_jit_mapping(std::string_view path);

class PerfMaps {
public:
    // dir: where the maps are ("/tmp" as perf; "": none read, every map empty).
    explicit PerfMaps(std::string dir) : dir_(std::move(dir)) {}
    // The map of a process, read on first use (an empty map when there is none).
    std::shared_ptr<const PerfMap> of_pid(int32_t pid);
    // One line per map that was wanted and unreadable or had skipped
    // lines, then per missing map, by pid: past kMissingShown of those, one
    // line says how many more.
    std::vector<std::string> problems() const;
    static constexpr size_t kMissingShown = 4;
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    mutable std::mutex mu_;
    std::unordered_map<int32_t, std::shared_ptr<const PerfMap>> by_pid_;
    std::vector<std::string> problems_;
    std::map<int32_t, std::string> missing_;  // pid -> its line
};

}  // namespace gilscan
