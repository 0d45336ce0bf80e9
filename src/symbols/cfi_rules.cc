#include "gilscan/symbols/cfi_rules.h"

#include <cstdlib>

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

namespace gilscan {

namespace {

// The location descriptions dwarf_frame_register builds for offset rules:
// DW_OP_call_frame_cfa, then the offset (DW_OP_plus_uconst, or a constant
// and DW_OP_plus), then DW_OP_stack_value when it is a value rather than a
// place in memory. Returns false for anything else.
bool cfa_relative(const Dwarf_Op* ops, size_t n, CfiRule::RegKind& kind, int64_t& offset) {
    if (n == 0 || ops[0].atom != DW_OP_call_frame_cfa) return false;
    size_t i = 1;
    offset = 0;
    if (i < n && ops[i].atom == DW_OP_plus_uconst) {
        offset = static_cast<int64_t>(ops[i].number);  // wraps: libdw stores negative offsets this way
        ++i;
    } else if (i + 1 < n && (ops[i].atom == DW_OP_consts || ops[i].atom == DW_OP_constu) &&
               ops[i + 1].atom == DW_OP_plus) {
        offset = static_cast<int64_t>(ops[i].number);
        i += 2;
    }
    kind = CfiRule::AtCfa;
    if (i < n && ops[i].atom == DW_OP_stack_value) {
        kind = CfiRule::ValCfa;
        ++i;
    }
    return i == n;
}

}  // namespace

CfiRule read_cfi_rule(Dwfl* dwfl, uint64_t pc) {
    CfiRule rule;
    Dwfl_Module* mod = dwfl ? dwfl_addrmodule(dwfl, pc) : nullptr;
    if (!mod) {
        rule.no_module = true;
        return rule;
    }
    // .eh_frame only: libdw tries it first and uses .debug_frame only when it
    // has no answer; those rarer stacks go to libdw whole.
    Dwarf_Addr bias = 0;
    Dwarf_CFI* cfi = dwfl_module_eh_cfi(mod, &bias);
    if (!cfi) return rule;
    Dwarf_Frame* frame = nullptr;
    if (dwarf_cfi_addrframe(cfi, pc - bias, &frame) != 0 || !frame) return rule;
    struct Free {
        Dwarf_Frame* f;
        ~Free() { std::free(f); }
    } free_frame{frame};
    bool signal = false;
    const int ra = dwarf_frame_info(frame, nullptr, nullptr, &signal);
    // A signal frame's caller pc is exact, not a return address: libdw's
    // business. x86-64 CIEs name rip as the return address column.
    rule.signal = signal;
    if (ra != CfiRule::kRa || signal) return rule;
    Dwarf_Op* cfa_ops = nullptr;
    size_t cfa_n = 0;
    if (dwarf_frame_cfa(frame, &cfa_ops, &cfa_n) != 0 || cfa_n != 1) return rule;
    const Dwarf_Op& c = cfa_ops[0];
    if (c.atom == DW_OP_bregx) {
        rule.cfa_reg = static_cast<uint8_t>(c.number);
        rule.cfa_offset = static_cast<int64_t>(c.number2);
        if (c.number >= CfiRule::kRegs) return rule;
    } else if (c.atom >= DW_OP_breg0 && c.atom <= DW_OP_breg16) {
        rule.cfa_reg = static_cast<uint8_t>(c.atom - DW_OP_breg0);
        rule.cfa_offset = static_cast<int64_t>(c.number);
    } else {
        return rule;
    }
    for (int r = 0; r < CfiRule::kRegs; ++r) {
        Dwarf_Op mem[3];
        Dwarf_Op* ops = nullptr;
        size_t n = 0;
        if (dwarf_frame_register(frame, r, mem, &ops, &n) != 0) {
            rule.reg_kind[r] = CfiRule::Unset;  // libdw skips the register: unknown in the caller
            continue;
        }
        if (n == 0) {
            if (ops == mem) rule.reg_kind[r] = CfiRule::Undefined;
            else if (ops == nullptr) rule.reg_kind[r] = CfiRule::Same;
            else rule.reg_kind[r] = CfiRule::Unset;
            continue;
        }
        if (!cfa_relative(ops, n, rule.reg_kind[r], rule.reg_offset[r])) return rule;  // an expression
    }
    make_simple(rule);
    return rule;
}

void make_simple(CfiRule& rule) {
    rule.same = rule.at_cfa = rule.val_cfa = 0;
    for (int r = 0; r < CfiRule::kRegs; ++r) {
        const uint32_t bit = 1u << r;
        if (rule.reg_kind[r] == CfiRule::Same) rule.same |= bit;
        else if (rule.reg_kind[r] == CfiRule::AtCfa) rule.at_cfa |= bit;
        else if (rule.reg_kind[r] == CfiRule::ValCfa) rule.val_cfa |= bit;
    }
    rule.kind = CfiRule::Simple;
}

const CfiRule& CfiRuleCache::at(Dwfl* dwfl, uint64_t pc) {
    auto it = rules_.find(pc);
    if (it != rules_.end()) return it->second;
    // Real stacks meet some thousands of distinct pcs; damaged ones can
    // bring a new garbage pc with every frame. Bounded: start over.
    if (rules_.size() >= kMaxRules) rules_.clear();
    return rules_.emplace(pc, read_cfi_rule(dwfl, pc)).first->second;
}

}  // namespace gilscan
