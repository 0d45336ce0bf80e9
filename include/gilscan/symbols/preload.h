// Stage (-j 2 and up, with stacks): the binaries of Python processes loaded
// while the stages' thread would otherwise wait for its first records.
//
//   ModulePreloader pre(modules);
//   session.set_mmap_seen([&](const MmapEvent& e) { return pre.on_mmap(e); });  // reader thread
//   session.set_stages_idle([&] { return pre.work(); });                  // stages' thread
//
// Why: the reader hands the stages their first records only when the first
// round is read and ordered, and
// the stages then load libpython, libc and the rest on the first stack they
// unwind (symbols, the GIL functions' extents). The reader
// sees the MMAP records as it reads them, before any ordering: the modules
// they name are loaded in that gap instead. The results are the same either
// way — ModuleCache::preload only moves the loading earlier (get() adopts the
// module and records its problem when it is first asked for) — and so is a
// -j 1 run, which has no gap to fill.
//
// Which maps: executable file maps of processes that map a Python (a file
// named python* or libpython*), from that map on, each path once, at most
// kMaxModules in all. A system-wide recording maps every binary on the
// machine; only a Python process's are unwound through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_set>

#include "gilscan/perfdata/kernel_records.h"
#include "gilscan/symbols/modules.h"

namespace gilscan {

class ModulePreloader {
public:
    static constexpr size_t kMaxModules = 64;
    explicit ModulePreloader(ModuleCache& modules) : modules_(modules) {}

    // The reader thread, for each MMAP/MMAP2 record as it is read: true
    // when it queued a module for work().
    bool on_mmap(const MmapEvent& e);
    // The stages' thread: loads one waiting module. False when none waits.
    bool work();

    // Counts (tests): maps queued, and modules loaded by work().
    size_t queued() const { return queued_; }
    size_t loaded() const;

private:
    ModuleCache& modules_;
    // The reader's alone.
    std::unordered_set<int32_t> python_pids_;
    std::unordered_set<std::string> seen_;
    size_t queued_ = 0;
    // Shared.
    mutable std::mutex mu_;
    std::deque<Mapping> waiting_;
    size_t loaded_ = 0;
};

// Whether a path names a Python interpreter or its library (python3.11,
// libpython3.11.so.1.0, python3.12d): by its last component.
bool is_python_path(std::string_view path);

}  // namespace gilscan
