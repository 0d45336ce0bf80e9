// Stage helper: the .eh_frame FDE that covers a pc, found through
// .eh_frame_hdr's sorted table, for the disassembly paths of the GIL
// locator (a function's extent when stripped, where its cold part is).
//
//   if (auto f = fde_at(elf, pc)) f->start, f->end, f->at_start
//
// at_start tells what the frame is where the FDE begins. A function's own
// FDE starts at its entry: the CIE's rules (CFA = rsp + 8, the return
// address at CFA - 8) hold until its first push, so its instructions begin
// with an advance. A compiler's cold part (take_gil.cold, split off by
// -freorder-blocks-and-partition) runs inside its parent's frame, so its FDE
// restates that frame before any advance (Debian's python3.11: "def_cfa_offset
// 144" and the saved registers). That is how a jump to another function
// (a tail call) is told from a jump to the function's own cold code.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "gilscan/symbols/elf_file.h"

namespace gilscan {

struct Fde {
    enum Frame : uint8_t {
        Entry,    // the CIE's standard entry rules hold at start: a function's entry
        Inside,   // rules restated before any advance: code inside another frame (a cold part)
        Unknown,  // a CIE other than the standard x86-64 one, or instructions not read
    };
    uint64_t start = 0, end = 0;
    Frame at_start = Unknown;
};

// The FDE covering pc, or nullopt (no .eh_frame_hdr, no FDE there, or an
// encoding this reader does not take). Malformed tables give nullopt, never throw.
std::optional<Fde> fde_at(const ElfFile& elf, uint64_t pc);

// [start, end) of the FDE that covers pc.
std::optional<std::pair<uint64_t, uint64_t>> fde_range(const ElfFile& elf, uint64_t pc);

}  // namespace gilscan
