// Stage: where a function returns to its caller, for probes that fire on
// return without being uretprobes (gilscan probe, gilscan record --gil).
//
//   FunctionExits x = function_exits(elf, take.vaddr, take.vaddr + take.size, plt_stub_names(elf));
//   if (x.unsure.empty()) for (uint64_t a : x.at) ...   // a plain uprobe on each
//
// A uretprobe replaces the return address on the stack of every thread in
// the probed function with a trampoline's, so any stack sampled while it
// runs (a GIL wait inside take_gil, a signal inside drop_gil) stops there:
// neither perf nor gilscan can unwind past it. A plain uprobe on each `ret`
// (and on each tail jump, which leaves for the caller through another
// function) fires at the same moment and leaves the stack alone.
//
// The function's code is its extent plus the cold parts it jumps to (GCC
// moves unlikely blocks to a separate FDE, as Debian's python3.11 does for
// take_gil's fatal-error paths); a jump to another function's entry is a
// tail jump. The two are told apart by the FDE at the target (eh_frame.h).
// When an exit cannot be known for certain (an indirect jump, a conditional
// tail jump, a jump into code with no FDE), `unsure` says which and the
// caller keeps a return probe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gilscan/symbols/elf_file.h"

namespace gilscan {

struct FunctionExits {
    std::vector<uint64_t> at;                          // rets and tail jumps, ascending
    std::vector<std::pair<uint64_t, uint64_t>> parts;  // the code scanned: [start, end), the entry's first
    std::string unsure;                                // why the exits are not all known, or empty
};

FunctionExits function_exits(const ElfFile& elf, uint64_t entry, uint64_t end,
                             const std::map<uint64_t, std::string>& plt);

}  // namespace gilscan
