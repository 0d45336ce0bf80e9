// Stage: the binaries behind mappings, cached by build-id, with their GIL
// function extents.
//
//   ModuleCache mods({.symfs = "", .expected_build_ids = from_header});
//   const Module* m = mods.get(mapping);   // nullptr: missing or changed binary
//   m->in_take_gil(pc - m->bias_for(mapping))
//   mods.problems()                         // once per module: "not found", "build-id mismatch"
//
// A binary is looked for at the recorded path (only under --symfs when given, as perf does), in
// perf's build-id cache (~/.debug/<path>/<build-id>/elf and
// ~/.debug/.build-id/xx/rest/elf) and under /usr/lib/debug/.build-id. When
// the recording names a build-id (MMAP2's build-id form or the
// HEADER_BUILD_ID feature), a file with another build-id is refused rather
// than guessed from.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string_view>
#include <string>
#include <vector>

#include "gilscan/symbols/elf_file.h"
#include "gilscan/symbols/gil_locator.h"
#include "gilscan/symbols/perf_map.h"
#include "gilscan/symbols/process_maps.h"

namespace gilscan {

class NameStore;

struct AddrRange {
    uint64_t begin = 0, end = 0;  // link-time virtual addresses
    std::string name;
};

struct Module {
    std::string path;       // as recorded
    std::string file;       // where it was found
    std::string build_id;
    std::unique_ptr<ElfFile> elf;
    bool python = false;    // exports the CPython GIL callers
    std::vector<AddrRange> take, drop;  // take_gil / drop_gil extents (clones, .cold parts, inlined copies)
    // Python 2 has no take_gil: its GIL is a plain lock taken by
    // PyThread_acquire_lock, as every threading.Lock is. A wait in it is a
    // GIL wait when called from one of the interpreter's GIL takers
    // (PyEval_EvalFrameEx's periodic switch, PyEval_RestoreThread,
    // PyEval_AcquireThread, ...): the frame above decides.
    std::vector<AddrRange> py2_lock, py2_gil_callers;
    std::string problem;    // why it cannot be used ("" if fine)
    std::string symbols_from;  // separate debug file / MiniDebugInfo the GIL extents came from

    // Load bias for one mapping of this module (runtime = vaddr + bias).
    std::optional<uint64_t> bias_for(const Mapping& m) const;
    const AddrRange* in_take(uint64_t vaddr) const;
    const AddrRange* in_drop(uint64_t vaddr) const;
    const AddrRange* in_py2_lock(uint64_t vaddr) const;
    const AddrRange* in_py2_gil_caller(uint64_t vaddr) const;
};

struct ModuleOptions {
    std::string symfs;                                   // root to look for recorded paths under
    std::map<std::string, std::string> build_ids;        // path -> hex build-id from the header
    std::string home_debug = "";                         // perf's cache (default ~/.debug)
    std::string perf_maps;                               // where perf-PID.map files are ("": none; perf_map.h)
    uid_t perf_map_owner = ::geteuid();                  // whose maps are read besides root's: the recording's user
    std::shared_ptr<NameStore> name_store;               // frame names kept across runs (name_store.h; null: none)
};

// Whether a mapped path names a file a module can be loaded from: not
// [vdso], [anon:...], //anon (JIT code: the -X perf trampolines), memfd,
// SysV shm, a device, a jitdump's marker (jit-PID.dump).
bool names_a_file(std::string_view path);

// Thread-safe: the -j workers share one cache, so each binary is opened,
// parsed and searched for the GIL functions once. Modules never change
// after loading; a hit takes a shared lock and allocates nothing (it runs
// for every unwound frame).
class ModuleCache {
public:
    explicit ModuleCache(ModuleOptions opt);
    // The module for a mapping, or nullptr (problem recorded once per path).
    const Module* get(const Mapping& m);
    // Loads the module for a mapping before anything asks for it (the
    // stages' thread while it waits for its first records: ModulePreloader),
    // without the lock held while it loads. Nothing is recorded: get()
    // adopts the module the first time it is asked for, and records its
    // problem then, so problems() comes out as without a preload. False when
    // there was nothing to load (no file, or loaded already).
    bool preload(const Mapping& m);
    // Modules preloaded and not yet asked for (tests).
    size_t preloaded_unused() const;
    std::vector<std::string> problems() const;
    // The JIT code's symbols (perf maps), read once per process for every thread.
    PerfMaps& perf_maps() { return perf_maps_; }
    // Shared by every unwinder's frame namer made with this cache.
    NameStore* name_store() const { return opt_.name_store.get(); }

private:
    using Table = std::map<std::string, std::unique_ptr<Module>, std::less<>>;
    std::unique_ptr<Module> load(const Mapping& m, const std::string& want_id);
    // The table and key of a mapping's module; false: no file behind it.
    bool key_of(const Mapping& m, std::string_view& want, std::string_view& key, bool& by_id) const;
    ModuleOptions opt_;
    mutable std::shared_mutex mu_;
    Table by_id_;    // by build-id
    Table by_path_;  // by path, when no build-id is known
    Table ahead_by_id_, ahead_by_path_;  // preloaded, not yet asked for (same keys)
    std::vector<std::string> problems_;
    PerfMaps perf_maps_;
};

}  // namespace gilscan
