#include "gilscan/symbols/jit_cfi.h"

#include <algorithm>
#include <string>

#include "gilscan/error.h"
#include "gilscan/symbols/dwarf_cfi.h"

namespace gilscan {

namespace {

// DWARF call frame instructions (DWARF 5, 6.4.2; dwarf.h's DW_CFA_*).
constexpr uint8_t DW_CFA_advance_loc = 0x40, DW_CFA_offset = 0x80, DW_CFA_restore = 0xc0;
constexpr uint8_t DW_CFA_nop = 0x00, DW_CFA_advance_loc1 = 0x02, DW_CFA_advance_loc2 = 0x03,
                  DW_CFA_advance_loc4 = 0x04, DW_CFA_offset_extended = 0x05, DW_CFA_restore_extended = 0x06,
                  DW_CFA_undefined = 0x07, DW_CFA_same_value = 0x08, DW_CFA_remember_state = 0x0a,
                  DW_CFA_restore_state = 0x0b, DW_CFA_def_cfa = 0x0c, DW_CFA_def_cfa_register = 0x0d,
                  DW_CFA_def_cfa_offset = 0x0e, DW_CFA_offset_extended_sf = 0x11, DW_CFA_def_cfa_sf = 0x12,
                  DW_CFA_def_cfa_offset_sf = 0x13, DW_CFA_val_offset = 0x14, DW_CFA_val_offset_sf = 0x15,
                  DW_CFA_GNU_args_size = 0x2e, DW_CFA_GNU_negative_offset_extended = 0x2f;

struct Unsupported {};  // not the subset jit_cfi.h reads: no rows

// v * align, wrapping as the unwinder's unsigned address arithmetic does
// (a damaged FDE's huge factored offset must not be signed overflow).
int64_t scaled(uint64_t v, int64_t align) {
    return static_cast<int64_t>(v * static_cast<uint64_t>(align));
}

int reg_of(uint64_t r) {
    if (r >= static_cast<uint64_t>(CfiRule::kRegs)) throw Unsupported{};
    return static_cast<int>(r);
}

// The state the instructions change: the CFA and each register's rule.
struct State {
    uint8_t cfa_reg = 7;
    int64_t cfa_offset = 8;
    CfiRule::RegKind kind[CfiRule::kRegs] = {};
    int64_t offset[CfiRule::kRegs] = {};
};

State abi_initial() {
    // x86-64's ABI as libdw's backend states it before any CIE: the CFA is
    // rsp + 8, rsp's caller value the CFA, the callee-saved registers kept,
    // the rest undefined.
    State s;
    for (auto& k : s.kind) k = CfiRule::Undefined;
    for (int r : {3, 6, 12, 13, 14, 15}) s.kind[r] = CfiRule::Same;
    s.kind[7] = CfiRule::ValCfa;
    s.offset[7] = 0;
    return s;
}

CfiRule rule_of(const State& s) {
    CfiRule rule;
    rule.cfa_reg = s.cfa_reg;
    rule.cfa_offset = s.cfa_offset;
    for (int r = 0; r < CfiRule::kRegs; ++r) {
        rule.reg_kind[r] = s.kind[r];
        rule.reg_offset[r] = s.offset[r];
    }
    make_simple(rule);
    return rule;
}

using Cie = CieHeader;

// Runs instructions from state s. With rows, each location's state is
// appended as a row (a CIE's initial instructions have none: no advance).
void run(Bytes ins, const Cie& cie, const State& initial, State& s, uint64_t& loc, std::vector<JitCfiRow>* rows,
         const std::string& name) {
    Cursor c(ins, false, &name, 0);
    std::vector<State> saved;
    auto advance = [&](uint64_t delta) {
        const uint64_t to = loc + delta * cie.code_align;
        if (!rows) throw Unsupported{};  // a CIE that advances: not this subset
        if (to < loc || (cie.code_align && delta > ~uint64_t{0} / cie.code_align)) throw Unsupported{};  // wraps
        if (to > loc) rows->push_back({loc, to, rule_of(s)});
        loc = to;
    };
    while (c.left() > 0) {
        const uint8_t op = c.read<uint8_t>();
        const uint8_t high = op & 0xc0, low = op & 0x3f;
        if (high == DW_CFA_advance_loc) {
            advance(low);
        } else if (high == DW_CFA_offset) {
            const int r = reg_of(low);
            s.kind[r] = CfiRule::AtCfa;
            s.offset[r] = scaled(read_uleb128(c), cie.data_align);
        } else if (high == DW_CFA_restore) {
            const int r = reg_of(low);  // checked before initial's registers are read
            s.kind[r] = initial.kind[r];
            s.offset[r] = initial.offset[r];
        } else {
            switch (op) {
            case DW_CFA_nop: break;
            case DW_CFA_advance_loc1: advance(c.read<uint8_t>()); break;
            case DW_CFA_advance_loc2: advance(c.read<uint16_t>()); break;
            case DW_CFA_advance_loc4: advance(c.read<uint32_t>()); break;
            case DW_CFA_offset_extended: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = CfiRule::AtCfa;
                s.offset[r] = scaled(read_uleb128(c), cie.data_align);
                break;
            }
            case DW_CFA_offset_extended_sf: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = CfiRule::AtCfa;
                s.offset[r] = scaled(static_cast<uint64_t>(read_sleb128(c)), cie.data_align);
                break;
            }
            case DW_CFA_GNU_negative_offset_extended: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = CfiRule::AtCfa;
                s.offset[r] = scaled(0 - read_uleb128(c), cie.data_align);
                break;
            }
            case DW_CFA_val_offset: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = CfiRule::ValCfa;
                s.offset[r] = scaled(read_uleb128(c), cie.data_align);
                break;
            }
            case DW_CFA_val_offset_sf: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = CfiRule::ValCfa;
                s.offset[r] = scaled(static_cast<uint64_t>(read_sleb128(c)), cie.data_align);
                break;
            }
            case DW_CFA_restore_extended: {
                const int r = reg_of(read_uleb128(c));
                s.kind[r] = initial.kind[r];
                s.offset[r] = initial.offset[r];
                break;
            }
            case DW_CFA_undefined: s.kind[reg_of(read_uleb128(c))] = CfiRule::Undefined; break;
            case DW_CFA_same_value: s.kind[reg_of(read_uleb128(c))] = CfiRule::Same; break;
            case DW_CFA_remember_state:
                if (saved.size() >= 64) throw Unsupported{};
                saved.push_back(s);
                break;
            case DW_CFA_restore_state: {
                if (saved.empty()) throw Unsupported{};
                s = saved.back();  // the whole row, CFA too, as GCC and libdw have it
                saved.pop_back();
                break;
            }
            case DW_CFA_def_cfa:
                s.cfa_reg = static_cast<uint8_t>(reg_of(read_uleb128(c)));
                s.cfa_offset = static_cast<int64_t>(read_uleb128(c));
                break;
            case DW_CFA_def_cfa_sf:
                s.cfa_reg = static_cast<uint8_t>(reg_of(read_uleb128(c)));
                s.cfa_offset = scaled(static_cast<uint64_t>(read_sleb128(c)), cie.data_align);
                break;
            case DW_CFA_def_cfa_register: s.cfa_reg = static_cast<uint8_t>(reg_of(read_uleb128(c))); break;
            case DW_CFA_def_cfa_offset: s.cfa_offset = static_cast<int64_t>(read_uleb128(c)); break;
            case DW_CFA_def_cfa_offset_sf: s.cfa_offset = scaled(static_cast<uint64_t>(read_sleb128(c)), cie.data_align); break;
            case DW_CFA_GNU_args_size: read_uleb128(c); break;
            default: throw Unsupported{};  // expressions, register rules, set_loc, vendor ops
            }
        }
    }
}

// The subset this reader takes: x86-64's return address column, no signal frame.
Cie read_cie(Cursor& c, uint64_t length) {
    const uint64_t at = c.offset();
    Cursor b(c.bytes(length), false, c.file(), at);
    const std::optional<CieHeader> cie = read_cie_header(b);
    if (!cie || cie->ra_reg != CfiRule::kRa || cie->signal_frame) throw Unsupported{};
    return *cie;
}

}  // namespace

std::vector<JitCfiRow> jit_cfi_rows(const JitCode& code) {
    std::vector<JitCfiRow> rows;
    if (code.eh_frame.size() <= code.eh_frame_hdr_size) return rows;
    const std::string name = code.name;
    const Bytes frame(code.eh_frame.data(), code.eh_frame.size() - code.eh_frame_hdr_size);
    try {
        Cursor c(frame, false, &name, 0);
        // The CIE first, then the FDE that points back to it.
        const uint32_t cie_len = c.read<uint32_t>();
        if (cie_len == 0 || cie_len == 0xffffffff) return rows;  // 64-bit DWARF: not written by JITs
        const Cie cie = read_cie(c, cie_len);
        const uint64_t fde_at = c.offset();
        const uint32_t fde_len = c.read<uint32_t>();
        if (fde_len < 4 || fde_len == 0xffffffff) return rows;
        Cursor f(c.bytes(fde_len), false, &name, fde_at + 4);
        const uint32_t cie_ptr = f.read<uint32_t>();
        if (cie_ptr != fde_at + 4) return rows;  // not the CIE above (its pointer is the distance back to it)
        read_encoded_pointer(f, cie.fde_enc);  // pc_begin: the code's start, wherever the JIT meant the .eh_frame to lie
        const uint64_t range = read_encoded_pointer(f, static_cast<uint8_t>(cie.fde_enc & 0x0f));
        if (cie.z) f.skip(read_uleb128(f));
        State initial = abi_initial();
        uint64_t loc = 0;
        run(cie.instructions, cie, abi_initial(), initial, loc, nullptr, name);
        State s = initial;
        run(f.rest(), cie, initial, s, loc, &rows, name);
        const uint64_t end = std::min(range, code.size);
        if (loc < end) rows.push_back({loc, end, rule_of(s)});
        // Rows past the code (an FDE longer than the load) are cut to it.
        while (!rows.empty() && rows.back().from >= end) rows.pop_back();
        if (!rows.empty()) rows.back().to = std::min(rows.back().to, end);
    } catch (const Unsupported&) {
        rows.clear();
    } catch (const Error&) {
        rows.clear();
    }
    return rows;
}

const CfiRule* jit_cfi_at(std::span<const JitCfiRow> rows, uint64_t offset) {
    auto it = std::upper_bound(rows.begin(), rows.end(), offset,
                               [](uint64_t o, const JitCfiRow& r) { return o < r.from; });
    if (it == rows.begin()) return nullptr;
    --it;
    return offset < it->to ? &it->rule : nullptr;
}

}  // namespace gilscan
