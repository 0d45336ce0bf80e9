#include "gilscan/symbols/eh_frame.h"

#include <string>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/symbols/dwarf_cfi.h"

namespace gilscan {

namespace {

// Cursor positioned at a virtual address of a file-backed section.
std::optional<Cursor> cursor_at(const ElfFile& elf, uint64_t vaddr, uint64_t max) {
    Bytes b = elf.bytes_at(vaddr, max);
    if (b.empty()) return std::nullopt;
    auto off = elf.vaddr_to_offset(vaddr);
    return Cursor(b, false, &elf.path(), off.value_or(0));
}

// The FDE address .eh_frame_hdr's sorted (initial_location, fde) table gives for pc, or 0.
uint64_t fde_for(const ElfFile& elf, uint64_t pc) {
    const ElfSection* hdr = elf.section(".eh_frame_hdr");
    if (!hdr || !hdr->addr) return 0;
    auto c = cursor_at(elf, hdr->addr, hdr->size);
    if (!c) return 0;
    if (c->read<uint8_t>() != 1) return 0;
    uint8_t ptr_enc = c->read<uint8_t>(), count_enc = c->read<uint8_t>(), table_enc = c->read<uint8_t>();
    read_encoded_pointer(*c, ptr_enc, hdr->addr + c->pos(), hdr->addr);
    uint64_t count = read_encoded_pointer(*c, count_enc, hdr->addr + c->pos(), hdr->addr);
    if (table_enc != 0x3b) return 0;  // datarel|sdata4: what every linker writes
    c->check_count(count, 8, "eh_frame_hdr table");
    const size_t table = c->pos();
    uint64_t lo = 0, hi = count;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        c->seek(table + mid * 8);
        uint64_t loc = hdr->addr + static_cast<uint64_t>(static_cast<int64_t>(c->read<int32_t>()));
        if (loc <= pc) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    c->seek(table + (lo - 1) * 8 + 4);
    return hdr->addr + static_cast<uint64_t>(static_cast<int64_t>(c->read<int32_t>()));
}

struct Cie {
    uint8_t fde_enc = 0;    // absptr unless 'R' says otherwise
    bool z = false;         // FDEs carry an augmentation data length
    bool standard = false;  // initial rules: CFA = rsp + 8, return address at CFA - 8, nothing else
};

// The x86-64 entry rules every compiler's CIE states: DW_CFA_def_cfa rsp(7)
// 8, DW_CFA_offset rip(16) 1 (x data alignment -8), then padding.
bool standard_rules(Bytes ins) {
    static constexpr uint8_t kEntry[] = {0x0c, 0x07, 0x08, 0x90, 0x01};
    if (ins.size() < sizeof kEntry) return false;
    for (size_t i = 0; i < ins.size(); ++i)
        if (i < sizeof kEntry ? ins[i] != kEntry[i] : ins[i] != 0) return false;
    return true;
}

// A CIE or FDE at `at`: a cursor over its 32-bit length and what that
// length covers, placed past the length. 64-bit entries (length
// 0xffffffff) are not written for x86-64 code, and are refused.
std::optional<Cursor> entry_at(const ElfFile& elf, uint64_t at) {
    auto c = cursor_at(elf, at, 4);
    if (!c) return std::nullopt;
    const uint32_t len = c->read<uint32_t>();
    if (len < 8 || len == 0xffffffffu) return std::nullopt;
    c = cursor_at(elf, at, 4 + uint64_t{len});
    if (c) c->skip(4);
    return c;
}

std::optional<Cie> read_cie(const ElfFile& elf, uint64_t at) {
    auto ci = entry_at(elf, at);
    if (!ci) return std::nullopt;
    const std::optional<CieHeader> h = read_cie_header(*ci);
    if (!h) return std::nullopt;
    return Cie{h->fde_enc, h->z, standard_rules(h->instructions)};
}

// What the frame is where the FDE starts: its first instruction (after the
// augmentation data) either advances (the CIE's entry rules hold at start)
// or restates rules before any advance (code inside another frame).
Fde::Frame frame_at_start(Cursor& f, const Cie& cie) {
    if (!cie.standard) return Fde::Unknown;
    if (cie.z) f.skip(read_uleb128(f));
    while (f.left()) {
        const uint8_t op = f.read<uint8_t>();
        if (op == 0x00) continue;                                          // DW_CFA_nop
        if ((op >> 6) == 1 || op == 0x02 || op == 0x03 || op == 0x04) return Fde::Entry;  // DW_CFA_advance_loc*
        return Fde::Inside;
    }
    return Fde::Entry;  // no instructions: a leaf that never moves rsp
}

}  // namespace

std::optional<Fde> fde_at(const ElfFile& elf, uint64_t pc) {
    try {
        const uint64_t fde = fde_for(elf, pc);
        if (!fde) return std::nullopt;
        auto f = entry_at(elf, fde);
        if (!f) return std::nullopt;
        const uint64_t cie_field = fde + 4;
        const uint32_t cie_ptr = f->read<uint32_t>();
        if (cie_ptr == 0 || cie_ptr > cie_field) return std::nullopt;
        auto cie = read_cie(elf, cie_field - cie_ptr);
        if (!cie) return std::nullopt;
        uint64_t begin = read_encoded_pointer(*f, cie->fde_enc, fde + f->pos(), 0);
        uint64_t range = read_encoded_pointer(*f, static_cast<uint8_t>(cie->fde_enc & 0x0f), 0, 0);
        if (pc < begin || pc - begin >= range) return std::nullopt;
        return Fde{begin, begin + range, frame_at_start(*f, *cie)};
    } catch (const Error&) {
        return std::nullopt;
    }
}

std::optional<std::pair<uint64_t, uint64_t>> fde_range(const ElfFile& elf, uint64_t pc) {
    auto f = fde_at(elf, pc);
    if (!f) return std::nullopt;
    return std::make_pair(f->start, f->end);
}

}  // namespace gilscan
