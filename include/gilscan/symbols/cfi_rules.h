// Unwinding helper: the call-frame rules at one pc, read once from the
// module's .eh_frame through libdw and kept, so that a frame of a stack
// already seen costs a hash lookup and a few loads instead of libdw's FDE
// search, CIE/FDE interpretation and a malloc per frame.
//
//   CfiRuleCache rules;
//   const CfiRule& r = rules.at(dwfl, pc);   // pc: exact (initial frame) or return address - 1
//   if (r.kind == CfiRule::Simple) { cfa = regs[r.cfa_reg] + r.cfa_offset; ... }
//   rules.clear();                            // when modules were added to the Dwfl
//
// Only what libdw's own unwinder (libdwfl/frame_unwind.c, handle_cfi) would
// do with the same rules is described: the CFA as register + offset, and
// each register undefined, same-value, saved at CFA + n, or equal to
// CFA + n. Anything else (no module or FDE, a signal frame, DWARF
// expressions, .debug_frame only) is `Other`: the caller hands that stack
// to libdw, which has the full machinery (and the frame-pointer fallback).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

struct Dwfl;

namespace gilscan {

struct CfiRule {
    enum Kind : uint8_t { Other, Simple };
    // How the caller's value of a register is found (x86-64 DWARF numbering, 0..16).
    enum RegKind : uint8_t {
        Unset,      // libdw could not tell: the caller's register is unknown
        Undefined,  // call-clobbered ("undefined"): for the return address, the outermost frame
        Same,       // unchanged from this frame
        AtCfa,      // saved in memory at CFA + offset
        ValCfa,     // equals CFA + offset
    };
    static constexpr int kRegs = 17;
    // The return address column: rip. A CIE that names another is Other, so
    // the caller's pc is always its register 16.
    static constexpr int kRa = 16;
    Kind kind = Other;
    bool signal = false;  // Other because the FDE is a signal frame's
    bool no_module = false;  // Other because no module covers the pc: libdw steps by the frame pointer
    uint8_t cfa_reg = 0;
    int64_t cfa_offset = 0;
    RegKind reg_kind[kRegs] = {};
    int64_t reg_offset[kRegs] = {};
    // reg_kind as bit masks (bit r: register r), set for Simple rules: a
    // frame then touches only the registers its rule changes (a loop over
    // all 17 with a switch on each was 8% of a DWARF capture's instructions).
    uint32_t same = 0, at_cfa = 0, val_cfa = 0;
};

class CfiRuleCache {
public:
    const CfiRule& at(Dwfl* dwfl, uint64_t pc);
    void clear() { rules_.clear(); }
    size_t size() const { return rules_.size(); }

private:
    static constexpr size_t kMaxRules = 1u << 18;  // about 50 MB of rules at most
    std::unordered_map<uint64_t, CfiRule> rules_;  // by runtime pc (one cache per address-space layout)
};

// The rule at pc from libdw, uncached (exposed for tests).
CfiRule read_cfi_rule(Dwfl* dwfl, uint64_t pc);

// A rule whose cfa_* and reg_kind/reg_offset are set made Simple: its
// same/at_cfa/val_cfa masks from reg_kind (jit_cfi.h builds rules too).
void make_simple(CfiRule& rule);

}  // namespace gilscan
