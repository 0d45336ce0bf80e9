#include "gilscan/symbols/release_sites.h"

#include <cstring>
#include <optional>
#include <set>

#include "gilscan/symbols/eh_frame.h"

namespace gilscan {

namespace {

// The constant a call at code[i] passes in rdi: set by one of the three
// instructions before it (no call between).
std::optional<uint64_t> rdi_constant(const std::vector<Insn>& code, size_t i) {
    for (size_t k = i; k > 0 && i - k < 3; --k) {
        const Insn& x = code[k - 1];
        if (x.kind == Insn::SetsRdi) return x.value;
        if (x.kind == Insn::Call) break;
    }
    return std::nullopt;
}

// The constants the calls of `stub` in [start, end) pass, and where each call is.
std::vector<std::pair<uint64_t, uint64_t>> signals_in(const ElfFile& elf, uint64_t start, uint64_t end, uint64_t stub) {
    std::vector<std::pair<uint64_t, uint64_t>> out;  // call address, constant
    const std::vector<Insn> code = disassemble(elf, start, end);
    for (size_t i = 0; i < code.size(); ++i)
        if (code[i].kind == Insn::Call && code[i].value == stub)
            if (auto c = rdi_constant(code, i)) out.emplace_back(code[i].at, *c);
    return out;
}

std::string exported_at(const ElfFile& elf, uint64_t addr) {
    for (const auto& s : elf.symbols())
        if (s.defined && s.value == addr && (s.type == STT_FUNC || s.type == STT_GNU_IFUNC)) return std::string(s.name);
    return {};
}

}  // namespace

std::vector<GilFunction> inlined_release_sites(const ElfFile& elf, const GilLocation& loc,
                                               const std::map<uint64_t, std::string>& plt) {
    std::vector<GilFunction> out;
    uint64_t stub = 0;
    for (const auto& [at, name] : plt)
        if (name == "pthread_cond_signal") stub = at;
    const ElfSection* text = elf.section(".text");
    if (!stub || !text || !capstone_available()) return out;
    // gil->cond, where the located releases signal it as a constant.
    std::set<uint64_t> conds;
    std::vector<std::pair<uint64_t, uint64_t>> known;  // the located functions' extents
    for (const auto& fns : {loc.take, loc.drop})
        for (const GilFunction& f : fns)
            if (f.size) known.emplace_back(f.vaddr, f.vaddr + f.size);
    for (const GilFunction& d : loc.drop)
        if (d.size && !d.site)
            for (const auto& [at, c] : signals_in(elf, d.vaddr, d.vaddr + d.size, stub)) conds.insert(c);
    if (conds.empty()) return out;
    // Every direct call of the stub (e8 rel32), confirmed by disassembling
    // the function its FDE covers from its start.
    const std::vector<uint8_t> bytes = elf.code_at(text->addr, text->size);
    std::set<uint64_t> scanned;  // FDE starts
    for (size_t o = 0; o + 5 <= bytes.size(); ++o) {
        if (bytes[o] != 0xe8) continue;
        int32_t rel = 0;
        std::memcpy(&rel, &bytes[o + 1], sizeof rel);
        const uint64_t at = text->addr + o;
        if (at + 5 + static_cast<uint64_t>(static_cast<int64_t>(rel)) != stub) continue;
        bool located = false;
        for (const auto& [b, e] : known) located |= at >= b && at < e;
        const auto f = located ? std::nullopt : fde_at(elf, at);
        if (!f || !scanned.insert(f->start).second) continue;
        const std::string in = exported_at(elf, f->start);
        for (const auto& [call, c] : signals_in(elf, f->start, f->end, stub)) {
            if (!conds.count(c)) continue;
            GilFunction g;
            g.name = in.empty() ? "drop_gil" : in;
            g.vaddr = call;
            g.how = "drop_gil inlined into " + (in.empty() ? std::string("a function without a symbol") : in) +
                    ": probed where it signals the GIL's condition variable";
            g.inlined = g.site = true;
            out.push_back(g);
        }
    }
    return out;
}

}  // namespace gilscan
