// Unwinding helper: the call-frame rules of JIT code from the .eh_frame a
// jitdump recorded for it (jitdump.h, JIT_CODE_UNWINDING_INFO), as the
// rules of a module's code come from libdw (cfi_rules.h).
//
//   std::vector<JitCfiRow> rows = jit_cfi_rows(code);   // code: a JitCode with eh_frame
//   const CfiRule* r = jit_cfi_at(rows, pc - code.start); // nullptr: no rule there
//
// Why: CPython 3.13+'s -X perf_jit trampolines (sub $8,%rsp; call *%rcx;
// add $8,%rsp; ret) keep no frame pointer, so a DWARF unwind without it ends
// at the first of them, as it does under -X perf. Their jitdump records their
// CFI (the CFA is rsp+16 after the sub), which `perf inject --jit` puts in
// each jitted-PID-N.so for perf to unwind through: read here, a sleep's
// stack goes on through every Python function's trampoline, as perf
// script's does on the injected recording.
//
// What is read: one CIE and the FDE after it (a code load's own .eh_frame,
// its pc range taken from the load's start, whatever address the FDE's
// pc_begin encodes), 32-bit lengths, augmentations "", "z", "zR", "zS"
// ("P" and "L" are skipped by their encodings); the instructions
// advance_loc*, offset*, restore*, undefined, same_value, def_cfa*,
// val_offset*, remember/restore_state, GNU_args_size. A DWARF expression,
// a register saved in another register, or anything unknown gives no rows:
// the unwinder then steps by the frame pointer as before. Registers the CFI
// does not name follow x86-64's ABI as libdw does (backends/x86_64_cfi.c):
// rbx, rbp, r12-r15 unchanged, rsp the CFA, the rest undefined.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gilscan/symbols/cfi_rules.h"
#include "gilscan/symbols/jitdump.h"

namespace gilscan {

struct JitCfiRow {
    uint64_t from = 0, to = 0;  // offsets into the code: [from, to)
    CfiRule rule;               // Simple
};

// The rows of code.eh_frame over [0, code.size), by offset; empty when
// there is none or it is not the subset above.
std::vector<JitCfiRow> jit_cfi_rows(const JitCode& code);

// The rule at an offset into the code, or nullptr.
const CfiRule* jit_cfi_at(std::span<const JitCfiRow> rows, uint64_t offset);

}  // namespace gilscan
