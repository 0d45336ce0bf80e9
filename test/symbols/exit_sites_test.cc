// Where take_gil and drop_gil return, on pyenv's CPython 3.6-3.13 and
// Debian's python3.11, checked against objdump (a second disassembler): the rets of the
// function and of the cold parts it jumps to, and tail jumps as exits.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include <unistd.h>

#include "gilscan/gil/probe_plan.h"
#include "gilscan/symbols/eh_frame.h"
#include "gilscan/symbols/exit_sites.h"
#include "gilscan/symbols/gil_locator.h"
#include "gilscan/symbols/py2_gil.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

// objdump's instructions in [start, end) whose mnemonic matches `op`: their addresses.
std::set<uint64_t> objdump_at(const std::string& bin, uint64_t start, uint64_t end, const std::string& op) {
    char range[128];
    std::snprintf(range, sizeof range, "--start-address=0x%llx --stop-address=0x%llx",
                  static_cast<unsigned long long>(start), static_cast<unsigned long long>(end));
    const std::string dis = shell_output("objdump -d --no-show-raw-insn " + std::string(range) + " " + bin);
    std::set<uint64_t> out;
    const std::regex line("^\\s*([0-9a-f]+):\\s+(?:(?:bnd|notrack|repz|rep)\\s+)?" + op + "\\b");
    std::istringstream lines(dis);
    std::smatch m;
    for (std::string l; std::getline(lines, l);)
        if (std::regex_search(l, m, line)) out.insert(std::stoull(m[1].str(), nullptr, 16));
    return out;
}

std::set<uint64_t> objdump_rets(const std::string& bin, const FunctionExits& x) {
    std::set<uint64_t> out;
    for (const auto& [s, e] : x.parts)
        for (uint64_t a : objdump_at(bin, s, e, "ret")) out.insert(a);
    return out;
}

}  // namespace

TEST_CASE("pyenv 3.6-3.13: take_gil and drop_gil return where objdump's rets are") {
    size_t functions = 0;
    for (const char* v : {"3.6.15", "3.7.16", "3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"}) {
        fs::path lib;
        for (const auto& e : fs::directory_iterator(fs::path("/root/.pyenv/versions") / v / "lib"))
            if (e.path().filename().string().find(".so.1.0") != std::string::npos) lib = e.path();
        REQUIRE_MESSAGE(!lib.empty(), v);
        ElfFile elf(lib.string());
        const auto plt = plt_stub_names(elf);
        GilLocation loc = locate_gil(elf);
        for (const auto& fns : {loc.take, loc.drop})
            for (const GilFunction& f : fns) {
                INFO(lib.string() << " " << f.name);
                FunctionExits x = function_exits(elf, f.vaddr, f.vaddr + f.size, plt);
                CHECK(x.unsure.empty());
                REQUIRE_FALSE(x.at.empty());
                CHECK(std::set<uint64_t>(x.at.begin(), x.at.end()) == objdump_rets(lib.string(), x));
                ++functions;
            }
    }
    CHECK(functions >= 17);  // take_gil and drop_gil of each, 3.8's take_gil.constprop.0
}

TEST_CASE("Debian's stripped python3.11: the cold parts' code is scanned, its own rets are the exits") {
    const std::string bin = "/usr/bin/python3.11";
    ElfFile elf(bin);
    const auto plt = plt_stub_names(elf);
    GilLocation loc = locate_gil(elf);
    REQUIRE(loc.take.size() >= 1);
    REQUIRE(loc.drop.size() >= 2);  // drop_gil, and its copy inlined into PyEval_SaveThread
    for (const auto& fns : {loc.take, loc.drop})
        for (const GilFunction& f : fns) {
            if (f.site) continue;  // a release point inside another function (release_sites_test.cc)
            INFO(f.name << " at 0x" << std::hex << f.vaddr);
            auto own = fde_at(elf, f.vaddr);
            REQUIRE(own);
            CHECK(own->start == f.vaddr);
            CHECK(own->at_start == Fde::Entry);
            FunctionExits x = function_exits(elf, f.vaddr, f.vaddr + f.size, plt);
            CHECK(x.unsure.empty());
            // Each jumps to its own cold code (fatal-error paths): a second FDE,
            // entered inside the function's frame.
            REQUIRE(x.parts.size() >= 2);
            for (size_t i = 1; i < x.parts.size(); ++i) {
                auto cold = fde_at(elf, x.parts[i].first);
                REQUIRE(cold);
                CHECK(cold->at_start == Fde::Inside);
                CHECK((x.parts[i].first >= f.vaddr + f.size || x.parts[i].second <= f.vaddr));
            }
            CHECK(std::set<uint64_t>(x.at.begin(), x.at.end()) == objdump_rets(bin, x));
            CHECK(objdump_at(bin, f.vaddr, f.vaddr + f.size, "ret").size() == x.at.size());
        }
}

TEST_CASE("a tail jump is an exit: Python 2's PyEval_ReleaseLock jumps to PyThread_release_lock") {
    const std::string lib = "/root/.pyenv/versions/2.7.18/lib/libpython2.7.so.1.0";
    ElfFile elf(lib);
    const auto plt = plt_stub_names(elf);
    const ElfSymbol* fn = elf.find_symbol("PyEval_ReleaseLock");
    REQUIRE(fn);
    REQUIRE(fn->size);
    FunctionExits x = function_exits(elf, fn->value, fn->value + fn->size, plt);
    CHECK(x.unsure.empty());
    const auto jumps = objdump_at(lib, fn->value, fn->value + fn->size, "jmp");
    REQUIRE(jumps.size() == 1);
    CHECK(std::set<uint64_t>(x.at.begin(), x.at.end()) == jumps);
    // Its target, PyThread_release_lock's PLT stub or entry, is a function: the FDE there starts at an entry.
    auto target = fde_at(elf, exported_address(elf, "PyThread_release_lock"));
    REQUIRE(target);
    CHECK(target->at_start == Fde::Entry);
}

TEST_CASE("an indirect jump leaves the exits unknown: a return probe is kept") {
    // PyEval_EvalFrameDefault's opcode dispatch is a computed goto (jmp *%rax).
    const std::string lib = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
    ElfFile elf(lib);
    const ElfSymbol* fn = elf.find_symbol("_PyEval_EvalFrameDefault");
    REQUIRE(fn);
    FunctionExits x = function_exits(elf, fn->value, fn->value + fn->size, plt_stub_names(elf));
    CHECK(x.unsure.find("an indirect jump at 0x") == 0);
}

TEST_CASE("a probe active for every process: code_at reads the file's ret, and the plan is unchanged") {
    // perf record -a with a uprobe makes the kernel write its breakpoint into
    // mappings of the file that may execute (whether a given read-only
    // mapping gets it depends on how the kernel mapped it: a process of
    // gilscan's did, and `gilscan record` beside a ground-truth recording
    // then found no ret; test/e2e/blame_e2e.py's live run is that case).
    // code_at reads the file itself, so the plan is the same as without it.
    std::string tracefs;
    REQUIRE_NOTHROW(tracefs = tracefs_dir(true));
    const std::string lib = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0";
    const std::string group = std::string(kProbeGroupPrefix) + "exits_" + std::to_string(::getpid());
    const ProbePlan before = plan_probes(lib, group);
    const UprobeSpec* ret = nullptr;
    for (const auto& p : before.probes)
        if (p.event == "take_gil__return") ret = &p;
    REQUIRE(ret);
    REQUIRE_FALSE(ret->ret);
    install_probes(before, tracefs);
    const std::string out = (fs::temp_directory_path() / (group + ".data")).string();
    const std::string cmd = "perf record -q -a -e " + group + ":take_gil__return -o " + out + " -- sleep 3 2>&1";
    std::FILE* perf = ::popen(cmd.c_str(), "r");
    REQUIRE(perf);
    ::sleep(1);  // perf has opened its events once it runs sleep
    ElfFile elf(lib);
    const ElfSymbol* take = nullptr;
    for (const auto& s : elf.symbols())
        if (s.name == "take_gil" && !s.dynamic) take = &s;
    REQUIRE(take);
    const std::vector<uint8_t> code = elf.code_at(take->value + (ret->offset - *elf.vaddr_to_offset(take->value)), 1);
    const ProbePlan during = plan_probes(lib, group);
    std::string said;
    for (int ch; (ch = std::fgetc(perf)) != EOF;) said += static_cast<char>(ch);
    const int status = ::pclose(perf);
    fs::remove(out);
    remove_probes(group, tracefs);
    INFO("perf said: " << said);
    CHECK(status == 0);
    REQUIRE(code.size() == 1);
    CHECK(code[0] == 0xc3);  // ret, as the file holds it
    REQUIRE(during.probes.size() == before.probes.size());
    for (size_t i = 0; i < during.probes.size(); ++i) CHECK(during.probes[i].line() == before.probes[i].line());
}
