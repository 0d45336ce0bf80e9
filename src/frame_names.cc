#include "gilscan/frame_names.h"

// Before the elfutils headers: elf_file.h has constants of its own by the
// names <elf.h> defines as macros.
#include "gilscan/elf_file.h"
#include "gilscan/modules.h"
#include "gilscan/unwind.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>

namespace gilscan {

namespace {

// The frame's text from its module's two answers: the inlined calls around
// pc (innermost first) and its symbol. One function for both namers, so
// that they can differ only in how they find those answers.
template <class InlineNames, class Symbol>
std::vector<std::string> describe_with(const Frame& f, InlineNames&& inline_names, Symbol&& symbol) {
    std::vector<std::string> out;
    const std::string mod = f.mapping ? std::filesystem::path(f.mapping->path).filename().string() : std::string("?");
    Dwfl* dwfl = static_cast<Dwfl*>(f.dwfl);
    Dwfl_Module* m = dwfl ? dwfl_addrmodule(dwfl, f.pc) : nullptr;
    if (m) {
        inline_names(m, f.pc, [&](const char* name) {
            out.push_back("[inlined] " + std::string(symbol_base_name(name)) + " (" + mod + ")");
        });
        uint64_t off = 0;
        if (const char* name = symbol(m, f.pc, off)) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "+0x%llx (", static_cast<unsigned long long>(off));
            out.push_back(std::string(symbol_base_name(name)) + buf + mod + ")");
            return out;
        }
    }
    if (f.module) {  // no symbol libdw knows: the GIL extents still name these
        for (const auto* ranges : {&f.module->take, &f.module->drop})
            for (const auto& r : *ranges)
                if (f.vaddr >= r.begin && f.vaddr < r.end) {
                    char buf[64];
                    std::snprintf(buf, sizeof buf, "+0x%llx (", static_cast<unsigned long long>(f.vaddr - r.begin));
                    out.push_back(std::string(symbol_base_name(r.name)) + buf + mod + ")");
                    return out;
                }
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, "0x%llx (", static_cast<unsigned long long>(f.pc));
    out.push_back(buf + mod + ")");
    return out;
}

// dwarf_getscopes returns the scopes from the innermost one out to the
// innermost inlined subroutine, then the scopes around that subroutine's
// abstract origin: each DW_TAG_inlined_subroutine among them is named by
// its origin.
template <class Push>
void libdw_inline_names(Dwfl_Module* m, uint64_t pc, Push&& push) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(m, pc, &bias);
    if (!cu) return;
    Dwarf_Die* scopes = nullptr;
    const int n = dwarf_getscopes(cu, pc - bias, &scopes);
    for (int i = 0; i < n; ++i) {
        if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine) continue;
        Dwarf_Attribute attr;
        Dwarf_Die origin;
        const char* name = nullptr;
        if (dwarf_attr(&scopes[i], DW_AT_abstract_origin, &attr) && dwarf_formref_die(&attr, &origin))
            name = dwarf_diename(&origin);
        if (name) push(name);
    }
    std::free(scopes);
}

// libdwfl's preference among symbol bindings (__libdwfl_addrsym's binding_value).
int binding_rank(unsigned char info) {
    switch (GELF_ST_BIND(info)) {
    case STB_GLOBAL: return 3;
    case STB_WEAK: return 2;
    case STB_LOCAL: return 1;
    default: return 0;
    }
}

// The section an address lies in, as libdwfl's sizeless-symbol test finds
// it (its find_section, reached here through dwfl_module_address_section);
// SHN_UNDEF where none does.
size_t section_of(Dwfl_Module* m, uint64_t addr) {
    Dwarf_Addr a = addr, bias = 0;
    Elf_Scn* scn = dwfl_module_address_section(m, &a, &bias);
    return scn ? elf_ndxscn(scn) : SHN_UNDEF;
}

}  // namespace

const char* libdw_symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off) {
    GElf_Off o = 0;
    GElf_Sym sym;
    const char* name = dwfl_module_addrinfo(m, pc, &o, &sym, nullptr, nullptr, nullptr);
    off = o;
    return name;
}

std::vector<std::string> describe_frame(const Frame& f) {
    return describe_with(
        f, [](Dwfl_Module* m, uint64_t pc, auto&& push) { libdw_inline_names(m, pc, push); }, libdw_symbol);
}

// libdwfl's choice of a symbol for an address (dwfl_module_addrinfo:
// __libdwfl_addrsym without st_value adjustment), over libdwfl's own symbol
// list kept sorted by address. libdwfl goes through the table in index
// order, globals first and the locals only when no global was found,
// keeping a candidate that contains the address with a size and that is
// closer below it, or of a stronger binding, or (at the same address)
// smaller or of a stronger binding; a size-less symbol (an assembly label)
// is its answer only when no sized symbol contains the address, decided by
// sections and the extents of the symbols before it. The index keeps the
// sized symbols and makes the same choice among those that contain the
// address; whenever the size-less rule could come into it, the answer is
// libdwfl's own.
struct FrameNamer::SymbolIndex {
    struct Sym {
        uint64_t value, size;
        int index;  // in libdwfl's list: the order of its search
        int rank;   // binding_rank
        const char* name;
    };
    std::vector<Sym> sized;          // by value
    std::vector<uint64_t> reach;     // reach[i]: the highest end of sized[0..i] (saturating)
    std::map<size_t, uint64_t> sizeless_global;  // section -> lowest size-less global symbol in it
    int first_global = 0;
    bool usable = false;

    explicit SymbolIndex(Dwfl_Module* m) {
        const int n = dwfl_module_getsymtab(m);
        first_global = dwfl_module_getsymtab_first_global(m);
        Dwarf_Addr ebias = 0;
        Elf* elf = dwfl_module_getelf(m, &ebias);
        GElf_Ehdr eh;
        // Elsewhere libdwfl may resolve function descriptors (st_value is
        // then not the code address, and it tries both): not modelled here.
        if (n < 0 || first_global < 0 || !elf || !gelf_getehdr(elf, &eh) || eh.e_machine != EM_X86_64) return;
        const int global_from = first_global == 0 ? 1 : first_global;
        for (int i = 1; i < n; ++i) {
            GElf_Sym sym;
            GElf_Addr value = 0;
            GElf_Word shndx = 0;
            Elf* symelf = nullptr;
            Dwarf_Addr bias = 0;
            const char* name = dwfl_module_getsym_info(m, i, &sym, &value, &shndx, &symelf, &bias);
            // The symbols libdwfl's search considers at all.
            if (!name || !name[0] || sym.st_shndx == SHN_UNDEF) continue;
            const int type = GELF_ST_TYPE(sym.st_info);
            if (type == STT_SECTION || type == STT_FILE || type == STT_TLS) continue;
            if (sym.st_size == 0) {
                if (i >= global_from) {
                    uint64_t& low = sizeless_global.try_emplace(section_of(m, value), value).first->second;
                    low = std::min<uint64_t>(low, value);
                }
                continue;
            }
            sized.push_back({value, sym.st_size, i, binding_rank(sym.st_info), name});
        }
        std::sort(sized.begin(), sized.end(), [](const Sym& a, const Sym& b) { return a.value < b.value; });
        reach.resize(sized.size());
        uint64_t top = 0;
        for (size_t i = 0; i < sized.size(); ++i) {
            const uint64_t end = sized[i].value + sized[i].size;
            top = std::max(top, end < sized[i].value ? ~uint64_t{0} : end);
            reach[i] = top;
        }
        usable = true;
    }

    // libdwfl's answer, or nullptr with `sure` false where only libdwfl can tell.
    const char* lookup(Dwfl_Module* m, uint64_t addr, uint64_t& off, bool& sure) const {
        sure = false;
        if (!usable) return nullptr;
        // The sized symbols that contain addr, in libdwfl's order.
        const Sym* found[16];
        size_t nfound = 0;
        auto it = std::upper_bound(sized.begin(), sized.end(), addr, [](uint64_t a, const Sym& s) { return a < s.value; });
        for (size_t j = static_cast<size_t>(it - sized.begin()); j-- > 0;) {
            if (reach[j] <= addr) break;  // nothing at or below j reaches addr
            if (addr - sized[j].value < sized[j].size) {
                if (nfound == std::size(found)) return nullptr;  // unusual: let libdwfl decide
                found[nfound++] = &sized[j];
            }
        }
        std::sort(found, found + nfound, [](const Sym* a, const Sym* b) { return a->index < b->index; });
        const Sym* closest = nullptr;
        auto pass = [&](int from, int to) {
            for (size_t k = 0; k < nfound; ++k) {
                const Sym& s = *found[k];
                if (s.index < from || s.index >= to) continue;
                if (!closest || closest->value < s.value || closest->rank < s.rank)
                    closest = &s;
                else if (closest->value == s.value && ((closest->size > s.size && closest->rank <= s.rank) ||
                                                       (closest->size >= s.size && closest->rank < s.rank)))
                    closest = &s;
            }
        };
        const int global_from = first_global == 0 ? 1 : first_global;
        pass(global_from, INT32_MAX);
        if (!closest) {
            // A size-less global in addr's section, at or below it, may be
            // libdwfl's fallback and decides whether it searches the locals.
            auto sl = sizeless_global.find(section_of(m, addr));
            if (sl != sizeless_global.end() && sl->second <= addr) return nullptr;
            if (first_global > 1) pass(1, first_global);
        }
        if (!closest) return nullptr;  // a size-less symbol, or none: libdwfl's rules
        sure = true;
        off = addr - closest->value;
        return closest->name;
    }
};

FrameNamer::FrameNamer() = default;
FrameNamer::~FrameNamer() = default;

const char* FrameNamer::symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off) {
    std::unique_ptr<SymbolIndex>& idx = symbols_[m];
    if (!idx) idx = std::make_unique<SymbolIndex>(m);
    bool sure = false;
    const char* name = idx->lookup(m, pc, off, sure);
    if (sure) {
        ++symbol_hits_;
        return name;
    }
    ++symbol_fallbacks_;
    return libdw_symbol(m, pc, off);
}

std::vector<std::string> FrameNamer::describe(const Frame& f) {
    return describe_with(
        f, [](Dwfl_Module* m, uint64_t pc, auto&& push) { libdw_inline_names(m, pc, push); },
        [this](Dwfl_Module* m, uint64_t pc, uint64_t& off) { return symbol(m, pc, off); });
}

}  // namespace gilscan
