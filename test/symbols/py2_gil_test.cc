// Python 2's GIL for uprobes (py2_gil.h) on the real Python 2 of this
// machine kind (pyenv 2.7.18): its call sites against objdump, a second
// disassembler, with and without symbols; the locator's note on it; and
// no Python 3 taken for it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <tuple>
#include <unistd.h>

#include "gilscan/symbols/gil_locator.h"
#include "gilscan/gil/probe_plan.h"
#include "gilscan/symbols/py2_gil.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

TEST_CASE("Python 2 (pyenv 2.7.18): no take_gil; its GIL's call sites probed, as objdump finds them") {
    // Its GIL is a plain lock taken by PyThread_acquire_lock; the search
    // from the exported callers must come back empty, and say why.
    const std::string lib = "/root/.pyenv/versions/2.7.18/lib/libpython2.7.so.1.0";
    REQUIRE(fs::exists(lib));
    ElfFile elf(lib);
    CHECK(is_python2(elf));
    for (bool symtab : {true, false}) {
        LocateOptions opt;
        opt.use_symtab = symtab;
        GilLocation loc = locate_gil(elf, opt);
        CHECK(loc.take.empty());
        REQUIRE_FALSE(loc.notes.empty());
        CHECK(loc.notes.back().rfind("Python 2: its GIL is a plain lock", 0) == 0);
    }
    // The call sites, against objdump (a second disassembler): every call or
    // jump to the lock functions' PLT stubs in ceval.c's GIL functions.
    std::set<std::tuple<bool, std::string, uint64_t, uint64_t>> want;  // take, function, at, next (0: tail jump)
    const char* fns = "PyEval_EvalFrameEx PyEval_RestoreThread PyEval_SaveThread PyEval_AcquireThread "
                      "PyEval_ReleaseThread PyEval_AcquireLock PyEval_ReleaseLock PyEval_InitThreads PyEval_ReInitThreads";
    std::string out = shell_output(std::string("for f in ") + fns + "; do objdump -d --no-show-raw-insn --disassemble=$f " + lib +
                          " | awk -v f=$f '/^[0-9a-f]+ <'$f'>:/ {entry=$1} "
                          "/(call|jmp) +[0-9a-f]+ <PyThread_(acquire|release)_lock@plt>/ {at=$1; sub(\":\", \"\", at); "
                          "nx = \"\"; getline nx; split(nx, n, \":\"); if (n[1] !~ /[0-9a-f]/) n[1] = \"-\"; "
                          "print f, $2, $NF, at, n[1], entry}'; done");
    std::istringstream in(out);
    std::string fn, op, target, at, next, entry;
    while (in >> fn >> op >> target >> at >> next >> entry) {
        const bool take = target.find("acquire") != std::string::npos;
        if (op == "jmp") want.insert({take, fn, std::stoull(entry, nullptr, 16), 0});
        else want.insert({take, fn, std::stoull(at, nullptr, 16), std::stoull(next, nullptr, 16)});
    }
    REQUIRE(want.size() >= 8);
    auto sites_of = [](const ElfFile& e) {
        std::set<std::tuple<bool, std::string, uint64_t, uint64_t>> got;
        for (const auto& s : python2_gil_sites(e)) got.insert({s.take, s.function, s.at, s.next});
        return got;
    };
    CHECK(sites_of(elf) == want);
    // Stripped (no .symtab): the same sites, from .dynsym and Capstone alone.
    const std::string stripped = (fs::temp_directory_path() / ("gilscan-py2-" + std::to_string(::getpid()) + ".so")).string();
    REQUIRE(std::system(("strip -o " + stripped + " " + lib).c_str()) == 0);
    {
        ElfFile s(stripped);
        CHECK_FALSE(s.has_symtab());
        CHECK(sites_of(s) == want);
    }
    fs::remove(stripped);
    // The probes: a call's at the call and where it returns (a plain probe,
    // named as a return probe), a tail jump's on its function, entry and return.
    ProbePlan plan = plan_probes(lib);
    size_t takes = 0, drops = 0, ret_probes = 0;
    for (const auto& p : plan.probes) {
        takes += p.event.rfind("take_gil", 0) == 0 && p.event.find("__return") == std::string::npos;
        drops += p.event.rfind("drop_gil", 0) == 0 && p.event.find("__return") == std::string::npos;
        ret_probes += p.ret;
        if (p.ret) CHECK(p.event.find("__return") != std::string::npos);
    }
    CHECK(takes + drops == want.size());
    CHECK(plan.probes.size() == 2 * want.size());
    CHECK(ret_probes == std::count_if(want.begin(), want.end(), [](const auto& w) { return std::get<3>(w) == 0; }));
    // PyEval_SaveThread's `if (interpreter_lock)` branches to where its drop returns.
    bool flagged = false;
    for (const auto& s : python2_gil_sites(elf)) flagged |= s.function == "PyEval_SaveThread" && s.next_is_branch_target;
    CHECK(flagged);
    // No Python 3 gets that note, nor is taken for Python 2.
    for (const auto& v : fs::directory_iterator("/root/.pyenv/versions")) {
        if (v.path().filename().string().rfind("3.", 0) != 0) continue;
        const std::string p = shell_output("ls " + (v.path() / "lib").string() + "/libpython3*.so.1.0 | head -1 | tr -d '\\n'");
        REQUIRE_FALSE(p.empty());
        ElfFile e3(p);
        CHECK_FALSE(is_python2(e3));
        CHECK(python2_gil_sites(e3).empty());
        for (const auto& n : locate_gil(e3).notes) CHECK_MESSAGE(n.find("Python 2") == std::string::npos, p);
    }
}
