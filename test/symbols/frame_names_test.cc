// FrameNamer against libdw's own lookups on real binaries of this machine
// kind: the symbol FrameNamer picks for an address is the one
// dwfl_module_addrinfo returns, at symbol boundaries (where the choice
// between neighbours, sizes and bindings is made) and at random addresses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <cstdlib>
#include <stdlib.h>
#include <string>
#include <vector>

#include "gilscan/symbols/frame_names.h"
#include "support/dwfl_report.h"

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <elfutils/libdwfl.h>
#include <gelf.h>

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

// A shared object at a load bias, an executable at its addresses.
Dwarf_Addr base_for(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char hdr[18] = {};
    f.read(hdr, sizeof hdr);
    uint16_t e_type = 0;
    std::memcpy(&e_type, hdr + 16, 2);
    return e_type == ET_DYN ? 0x7f1234000000ull : 0;
}

// One binary reported into a Dwfl of its own, as the unwinder reports a mapped one.
struct Reported : test::ReportedElf {
    explicit Reported(const std::string& path) : ReportedElf(path, base_for(path)) {}
};

struct Probe {
    uint64_t addr;
    const char* why;
};

// Around the first and last bytes of symbols spread over the whole table,
// and random addresses inside the module.
std::vector<Probe> probes_for(Dwfl_Module* m, size_t symbols, size_t random) {
    std::vector<std::pair<uint64_t, uint64_t>> sized;  // value, size
    const int n = dwfl_module_getsymtab(m);
    for (int i = 1; i < n; ++i) {
        GElf_Sym sym;
        GElf_Addr value = 0;
        GElf_Word shndx = 0;
        Elf* elf = nullptr;
        Dwarf_Addr bias = 0;
        const char* name = dwfl_module_getsym_info(m, i, &sym, &value, &shndx, &elf, &bias);
        if (name && name[0] && sym.st_size && sym.st_shndx != SHN_UNDEF) sized.emplace_back(value, sym.st_size);
    }
    std::sort(sized.begin(), sized.end());
    std::vector<Probe> out;
    const size_t step = std::max<size_t>(1, sized.size() / std::max<size_t>(1, symbols));
    for (size_t i = 0; i < sized.size(); i += step) {
        const auto [v, s] = sized[i];
        out.push_back({v - 1, "just below a symbol"});
        out.push_back({v, "a symbol's first byte"});
        out.push_back({v + 1, "inside a symbol"});
        out.push_back({v + s - 1, "a symbol's last byte"});
        out.push_back({v + s, "just past a symbol"});
    }
    Dwarf_Addr lo = 0, hi = 0;
    dwfl_module_info(m, nullptr, &lo, &hi, nullptr, nullptr, nullptr, nullptr);
    std::mt19937_64 rng(12345);
    for (size_t i = 0; i < random && hi > lo; ++i) out.push_back({lo + rng() % (hi - lo), "random"});
    return out;
}

void check_symbols(const std::string& path, size_t min_symbols) {
    CAPTURE(path);
    REQUIRE(fs::exists(path));
    Reported r(path);
    REQUIRE(r.mod != nullptr);
    REQUIRE(dwfl_module_getsymtab(r.mod) >= static_cast<int>(min_symbols));
    FrameNamer names;
    const std::vector<Probe> probes = probes_for(r.mod, 600, 400);
    size_t named = 0;
    for (const Probe& p : probes) {
        CAPTURE(p.addr);
        CAPTURE(p.why);
        uint64_t off_ours = 0, off_libdw = 0;
        const char* ours = names.symbol(r.mod, p.addr, off_ours);
        const char* libdw = libdw_symbol(r.mod, p.addr, off_libdw);
        REQUIRE((ours == nullptr) == (libdw == nullptr));
        if (!libdw) continue;
        ++named;
        CHECK(std::string(ours) == std::string(libdw));
        CHECK(off_ours == off_libdw);
    }
    MESSAGE(fs::path(path).filename().string()
            << ": " << probes.size() << " addresses, " << named << " with a symbol; the index answered "
            << names.symbol_hits() << ", libdw " << names.symbol_fallbacks());
    CHECK(named * 2 > probes.size());
    // The index answers nearly all that have a symbol itself (the rest: a
    // size-less symbol might be libdw's answer; addresses without any go to
    // libdw too): were it to hand everything over, the comparison above
    // would prove nothing about it.
    CHECK(names.symbol_hits() * 100 >= named * 95);
}

}  // namespace

TEST_CASE("frame names: one text for every namer, perf script's \"name+0xOFF (module)\"") {
    CHECK(frame_text("take_gil", 0xbe, "libpython3.11.so.1.0") == "take_gil+0xbe (libpython3.11.so.1.0)");
    CHECK(frame_text("schedule", 0, "[kernel]") == "schedule+0x0 ([kernel])");
    CHECK(frame_text("py::spin:/app/w.py", 0x5, "perf-23131.map") == "py::spin:/app/w.py+0x5 (perf-23131.map)");
    CHECK(frame_text("f", UINT64_MAX, "m") == "f+0xffffffffffffffff (m)");
    CHECK(frame_text("", 0x10, "") == "+0x10 ()");
    CHECK(unnamed_frame_text(0x7fffffffe000, "[uprobes]") == "0x7fffffffe000 ([uprobes])");
    CHECK(unnamed_frame_text(0, "?") == "0x0 (?)");
}

TEST_CASE("frame names: the symbol for an address is libdw's, in pyenv's libpython3.11 (.symtab, locals and globals)") {
    check_symbols("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", 10000);
}

TEST_CASE("frame names: the symbol for an address is libdw's, in glibc (symbols from its debug file, size-less labels)") {
    check_symbols("/usr/lib/x86_64-linux-gnu/libc.so.6", 2000);
}

TEST_CASE("frame names: the symbol for an address is libdw's, in Debian's stripped python3.11 (.dynsym only, non-PIE)") {
    check_symbols("/usr/bin/python3.11", 1000);
}

namespace {

// A shared object whose symbols are made to disagree: nested symbols of
// different bindings, aliases of different sizes, a farther symbol of a
// stronger binding, size-less labels with and without a sized symbol around
// them. Every byte of its text is looked up both ways.
const char* const kCraftedAsm = R"(
    .text
    .p2align 6
    # A global function with a local one nested in it (libdwfl looks at the
    # globals first, so the global wins though the local is closer).
    .globl g_outer
    .type g_outer, @function
g_outer:
    .fill 8, 1, 0x90
    .type l_inner, @function
l_inner:
    .fill 16, 1, 0x90
    .size l_inner, 16
    .fill 40, 1, 0x90
    .size g_outer, 64

    # A local function with a weak and a local one nested in it.
    .type l_outer, @function
l_outer:
    .fill 8, 1, 0x90
    .weak w_inner
    .type w_inner, @function
w_inner:
    .fill 8, 1, 0x90
    .size w_inner, 8
    .fill 16, 1, 0x90
    .type l_inner2, @function
l_inner2:
    .fill 4, 1, 0x90
    .size l_inner2, 4
    .fill 28, 1, 0x90
    .size l_outer, 64

    # Aliases at one address: sizes and bindings differ.
    .globl a_global_short
    .type a_global_short, @function
    .weak a_weak_long
    .type a_weak_long, @function
    .type a_local_mid, @function
a_global_short:
a_weak_long:
a_local_mid:
    .fill 64, 1, 0x90
    .size a_global_short, 16
    .size a_weak_long, 64
    .size a_local_mid, 32

    # A weak symbol and a global around it that starts lower, in both orders
    # of the symbol table: met after the weak one, the global's stronger
    # binding wins over the weak one's closeness.
    .weak h_weak_near
    .globl h_global_wide
    .type h_global_wide, @function
h_global_wide:
    .fill 8, 1, 0x90
    .type h_weak_near, @function
h_weak_near:
    .fill 16, 1, 0x90
    .size h_weak_near, 16
    .fill 40, 1, 0x90
    .size h_global_wide, 64

    .globl f_global_wide
    .type f_global_wide, @function
f_global_wide:
    .fill 8, 1, 0x90
    .weak f_weak_near
    .type f_weak_near, @function
f_weak_near:
    .fill 16, 1, 0x90
    .size f_weak_near, 16
    .fill 40, 1, 0x90
    .size f_global_wide, 64

    # Size-less labels: a global one in a gap, a local one, one inside a
    # sized symbol.
    .fill 16, 1, 0xcc
    .globl label_global
label_global:
    .fill 16, 1, 0xcc
label_local:
    .fill 16, 1, 0xcc
    # A size-less global at the first byte of a local function: there
    # libdwfl answers the label (an exact match skips the locals).
    .globl label_at_local
    .type l_after_label, @function
label_at_local:
l_after_label:
    .fill 16, 1, 0x90
    .size l_after_label, 16
    .globl s_sized
    .type s_sized, @function
s_sized:
    .fill 8, 1, 0x90
    .globl label_inside
label_inside:
    .fill 24, 1, 0x90
    .size s_sized, 32
    .fill 32, 1, 0xcc
)";

}  // namespace

TEST_CASE("frame names: libdw's symbol choice among nested, aliased, weak and size-less symbols, at every byte") {
    char dir_template[] = "/tmp/gilscan_frame_names_XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    const fs::path dir = dir_template;
    {
        std::ofstream(dir / "crafted.s") << kCraftedAsm;
    }
    const std::string cmd = "cc -shared -nostdlib -Wl,--hash-style=gnu -o " + (dir / "crafted.so").string() + " " +
                            (dir / "crafted.s").string() + " 2>" + (dir / "cc.log").string();
    INFO("the test assembles a shared object with the system's cc: " << cmd);
    REQUIRE(std::system(cmd.c_str()) == 0);
    {
        Reported r((dir / "crafted.so").string());
        REQUIRE(r.mod != nullptr);
        Dwarf_Addr lo = 0, hi = 0;
        dwfl_module_info(r.mod, nullptr, &lo, &hi, nullptr, nullptr, nullptr, nullptr);
        FrameNamer names;
        size_t named = 0;
        std::set<std::string> seen;
        for (uint64_t a = lo; a < hi; ++a) {
            CAPTURE(a - lo);
            uint64_t off_ours = 0, off_libdw = 0;
            const char* ours = names.symbol(r.mod, a, off_ours);
            const char* libdw = libdw_symbol(r.mod, a, off_libdw);
            REQUIRE((ours == nullptr) == (libdw == nullptr));
            if (!libdw) continue;
            ++named;
            seen.insert(libdw);
            CHECK(std::string(ours) == std::string(libdw));
            CHECK(off_ours == off_libdw);
        }
        MESSAGE("crafted.so: " << hi - lo << " addresses, " << named << " with a symbol; the index answered "
                               << names.symbol_hits() << ", libdw " << names.symbol_fallbacks());
        // The cases above are decided: each of these is libdw's answer somewhere.
        for (const char* s : {"g_outer", "l_outer", "w_inner", "l_inner2", "a_global_short", "a_weak_long",
                              "f_global_wide", "h_global_wide", "label_global", "label_at_local", "l_after_label", "s_sized"})
            CHECK_MESSAGE(seen.count(s), s);
        CHECK(names.symbol_hits() > 0);
    }
    fs::remove_all(dir);
}

namespace {

// Addresses inside inlined calls (the first, middle and last byte of the
// ranges of DW_TAG_inlined_subroutine DIEs, nested ones included), spread
// over the module's units: where dwarf_getscopes has names to give.
void collect_inlined(Dwarf_Die* die, Dwarf_Addr bias, std::vector<Probe>& out, size_t& seen, size_t every) {
    Dwarf_Die child;
    if (dwarf_child(die, &child) != 0) return;
    do {
        const int tag = dwarf_tag(&child);
        if (tag == DW_TAG_inlined_subroutine && seen++ % every == 0) {
            Dwarf_Addr base = 0, begin = 0, end = 0;
            ptrdiff_t off = 0;
            while ((off = dwarf_ranges(&child, off, &base, &begin, &end)) > 0 && end > begin) {
                out.push_back({begin + bias, "an inlined call's first byte"});
                out.push_back({begin + (end - begin) / 2 + bias, "inside an inlined call"});
                out.push_back({end - 1 + bias, "an inlined call's last byte"});
            }
        }
        if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block)
            collect_inlined(&child, bias, out, seen, every);
    } while (dwarf_siblingof(&child, &child) == 0);
}

std::vector<Probe> inlined_probes(Dwfl_Module* m, size_t every) {
    std::vector<Probe> out;
    size_t seen = 0;
    Dwarf_Addr bias = 0;
    for (Dwarf_Die* cu = nullptr; (cu = dwfl_module_nextcu(m, cu, &bias)) != nullptr;) {
        collect_inlined(cu, bias, out, seen, every);
        if (out.size() > 2400) break;
    }
    return out;
}

// FrameNamer's inline names against dwarf_getscopes's at the probes.
void check_inline_names(const std::string& path, size_t min_with_inline, size_t every) {
    CAPTURE(path);
    REQUIRE(fs::exists(path));
    Reported r(path);
    REQUIRE(r.mod != nullptr);
    FrameNamer names;
    std::vector<Probe> probes = probes_for(r.mod, 300, 200);
    const std::vector<Probe> in_inlined = inlined_probes(r.mod, every);
    probes.insert(probes.end(), in_inlined.begin(), in_inlined.end());
    size_t with_inline = 0;
    for (const Probe& p : probes) {
        CAPTURE(p.addr);
        CAPTURE(p.why);
        const std::vector<std::string> ours = names.inline_names(r.mod, p.addr);
        const std::vector<std::string> libdw = libdw_inline_names(r.mod, p.addr);
        CHECK(ours == libdw);
        with_inline += !libdw.empty();
    }
    MESSAGE(fs::path(path).filename().string()
            << ": " << probes.size() << " addresses, " << with_inline << " inside an inlined call; the index followed "
            << names.scope_hits() << ", libdw " << names.scope_fallbacks());
    CHECK(with_inline >= min_with_inline);
    CHECK(names.scope_hits() * 10 >= (names.scope_hits() + names.scope_fallbacks()) * 9);
}

}  // namespace

TEST_CASE("frame names: the inlined calls around an address are libdw's, in pyenv's libpython3.11") {
    check_inline_names("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", 1000, 37);
}

TEST_CASE("frame names: the inlined calls around an address are libdw's, in glibc (DWARF from its debug file)") {
    check_inline_names("/usr/lib/x86_64-linux-gnu/libc.so.6", 1000, 7);
}
