// Stage: Python 2's GIL, for uprobes (gilscan probe, gilscan record --gil).
//
//   ElfFile elf("/root/.pyenv/versions/2.7.18/lib/libpython2.7.so.1.0");
//   for (const Py2GilSite& s : python2_gil_sites(elf))
//       s.take, s.function, s.at, s.next   // a take in PyEval_EvalFrameEx at 0xf0ed0, returning at 0xf0ed5
//
// Python 2 has no take_gil: ceval.c's interpreter_lock (the GIL) is taken by
// PyThread_acquire_lock and released by PyThread_release_lock, as every
// threading.Lock is, so neither function can be probed as the GIL. The GIL's
// takes and drops are the calls of those two in ceval.c's GIL functions
// (PyEval_EvalFrameEx's switch every 100 bytecodes, PyEval_SaveThread /
// PyEval_RestoreThread around blocking calls, PyEval_AcquireThread and
// PyEval_ReleaseThread for threads that start and end, ...): each call is
// probed where it is made and where it returns (a plain uprobe on the next
// instruction, named take_gil_N__return as a return probe would be: unlike a
// uretprobe, it leaves the return address, and with it the stacks, alone).
// A tail jump (`jmp PyThread_release_lock@plt` in PyEval_ReleaseThread)
// returns to the function's caller: there the whole function is probed,
// entry and return. Calls are found by Capstone over the exported
// functions (extents from their symbols or .eh_frame), to the PLT or
// direct, so a stripped Python 2 is probed alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gilscan/symbols/elf_file.h"

namespace gilscan {

// ceval.c's functions that take interpreter_lock, the GIL (checked against
// objdump on 2.7.18). PyEval_InitThreads creates the lock and takes it;
// PyEval_ReInitThreads makes a new one after fork and takes it: neither
// waits, but without their takes the main thread would hold a GIL it never
// took. A sleep in PyThread_acquire_lock called from one of them is a GIL
// wait (modules.h); their calls of it are the probes' takes.
inline constexpr std::string_view kPy2GilTakers[] = {
    "PyEval_EvalFrameEx", "PyEval_RestoreThread", "PyEval_AcquireThread",
    "PyEval_AcquireLock", "PyEval_InitThreads",   "PyEval_ReInitThreads",
};

// [begin, end) of each part of the function `name`: its symbols (.dynsym,
// and with .symtab a .cold part, by base name), a size-0 symbol's extent
// from its .eh_frame FDE. Sorted, each once.
std::vector<std::pair<uint64_t, uint64_t>> function_parts(const ElfFile& elf, std::string_view name);

struct Py2GilSite {
    bool take = false;     // a take of the GIL (PyThread_acquire_lock), else a drop (PyThread_release_lock)
    std::string function;  // the ceval.c function the call is in
    uint64_t at = 0;       // the call's vaddr; for a tail jump, the function's entry
    uint64_t next = 0;     // where the call returns; 0 for a tail jump (the function's return probed)
    bool next_is_branch_target = false;  // `next` is also reached by a jump (the call skipped)
};

// Takes first, then drops, each in address order. Empty when Capstone is
// missing or this is no Python 2 (is_python2, gil_locator.h).
std::vector<Py2GilSite> python2_gil_sites(const ElfFile& elf);

}  // namespace gilscan
