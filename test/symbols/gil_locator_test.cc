// The GIL locator on the real Pythons of this machine kind: pyenv 3.6-3.13
// (libpython with symbols: the disassembly path must find what the symbols
// say) and Debian's stripped /usr/bin/python3.11 (checked against objdump,
// a second disassembler).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <unistd.h>

#include "gilscan/symbols/elf_note.h"
#include "gilscan/gil/gil_arg.h"
#include "gilscan/symbols/gil_locator.h"
#include "gilscan/gil/probe_plan.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> pyenv_libpythons() {
    std::vector<std::string> out;
    for (const char* v : {"3.6.15", "3.7.16", "3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"}) {
        fs::path lib = fs::path("/root/.pyenv/versions") / v / "lib";
        for (const auto& e : fs::directory_iterator(lib))
            if (e.path().filename().string().rfind("libpython3", 0) == 0 &&
                e.path().filename().string().find(".so.1.0") != std::string::npos)
                out.push_back(e.path().string());
    }
    return out;
}


}  // namespace

TEST_CASE("pyenv 3.6-3.13: symbols, and the same answer without them") {
    auto libs = pyenv_libpythons();
    REQUIRE_MESSAGE(libs.size() == 8, "this machine kind ships pyenv 3.6-3.13 in /root/.pyenv/versions");
    for (const auto& lib : libs) {
        CAPTURE(lib);
        ElfFile elf(lib);
        GilLocation sym = locate_gil(elf);
        REQUIRE(sym.from_symbols);
        REQUIRE_FALSE(sym.take.empty());
        REQUIRE_FALSE(sym.drop.empty());
        CHECK(symbol_base_name(sym.take[0].name) == "take_gil");
        // FDE extents agree with the symbol sizes.
        auto r = fde_range(elf, sym.take[0].vaddr);
        REQUIRE(r);
        CHECK(r->first == sym.take[0].vaddr);
        CHECK(r->second - r->first == sym.take[0].size);

        GilLocation dis = locate_gil(elf, {false});
        CHECK_FALSE(dis.from_symbols);
        REQUIRE_FALSE(dis.take.empty());
        bool take_matches = false;
        for (const auto& f : sym.take) take_matches |= f.vaddr == dis.take[0].vaddr;
        CHECK(take_matches);
        REQUIRE_FALSE(dis.drop.empty());
        CHECK(dis.drop[0].vaddr == sym.drop[0].vaddr);
    }
}

TEST_CASE("Debian's stripped python3.11: take_gil is the call target in PyEval_RestoreThread") {
    const std::string bin = "/usr/bin/python3.11";
    REQUIRE_MESSAGE(fs::exists(bin), "this machine kind ships Debian's python3.11");
    ElfFile elf(bin);
    CHECK_FALSE(elf.has_symtab());
    GilLocation loc = locate_gil(elf);
    REQUIRE(loc.take.size() >= 1);
    CHECK(loc.non_pie);
    // objdump's view of PyEval_RestoreThread: its first direct call.
    const ElfSymbol* rt = elf.find_symbol("PyEval_RestoreThread");
    REQUIRE(rt);
    char range[128];
    std::snprintf(range, sizeof range, "--start-address=0x%llx --stop-address=0x%llx",
                  static_cast<unsigned long long>(rt->value), static_cast<unsigned long long>(rt->value + rt->size));
    std::string dis = shell_output("objdump -d --no-show-raw-insn " + std::string(range) + " " + bin);
    std::smatch m;
    REQUIRE(std::regex_search(dis, m, std::regex(R"(call\s+([0-9a-f]+))")));
    CHECK(loc.take[0].vaddr == std::stoull(m[1].str(), nullptr, 16));
    // The uprobe offset is a FILE offset: objdump -F says where that code is in the file.
    ProbePlan plan = plan_probes(bin);
    REQUIRE(plan.probes.size() >= 2);
    std::snprintf(range, sizeof range, "--start-address=0x%llx --stop-address=0x%llx",
                  static_cast<unsigned long long>(loc.take[0].vaddr),
                  static_cast<unsigned long long>(loc.take[0].vaddr + 1));
    std::string f = shell_output("objdump -d -F " + std::string(range) + " " + bin);
    REQUIRE(std::regex_search(f, m, std::regex(R"(File Offset: 0x([0-9a-f]+))")));
    CHECK(plan.probes[0].offset == std::stoull(m[1].str(), nullptr, 16));
    CHECK(plan.probes[0].offset != loc.take[0].vaddr);  // non-PIE: offset and address differ
    CHECK(plan.probes[0].line().rfind("p:gilscan_python3_11/take_gil /usr/bin/python3.11:0x", 0) == 0);
    // take_gil's return: a plain probe on its one ret (exit_sites_test.cc), not a uretprobe.
    CHECK(plan.probes[1].line().rfind("p:gilscan_python3_11/take_gil__return ", 0) == 0);
    // drop_gil: a real function for some callers, inlined into PyEval_SaveThread.
    bool inlined_note = false;
    for (const auto& n : loc.notes) inlined_note |= n.find("inlined into PyEval_SaveThread") != std::string::npos;
    CHECK(inlined_note);
}

TEST_CASE("python resolution: the pyenv shim (bash that execs) leads to its libpython") {
    REQUIRE(fs::exists("/root/.pyenv/shims/python3"));
    std::string bin = resolve_python_binary("/root/.pyenv/shims/python3");
    CHECK(bin.find("libpython3") != std::string::npos);
    CHECK(resolve_python_binary("/usr/bin/python3.11") == "/usr/bin/python3.11");
    CHECK(default_probe_group("/x/libpython3.11.so.1.0") == "gilscan_libpython3_11");
    CHECK(symbol_base_name("take_gil.lto_priv.0") == "take_gil");
    CHECK(symbol_base_name("take_gil.constprop.0.isra.0") == "take_gil");
    CHECK(symbol_base_name("drop_gil.cold") == "drop_gil");
    CHECK(symbol_base_name("take_gil.llvm.8126345") == "take_gil");
    CHECK(symbol_base_name("pthread_cond_timedwait@@GLIBC_2.3.2") == "pthread_cond_timedwait");
    CHECK(symbol_base_name("memcpy@GLIBC_2.2.5") == "memcpy");
    CHECK(symbol_base_name("drop_gil.cold.12") == "drop_gil");
    CHECK(symbol_base_name("f.part.0.constprop.0") == "f");
    CHECK(symbol_base_name("g.__uniq.123456789") == "g");
    // Dots and '@' of the name's own stay (perf inject --jit's Python frames).
    CHECK(symbol_base_name("py::Condition.wait:/root/.pyenv/versions/3.13.0/lib/python3.13/threading.py") ==
          "py::Condition.wait:/root/.pyenv/versions/3.13.0/lib/python3.13/threading.py");
    CHECK(symbol_base_name("py::run:/home/a@b/app.py") == "py::run:/home/a@b/app.py");
    CHECK(symbol_base_name("python3.13") == "python3.13");
    CHECK(symbol_base_name("x.cold_path") == "x.cold_path");
    CHECK_THROWS_AS(resolve_python_binary("/bin/sh"), Error);
    CHECK_THROWS_AS(resolve_python_binary("no-such-python-here"), Error);
}

TEST_CASE("not a CPython: a clear note, no guess") {
    ElfFile elf("/bin/ls");
    GilLocation loc = locate_gil(elf);
    CHECK(loc.take.empty());
    REQUIRE_FALSE(loc.notes.empty());
    CHECK_THROWS_AS(plan_probes("/bin/ls"), Error);
    CHECK_THROWS_AS(ElfFile("/etc/hostname"), Error);
}

TEST_CASE("uprobes installed through tracefs idempotently, and removed") {
    std::string tracefs;
    REQUIRE_NOTHROW(tracefs = tracefs_dir(true));  // tests run as root on this machine kind
    std::string group = "gil_test_" + std::to_string(::getpid());
    ProbePlan plan = plan_probes("/usr/bin/python3.11", group);
    auto written = install_probes(plan, tracefs);
    CHECK(written.size() == plan.probes.size());
    CHECK(install_probes(plan, tracefs).empty());  // already there
    std::string events = shell_output("cat " + tracefs + "/uprobe_events");
    CHECK(events.find(group + "/take_gil ") != std::string::npos);
    CHECK(remove_probes(group, tracefs) == plan.probes.size());
    events = shell_output("cat " + tracefs + "/uprobe_events");
    CHECK(events.find(group + "/") == std::string::npos);
}

TEST_CASE("take_gil's entry probe reads which GIL on 3.12+ (tstate->interp->ceval.gil, offsets from DWARF)") {
    // The offsets as gdb prints them for these builds:
    //   gdb -batch -ex 'print (long)&((PyThreadState*)0)->interp'
    //              -ex 'print (long)&((PyInterpreterState*)0)->ceval.gil' libpython3.1X.so.1.0
    // 3.12.1: 16 and 384; 3.13.0: 16 and 16 (ceval moved to the interpreter's start).
    const std::pair<const char*, const char*> want[] = {
        {"/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0", "gil=+384(+16(%di)):x64"},
        {"/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0", "gil=+16(+16(%di)):x64"},
        // One GIL in _PyRuntime: nothing to read.
        {"/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", ""},
        {"/root/.pyenv/versions/3.9.18/lib/libpython3.9.so.1.0", ""},
        // Stripped, no debug file: one GIL per process assumed.
        {"/usr/bin/python3.11", ""},
    };
    for (const auto& w : want) {
        // Not a structured binding: clang 14 (the fuzz build) cannot capture one in CAPTURE's lambda.
        const char* const lib = w.first;
        const char* const args = w.second;
        CAPTURE(lib);
        ProbePlan plan = plan_probes(lib, "gil_args_test");
        size_t with_args = 0;
        for (const UprobeSpec& p : plan.probes) {
            CAPTURE(p.line());
            const bool take_entry = !p.ret && p.event == "take_gil";
            CHECK(p.args == (take_entry ? args : ""));
            with_args += !p.args.empty();
            if (!p.args.empty()) CHECK(p.line().size() > p.args.size() + 1);
            if (!p.args.empty()) CHECK(p.line().substr(p.line().size() - p.args.size() - 1) == " " + p.args);
        }
        CHECK(with_args == (*args ? 1u : 0u));
        // The plan says which it is.
        bool said = false;
        for (const auto& n : plan.loc.notes)
            said |= n.find(*args ? "take_gil reads which GIL" : "one GIL per process assumed") != std::string::npos;
        CHECK(said);
    }
    // Only the function at that address, and only a parameter that reaches a GIL pointer.
    std::string why;
    const std::string lib313 = "/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0";
    ElfFile elf(lib313);
    const ElfSymbol* take = elf.find_symbol("take_gil");
    const ElfSymbol* drop = elf.find_symbol("drop_gil");
    REQUIRE(take);
    REQUIRE(drop);
    auto a = gil_arg_path(lib313, "take_gil", take->value, &why);
    REQUIRE(a);
    CHECK(a->reg == "%di");
    CHECK(a->derefs == std::vector<uint32_t>{16, 16});
    CHECK_FALSE(gil_arg_path(lib313, "take_gil", take->value + 1, &why));
    CHECK(why.find("no DWARF subprogram") != std::string::npos);
    // drop_gil(PyInterpreterState *interp, ...): an interpreter's ceval.gil, one load.
    a = gil_arg_path(lib313, "drop_gil", drop->value, &why);
    REQUIRE(a);
    CHECK(a->derefs == std::vector<uint32_t>{16});
    // 3.12's drop_gil(struct _ceval_state *, ...) has no `ceval` member to follow.
    const std::string lib312 = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0";
    ElfFile elf312(lib312);
    CHECK_FALSE(gil_arg_path(lib312, "drop_gil", elf312.find_symbol("drop_gil")->value, &why));
    CHECK(why.find("does not reach a per-interpreter GIL pointer") != std::string::npos);
    CHECK_FALSE(gil_arg_path("/usr/bin/python3.11", "take_gil", 0, &why));
    CHECK(why.find("no DWARF") != std::string::npos);
}

TEST_CASE("uprobes with a fetch argument installed idempotently, and removed") {
    const std::string tracefs = tracefs_dir(true);
    const std::string group = "gil_argtest_" + std::to_string(::getpid());
    ProbePlan plan = plan_probes("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0", group);
    CHECK(install_probes(plan, tracefs).size() == plan.probes.size());
    CHECK(install_probes(plan, tracefs).empty());  // the kernel's line, args and all, read back as the same
    const std::string events = shell_output("cat " + tracefs + "/uprobe_events");
    CHECK(events.find(group + "/take_gil ") != std::string::npos);
    CHECK(events.find(" gil=+16(+16(%di)):x64") != std::string::npos);
    const std::string format = shell_output("cat " + tracefs + "/events/" + group + "/take_gil/format");
    CHECK(format.find("field:u64 gil;") != std::string::npos);
    // The same probe without its argument is replaced, not kept.
    ProbePlan bare = plan;
    for (auto& p : bare.probes) p.args.clear();
    CHECK(install_probes(bare, tracefs).size() == 1);
    CHECK(shell_output("cat " + tracefs + "/events/" + group + "/take_gil/format").find("field:u64 gil;") == std::string::npos);
    CHECK(remove_probes(group, tracefs) == plan.probes.size());
}

TEST_CASE("build_id_debug_path: where Debian's debug packages put a build's debug file") {
    CHECK(build_id_debug_path("93ac61ff") == "/usr/lib/debug/.build-id/93/ac61ff.debug");
    CHECK(build_id_debug_path("93ac61ff", "/sym") == "/sym/usr/lib/debug/.build-id/93/ac61ff.debug");
    CHECK(build_id_debug_path("93").empty());
    // libc6-dbg (scripts/build installs it) ships glibc's at exactly that path.
    const std::string id = ElfFile("/lib/x86_64-linux-gnu/libc.so.6").build_id();
    REQUIRE(id.size() == 40);
    CHECK(fs::exists(build_id_debug_path(id)));
}

TEST_CASE("probe --remove without a group removes gilscan's own groups only; install touches only its group") {
    std::string tracefs;
    REQUIRE_NOTHROW(tracefs = tracefs_dir(true));
    const std::string pid = std::to_string(::getpid());
    // A hand-made group of the old default name, and the GIL post's recipe's,
    // with the same event names as gilscan's.
    ProbePlan mine = plan_probes("/usr/bin/python3.11", std::string(kProbeGroupPrefix) + "test_" + pid);
    ProbePlan hand = plan_probes("/usr/bin/python3.11", "gil_hand_" + pid);
    ProbePlan blog = plan_probes("/usr/bin/python3.11", "python" + pid);
    for (const ProbePlan* p : {&hand, &blog, &mine}) install_probes(*p, tracefs);
    std::string events = shell_output("cat " + tracefs + "/uprobe_events");
    for (const ProbePlan* p : {&hand, &blog, &mine}) CHECK(events.find(p->group + "/take_gil ") != std::string::npos);
    CHECK(remove_probes("", tracefs) >= mine.probes.size());
    events = shell_output("cat " + tracefs + "/uprobe_events");
    CHECK(events.find(mine.group + "/") == std::string::npos);
    CHECK(events.find(hand.group + "/take_gil ") != std::string::npos);
    CHECK(events.find(blog.group + "/take_gil ") != std::string::npos);
    CHECK(remove_probes(hand.group, tracefs) == hand.probes.size());
    CHECK(remove_probes(blog.group, tracefs) == blog.probes.size());
}
