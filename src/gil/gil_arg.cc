#include "gilscan/gil/gil_arg.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <memory>

#include "gilscan/symbols/elf_note.h"

namespace gilscan {

std::string GilArgPath::fetcharg() const {
    // Innermost load first: {16, 384} is "+384(+16(%di))".
    std::string e = reg;
    for (uint32_t off : derefs) e = "+" + std::to_string(off) + "(" + e + ")";
    return std::string(kGilArgField) + "=" + e + ":x64";
}

namespace {

// One ELF file open for libdw, closed on every path out.
struct DwarfFile {
    int fd = -1;
    Elf* elf = nullptr;
    Dwarf* dw = nullptr;
    explicit DwarfFile(const std::string& path) {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;
        elf_version(EV_CURRENT);
        elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
        if (elf) dw = dwarf_begin_elf(elf, DWARF_C_READ, nullptr);
    }
    ~DwarfFile() {
        if (dw) dwarf_end(dw);
        if (elf) elf_end(elf);
        if (fd >= 0) ::close(fd);
    }
    DwarfFile(const DwarfFile&) = delete;
    DwarfFile& operator=(const DwarfFile&) = delete;
};

// The type a DIE names, through typedefs and qualifiers (and through
// DW_AT_abstract_origin: an out-of-line copy of an inlined function names
// its parameters' types only in the abstract instance).
std::optional<Dwarf_Die> type_of(Dwarf_Die* die) {
    Dwarf_Attribute a;
    Dwarf_Die t, peeled;
    if (!dwarf_attr_integrate(die, DW_AT_type, &a) || !dwarf_formref_die(&a, &t)) return std::nullopt;
    if (dwarf_peel_type(&t, &peeled) != 0) return std::nullopt;
    return peeled;
}

// The structure a pointer type points at; nullopt for anything else, or for
// a structure this unit only declares.
std::optional<Dwarf_Die> pointee_struct(Dwarf_Die t) {
    if (dwarf_tag(&t) != DW_TAG_pointer_type) return std::nullopt;
    std::optional<Dwarf_Die> s = type_of(&t);
    if (!s || dwarf_tag(&*s) != DW_TAG_structure_type || dwarf_hasattr(&*s, DW_AT_declaration)) return std::nullopt;
    return s;
}

struct Member {
    uint32_t offset = 0;
    Dwarf_Die type;
};

std::optional<Member> member(Dwarf_Die s, std::string_view name) {
    Dwarf_Die c;
    if (dwarf_child(&s, &c) != 0) return std::nullopt;
    do {
        if (dwarf_tag(&c) != DW_TAG_member) continue;
        const char* n = dwarf_diename(&c);
        if (!n || name != n) continue;
        Dwarf_Attribute a;
        Dwarf_Word off = 0;
        // A constant offset (DWARF 3+ as GCC and clang write it); an
        // expression location is not followed.
        if (!dwarf_attr(&c, DW_AT_data_member_location, &a) || dwarf_formudata(&a, &off) != 0 || off > UINT32_MAX)
            return std::nullopt;
        std::optional<Dwarf_Die> t = type_of(&c);
        if (!t) return std::nullopt;
        return Member{static_cast<uint32_t>(off), *t};
    } while (dwarf_siblingof(&c, &c) == 0);
    return std::nullopt;
}

// Loads from a pointer to structure `s` to the GIL's address:
//   _is (an interpreter):    ceval.gil    -> {off(ceval) + off(gil)}
//   _ts (take_gil's tstate): interp->...  -> {off(interp), <the _is path>}
// The `gil` member must be a pointer: an embedded _gil_runtime_state (3.9-3.11
// built with EXPERIMENTAL_ISOLATED_SUBINTERPRETERS) is not followed.
std::optional<std::vector<uint32_t>> path_to_gil(Dwarf_Die s, bool follow_interp) {
    if (auto c = member(s, "ceval"); c && dwarf_tag(&c->type) == DW_TAG_structure_type)
        if (auto g = member(c->type, "gil"); g && dwarf_tag(&g->type) == DW_TAG_pointer_type)
            return std::vector<uint32_t>{c->offset + g->offset};
    if (!follow_interp) return std::nullopt;
    if (auto i = member(s, "interp")) {
        std::optional<Dwarf_Die> is = pointee_struct(i->type);
        if (!is) return std::nullopt;
        auto rest = path_to_gil(*is, false);
        if (!rest) return std::nullopt;
        rest->insert(rest->begin(), i->offset);
        return rest;
    }
    return std::nullopt;
}

// The out-of-line copy of `function` at `vaddr` (a subprogram at a unit's
// top level, as C compilers place them).
std::optional<Dwarf_Die> find_subprogram(Dwarf* dw, std::string_view function, uint64_t vaddr) {
    Dwarf_Off off = 0, next = 0;
    size_t hsize = 0;
    while (dwarf_nextcu(dw, off, &next, &hsize, nullptr, nullptr, nullptr) == 0) {
        Dwarf_Die cu, c;
        if (dwarf_offdie(dw, off + hsize, &cu) && dwarf_child(&cu, &c) == 0) {
            do {
                if (dwarf_tag(&c) != DW_TAG_subprogram) continue;
                Dwarf_Addr lo = 0;
                if (dwarf_lowpc(&c, &lo) != 0 || lo != vaddr) continue;
                const char* n = dwarf_diename(&c);
                if (n && function == n) return c;
            } while (dwarf_siblingof(&c, &c) == 0);
        }
        off = next;
    }
    return std::nullopt;
}

std::optional<Dwarf_Die> first_parameter(Dwarf_Die fn) {
    Dwarf_Die c;
    if (dwarf_child(&fn, &c) != 0) return std::nullopt;
    do
        if (dwarf_tag(&c) == DW_TAG_formal_parameter) return c;
    while (dwarf_siblingof(&c, &c) == 0);
    return std::nullopt;
}

std::optional<std::string> first_arg_register(Elf* elf) {
    GElf_Ehdr eh;
    if (!gelf_getehdr(elf, &eh)) return std::nullopt;
    if (eh.e_machine == EM_X86_64) return "%di";
    if (eh.e_machine == EM_AARCH64) return "%x0";
    return std::nullopt;
}

}  // namespace

std::optional<GilArgPath> gil_arg_path(const std::string& elf_path, std::string_view function, uint64_t vaddr,
                                       std::string* why) {
    auto fail = [&](std::string w) -> std::optional<GilArgPath> {
        if (why) *why = std::move(w);
        return std::nullopt;
    };
    DwarfFile f(elf_path);
    if (!f.elf) return fail("cannot open " + elf_path);
    std::optional<std::string> reg = first_arg_register(f.elf);
    if (!reg) return fail("not an x86-64 or arm64 ELF");
    std::unique_ptr<DwarfFile> debug;  // the build-id debug file, when the binary has no DWARF
    Dwarf* dw = f.dw;
    if (!dw) {
        const void* bits = nullptr;
        const ssize_t n = dwelf_elf_gnu_build_id(f.elf, &bits);
        const std::string id = n > 0 ? to_hex(Bytes(static_cast<const uint8_t*>(bits), static_cast<size_t>(n))) : "";
        if (const std::string path = build_id_debug_path(id); !path.empty()) {
            debug = std::make_unique<DwarfFile>(path);
            dw = debug->dw;
        }
    }
    if (!dw) return fail("no DWARF in " + elf_path + " or its build-id debug file");
    std::optional<Dwarf_Die> fn = find_subprogram(dw, function, vaddr);
    if (!fn) return fail("no DWARF subprogram " + std::string(function) + " at its address");
    std::optional<Dwarf_Die> p = first_parameter(*fn);
    std::optional<Dwarf_Die> t = p ? type_of(&*p) : std::nullopt;
    std::optional<Dwarf_Die> s = t ? pointee_struct(*t) : std::nullopt;
    if (!s) return fail(std::string(function) + "'s first parameter is not a pointer to a described struct");
    std::optional<std::vector<uint32_t>> path = path_to_gil(*s, true);
    if (!path) return fail(std::string(function) + "'s first parameter does not reach a per-interpreter GIL pointer");
    return GilArgPath{*reg, std::move(*path)};
}

}  // namespace gilscan
