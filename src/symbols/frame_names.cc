#include "gilscan/symbols/frame_names.h"
#include "gilscan/symbols/name_store.h"

// Before the elfutils headers: elf_file.h has constants of its own by the
// names <elf.h> defines as macros.
#include "gilscan/symbols/elf_file.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/unwind.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>

namespace gilscan {

namespace {

// "0xV (module)" onto out.
void append_at(std::string& out, uint64_t v, std::string_view module) {
    char buf[20];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, 16);
    out += "0x";
    out.append(buf, r.ptr);
    out += " (";
    out += module;
    out += ')';
}

}  // namespace

std::string frame_text(std::string_view name, uint64_t offset, std::string_view module) {
    std::string out;
    out.reserve(name.size() + module.size() + 24);
    out += name;
    out += '+';
    append_at(out, offset, module);
    return out;
}

std::string unnamed_frame_text(uint64_t pc, std::string_view module) {
    std::string out;
    append_at(out, pc, module);
    return out;
}

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
            out.push_back(frame_text(symbol_base_name(name), off, mod));
            return out;
        }
    }
    if (f.module) {  // no symbol libdw knows: the GIL extents still name these
        for (const auto* ranges : {&f.module->take, &f.module->drop})
            for (const auto& r : *ranges)
                if (f.vaddr >= r.begin && f.vaddr < r.end) {
                    out.push_back(frame_text(symbol_base_name(r.name), f.vaddr - r.begin, mod));
                    return out;
                }
    }
    out.push_back(unnamed_frame_text(f.pc, mod));
    return out;
}

// dwarf_getscopes returns the scopes from the innermost one out to the
// innermost inlined subroutine, then the scopes around that subroutine's
// abstract origin: each DW_TAG_inlined_subroutine among them is named by
// its origin.
template <class Push>
void scopes_inline_names(Dwarf_Die* cu, Dwarf_Addr addr, Push&& push) {
    Dwarf_Die* scopes = nullptr;
    const int n = dwarf_getscopes(cu, addr, &scopes);
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

template <class Push>
void libdw_inline_names_into(Dwfl_Module* m, uint64_t pc, Push&& push) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(m, pc, &bias);
    if (cu) scopes_inline_names(cu, pc - bias, push);
}

// The DIEs whose children dwarf_getscopes descends into (libdw's
// libdw_visit_scopes.c, may_have_scopes).
bool may_have_scopes(int tag) {
    switch (tag) {
    case DW_TAG_compile_unit:
    case DW_TAG_module:
    case DW_TAG_lexical_block:
    case DW_TAG_with_stmt:
    case DW_TAG_catch_block:
    case DW_TAG_try_block:
    case DW_TAG_entry_point:
    case DW_TAG_inlined_subroutine:
    case DW_TAG_subprogram:
    case DW_TAG_namespace:
    case DW_TAG_class_type:
    case DW_TAG_structure_type:
        return true;
    default:
        return false;
    }
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

std::vector<std::string> libdw_inline_names(Dwfl_Module* m, uint64_t pc) {
    std::vector<std::string> out;
    libdw_inline_names_into(m, pc, [&](const char* name) { out.emplace_back(name); });
    return out;
}

std::vector<std::string> describe_frame(const Frame& f) {
    return describe_with(
        f, [](Dwfl_Module* m, uint64_t pc, auto&& push) { libdw_inline_names_into(m, pc, push); }, libdw_symbol);
}

// dwarf_getscopes's answer (elfutils 0.188, libdw/dwarf_getscopes.c),
// found by the same path without its walks. libdw walks the compilation
// unit from its root: at each level the first child (in DIE order) whose
// ranges contain the address (dwarf_haspc) is descended into when it can
// hold scopes (may_have_scopes), and the innermost DW_TAG_inlined_subroutine
// on that path is the one named (by its abstract origin). It then looks for
// the origin in each scope around the subroutine, from the inside out,
// walking each one's whole subtree, and last in the whole unit from its
// root; the origin's parents come after the subroutine in the scopes. Both
// walks were the cost: thousands of DIEs decoded again for every address,
// and every function body before the origin. Here:
// - each DIE's children (tag, ranges, whether libdw descends into it) are
//   listed the first time the path crosses it, and the path is followed in
//   those lists;
// - an origin that is one of the unit's own children (as GCC places the
//   abstract instance of an inline function) lies in none of the scopes
//   around the subroutine, which are in another of the unit's children, so
//   libdw finds it in its last walk, its one parent being the unit: the
//   names are the origin's name alone.
// Everything else goes to dwarf_getscopes: a DIE whose children libdw
// would stop at (a DWARF error, an imported unit), an origin deeper in the
// unit or in another unit. One difference remains by design: libdw's walk
// of the unit fails (and names nothing) where the DWARF before the origin
// is broken; here that part is not read.
struct FrameNamer::ScopeIndex {
    struct Child {
        Dwarf_Die die;
        uint32_t first = 0, count = 0;  // its ranges in Children::ranges
        int tag = 0;
        bool descend = false;  // libdw goes into it (may_have_scopes, has children)
    };
    struct Children {
        std::vector<Child> list;  // in DIE order, so by increasing addr
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        bool usable = true;
    };
    std::unordered_map<const void*, Children> children;  // by the parent's Dwarf_Die::addr

    Children& children_of(Dwarf_Die& parent) {
        auto [it, made] = children.try_emplace(parent.addr);
        Children& c = it->second;
        if (!made) return c;
        Dwarf_Die child;
        int r = dwarf_child(&parent, &child);
        if (r < 0) c.usable = false;
        for (; r == 0; r = dwarf_siblingof(&child, &child)) {
            Child k;
            k.die = child;
            k.tag = dwarf_tag(&child);
            if (k.tag == DW_TAG_imported_unit) {  // libdw walks the imported unit's children in place
                c.usable = false;
                break;
            }
            k.first = static_cast<uint32_t>(c.ranges.size());
            // dwarf_ranges has nothing to read (and returns 0, no error) in
            // a DIE other than a unit's root without DW_AT_high_pc (its one
            // range needs it) or DW_AT_ranges: types, variables, most of a
            // unit's top level. Asking the abbreviation is cheaper.
            if (dwarf_hasattr(&child, DW_AT_high_pc) || dwarf_hasattr(&child, DW_AT_ranges)) {
                Dwarf_Addr base = 0, begin = 0, end = 0;
                ptrdiff_t off = 0;
                while ((off = dwarf_ranges(&child, off, &base, &begin, &end)) > 0) c.ranges.emplace_back(begin, end);
                if (off < 0) c.usable = false;  // dwarf_haspc's error: libdw's call decides what it means
            }
            k.count = static_cast<uint32_t>(c.ranges.size()) - k.first;
            const int has = dwarf_haschildren(&child);
            if (has < 0) c.usable = false;
            k.descend = may_have_scopes(k.tag) && has > 0;
            c.list.push_back(k);
        }
        if (r < 0) c.usable = false;
        return c;
    }

    // The inline names, as libdw's would be; false where only libdw can tell.
    template <class Push>
    bool names(Dwarf_Die cu, Dwarf_Addr addr, Push&& push) {
        // The path, and the innermost inlined subroutine on it.
        const Child* inlined = nullptr;
        Dwarf_Die node = cu;
        for (;;) {
            const Children& c = children_of(node);
            if (!c.usable) return false;
            size_t hit = c.list.size();
            for (size_t i = 0; i < c.list.size() && hit == c.list.size(); ++i) {
                const Child& k = c.list[i];
                for (uint32_t j = k.first; j < k.first + k.count; ++j)
                    if (addr >= c.ranges[j].first && addr < c.ranges[j].second) {
                        hit = i;
                        break;
                    }
            }
            if (hit == c.list.size()) break;
            const Child& k = c.list[hit];
            if (k.tag == DW_TAG_inlined_subroutine) inlined = &k;
            if (!k.descend) break;
            node = k.die;
        }
        if (!inlined) return true;  // no names
        // libdw fails where the origin cannot be read: no names.
        Dwarf_Die idie = inlined->die;
        Dwarf_Attribute attr;
        Dwarf_Die origin;
        if (!dwarf_attr(&idie, DW_AT_abstract_origin, &attr) || !dwarf_formref_die(&attr, &origin)) return true;
        if (origin.cu != cu.cu) return false;
        // One of the unit's own children.
        const Children& top = children_of(cu);
        auto it = std::lower_bound(top.list.begin(), top.list.end(), origin.addr,
                                   [](const Child& k, const void* a) { return std::less<const void*>()(k.die.addr, a); });
        if (it == top.list.end() || it->die.addr != origin.addr) return false;
        if (const char* name = dwarf_diename(&origin)) push(name);
        return true;
    }
};

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

template <class Push>
void FrameNamer::inline_names_into(Dwfl_Module* m, uint64_t pc, Push&& push) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(m, pc, &bias);
    if (!cu) return;
    const Dwarf_Addr addr = pc - bias;
    std::unique_ptr<ScopeIndex>& idx = scopes_[m];
    if (!idx) idx = std::make_unique<ScopeIndex>();
    std::vector<const char*> found;
    if (idx->names(*cu, addr, [&](const char* name) { found.push_back(name); })) {
        ++scope_hits_;
        for (const char* name : found) push(name);
        return;
    }
    ++scope_fallbacks_;
    scopes_inline_names(cu, addr, push);
}

std::vector<std::string> FrameNamer::inline_names(Dwfl_Module* m, uint64_t pc) {
    std::vector<std::string> out;
    inline_names_into(m, pc, [&](const char* name) { out.emplace_back(name); });
    return out;
}

std::vector<std::string> FrameNamer::describe(const Frame& f) {
    Dwfl* dwfl = static_cast<Dwfl*>(f.dwfl);
    Dwfl_Module* const here = store_ && dwfl ? dwfl_addrmodule(dwfl, f.pc) : nullptr;
    NameStore::Module* mod = nullptr;  // this module's kept answers (null: none kept)
    if (here) {
        auto [slot, fresh] = stored_.try_emplace(here, nullptr);
        if (fresh) slot->second = store_->module(here);
        mod = static_cast<NameStore::Module*>(slot->second);
    }
    // A kept answer is composed by the same describe_with as libdw's.
    if (const StoredName* n = mod ? store_->find(*mod, here, f.pc) : nullptr) {
        return describe_with(
            f, [n](Dwfl_Module*, uint64_t, auto&& push) {
                for (const std::string& s : n->inlined) push(s.c_str());
            },
            [n](Dwfl_Module*, uint64_t, uint64_t& off) -> const char* {
                off = n->offset;
                return n->has_symbol ? n->symbol.c_str() : nullptr;
            });
    }
    StoredName got;
    auto out = describe_with(
        f, [&](Dwfl_Module* m, uint64_t pc, auto&& push) {
            inline_names_into(m, pc, [&](const char* name) {
                got.inlined.emplace_back(name);
                push(name);
            });
        },
        [&](Dwfl_Module* m, uint64_t pc, uint64_t& off) {
            const char* name = symbol(m, pc, off);
            got.has_symbol = name != nullptr;
            if (name) {
                got.symbol = name;
                got.offset = off;
            }
            return name;
        });
    if (mod) store_->add(*mod, here, f.pc, std::move(got));
    return out;
}

}  // namespace gilscan
