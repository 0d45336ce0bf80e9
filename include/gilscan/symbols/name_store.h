// Stage helper (unwinding and symbols): the names of frames kept on disk
// per binary, so that a run meeting frames an earlier run named does not
// build libdw's naming state for them again.
//
//   NameStore store(debuginfo_cache_dir());       // "": nothing kept
//   FrameNamer names; names.set_store(&store);    // every thread's namer
//   ... names.describe(frame) ...                  // a hit skips libdw
//   store.save();                                  // the new names, once the run is done
//
// Why: naming a frame in a module through libdw first reads the module's
// address ranges (dwarf_getaranges interns every compilation unit's header:
// glibc's debug file has 2,063), sorts its symbols and indexes its DIEs; at -j 2 each of the
// two threads does so in its own Dwfl. That start-up, not the few dozen
// frames a run names, is most of what naming costs a --sleep-stacks run.
//
// What is kept: per link-time address (pc minus the module's load bias),
// the module's two answers that FrameNamer composes a frame's text from —
// the inlined calls around it, innermost first, and its symbol and offset
// (or none) — never the text itself, which also holds the mapping's name
// and, where nothing names pc, the runtime address.
//
// When an entry is used: the same key, which names the files the answers
// come from as libdwfl found them — the module's build-id, its main file
// and its separate debug file (path, size, modification time, inode; the
// debuginfo cache's own entry of the build-id without its modification
// time, which the cache moves to mark it used), and whether it has DWARF. A file replaced, a debug package installed later
// (the same build-id then gains inline names): another key, the entry is
// not used and is written anew. Modules whose DWARF refers to a second
// file (dwz's .gnu_debugaltlink), without a build-id, or with a tab or
// newline in a path are not kept.
//
// One file per build-id, "names-<build-id>" in the cache directory; answers
// whose names hold a tab or newline are not kept. A malformed file is a
// miss, never an error. The files are entries of the cache like its
// inflated debug files, under the same limit (debuginfo_cache.h): marked
// used when loaded (at most once a day), and the least recently used
// entries removed when one is written and the directory holds more.
// Thread-safe: every thread's FrameNamer asks the one store; what was
// loaded is read without a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gilscan/symbols/debuginfo_cache.h"

struct Dwfl_Module;

namespace gilscan {

// A module's answers at one address: see above.
struct StoredName {
    std::vector<std::string> inlined;  // innermost first, as libdw names them
    bool has_symbol = false;
    std::string symbol;  // as libdw names it (clone suffixes still on)
    uint64_t offset = 0;
};

class NameStore {
public:
    struct Module;  // one module's answers: name_store.cc

    // max_bytes: the cache directory's limit, applied when save() writes
    // (0: none).
    explicit NameStore(std::string dir, uint64_t max_bytes = default_debuginfo_cache_limit());
    ~NameStore();
    NameStore(const NameStore&) = delete;
    NameStore& operator=(const NameStore&) = delete;

    // The answers kept for module m (loaded from disk at its first ask), or
    // nullptr when m cannot be kept (see above) or there is no directory.
    Module* module(Dwfl_Module* m);
    // The answer at pc (runtime) in m, or nullptr.
    const StoredName* find(Module& mod, Dwfl_Module* m, uint64_t pc);
    // An answer libdw gave for pc in m, to be written by save().
    void add(Module& mod, Dwfl_Module* m, uint64_t pc, StoredName name);
    // Writes each module's file that gained answers (aside, then renamed
    // into place). False when a write failed (nothing is half written).
    bool save();

    uint64_t hits() const { return hits_; }
    uint64_t misses() const { return misses_; }

    // The key of module m (empty: not keepable). For the tests.
    static std::string key_of(Dwfl_Module* m);
    // One file's part of a key (false: it cannot be stat'ed, or its path
    // holds a tab or newline); build_id: the module's, hex, when path is its
    // separate debug file. For the tests.
    static bool append_file_id(std::string& out, const char* path, std::string_view build_id);

private:
    std::string dir_;
    uint64_t max_bytes_;
    std::mutex mu_;  // modules_ and each module's added answers
    std::unordered_map<std::string, std::unique_ptr<Module>> modules_;  // by key
    std::atomic<uint64_t> hits_{0}, misses_{0};
};

}  // namespace gilscan
