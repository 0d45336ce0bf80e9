// The GIL releases Debian's python3.11 inlined where no located function
// is, checked against objdump: every call of pthread_cond_signal that passes
// the constant PyEval_SaveThread's own copy of drop_gil passes.
#include <doctest/doctest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "gilscan/symbols/gil_locator.h"
#include "gilscan/symbols/release_sites.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

TEST_CASE("Debian's python3.11: drop_gil's inlined copies are release sites, as objdump shows them") {
    const std::string bin = "/usr/bin/python3.11";
    ElfFile elf(bin);
    GilLocation loc = locate_gil(elf);
    // objdump's view: each call of pthread_cond_signal and the constant put in edi just before it.
    const std::string dis = shell_output("objdump -d --no-show-raw-insn " + bin);
    std::istringstream lines(dis);
    const std::regex mov(R"(^\s*[0-9a-f]+:\s+mov\s+\$0x([0-9a-f]+),%edi)");
    const std::regex call(R"(^\s*([0-9a-f]+):\s+call\s+[0-9a-f]+ <pthread_cond_signal@plt>)");
    std::map<uint64_t, uint64_t> calls;  // call address -> the constant, or 0
    uint64_t last_mov = 0;
    std::smatch m;
    for (std::string l; std::getline(lines, l);) {
        if (std::regex_search(l, m, mov)) {
            last_mov = std::stoull(m[1].str(), nullptr, 16);
        } else if (std::regex_search(l, m, call)) {
            calls[std::stoull(m[1].str(), nullptr, 16)] = last_mov;
            last_mov = 0;
        } else if (l.find("\tcall") != std::string::npos) {
            last_mov = 0;
        }
    }
    const ElfSymbol* save = elf.find_symbol("PyEval_SaveThread");
    REQUIRE(save);
    uint64_t cond = 0;
    for (const auto& [at, c] : calls)
        if (at >= save->value && at < save->value + save->size) cond = c;
    REQUIRE(cond != 0);  // its copy signals a constant: gil->cond in the static _PyRuntime
    std::set<uint64_t> want;
    for (const auto& [at, c] : calls) {
        bool located = false;
        for (const auto& fns : {loc.take, loc.drop})
            for (const GilFunction& f : fns) located |= !f.site && at >= f.vaddr && at < f.vaddr + f.size;
        if (c == cond && !located) want.insert(at);
    }
    std::set<uint64_t> got;
    for (const GilFunction& f : loc.drop)
        if (f.site) got.insert(f.vaddr);
    CHECK(want.size() == 4);  // _Py_read and three functions without a symbol
    CHECK(got == want);
    bool py_read = false;
    for (const GilFunction& f : loc.drop) py_read |= f.site && f.name == "_Py_read";
    CHECK(py_read);
}

TEST_CASE("pyenv's builds signal the GIL through a pointer: no release sites added") {
    for (const char* lib : {"/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0",
                            "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"}) {
        ElfFile elf(lib);
        GilLocation loc = locate_gil(elf);
        for (const GilFunction& f : loc.drop) CHECK_FALSE(f.site);
        LocateOptions stripped;
        stripped.use_symtab = false;
        GilLocation dis = locate_gil(elf, stripped);
        for (const GilFunction& f : dis.drop) CHECK_FALSE(f.site);
    }
}
