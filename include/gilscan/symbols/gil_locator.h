// Stage: find take_gil / drop_gil in a CPython binary, with or without symbols.
//
//   ElfFile elf("/usr/bin/python3.11");
//   GilLocation loc = locate_gil(elf);
//   for (const GilFunction& f : loc.take) f.vaddr, f.how
//   loc.notes   // e.g. "drop_gil is inlined into PyEval_SaveThread"
//
// With symbols (pyenv builds): every local function whose name is take_gil or
// a compiler clone of it (take_gil.constprop.0, .lto_priv.N, .isra.N, ...;
// never the .cold part). Without (Debian's stripped python3, uv's
// python-build-standalone): take_gil is static, but its callers are exported:
// PyEval_RestoreThread, PyEval_AcquireThread, PyEval_AcquireLock (3.13: via
// _PyThreadState_Attach -> _PyEval_AcquireLock). Capstone disassembles them
// and follows direct calls and tail jumps (depth 3); the function reached
// from the most callers whose own body calls pthread_cond_timedwait through
// the PLT is take_gil. drop_gil is found the same way from PyEval_SaveThread,
// PyEval_ReleaseThread and PyEval_ReleaseLock, as the function that signals a
// condition variable and never waits with a timeout. A caller whose own body
// has the signature means the function was inlined into it. Extents come
// from the .eh_frame FDE of each function.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/symbols/eh_frame.h"
#include "gilscan/symbols/elf_file.h"

namespace gilscan {

struct GilFunction {
    std::string name;      // symbol name, or "take_gil" when found without one
    uint64_t vaddr = 0;
    uint64_t size = 0;     // from the symbol or the FDE; 0 if unknown
    std::string how;       // "symbol", "call target of PyEval_RestoreThread, ...", "inlined into ..."
    bool inlined = false;  // the signature was found inside an exported caller
    bool site = false;     // a point where the GIL is released (an inlined copy's signal), not a function
};

struct GilLocation {
    std::string binary, build_id;
    bool non_pie = false;
    bool from_symbols = false;
    std::vector<GilFunction> take, drop;
    std::vector<std::string> notes;
};

struct LocateOptions {
    bool use_symtab = true;  // false: act as if stripped (tests the disassembly path on unstripped builds)
};

GilLocation locate_gil(const ElfFile& elf, LocateOptions opt = {});

// Where `name` is exported (.dynsym, defined), or 0.
uint64_t exported_address(const ElfFile& elf, std::string_view name);

// A Python 2 libpython (or static python2): it exports PyString_FromString,
// which Python 3 has not. Its GIL is a plain lock, with no take_gil.
bool is_python2(const ElfFile& elf);

// Whether libcapstone could be loaded (the stripped-binary paths need it).
bool capstone_available();

// PLT stub address -> imported function name (from .rela.plt and the stubs).
std::map<uint64_t, std::string> plt_stub_names(const ElfFile& elf);


// Direct call / jmp targets in [start, end) and the PLT imports called there.
struct CallSite {
    uint64_t at = 0, next = 0;  // the instruction, and the one after it (where a call returns)
    bool jmp = false;           // a tail jump: it returns to the function's caller
    uint64_t target = 0;        // the callee's address (a PLT stub's for an import)
    std::string import;         // the PLT function called, or empty
};
struct CallScan {
    std::vector<uint64_t> targets;       // in order, direct calls and jumps leaving the range
    std::vector<std::string> imports;    // PLT functions called or jumped to
    std::vector<CallSite> sites;         // every such call and jump, in order
    std::vector<uint64_t> branch_targets;  // where direct jumps (conditional or not) may land
    std::vector<uint64_t> rets;            // ret instructions
    std::vector<uint64_t> indirect_jumps;  // jmp through a register or memory (a switch, an indirect tail call)
    std::vector<std::pair<uint64_t, uint64_t>> far_branches;  // conditional jumps leaving the range: at, target
};
CallScan scan_calls(const ElfFile& elf, uint64_t start, uint64_t end, const std::map<uint64_t, std::string>& plt);

// One instruction, as much of it as the release-site finder reads.
struct Insn {
    enum Kind : uint8_t { Other, Call, SetsRdi };
    uint64_t at = 0;
    Kind kind = Other;
    uint64_t value = 0;  // Call: its direct target (0: indirect); SetsRdi: the constant or RIP-relative address
};
// [start, end) disassembled from the file (ElfFile::code_at), in order.
std::vector<Insn> disassemble(const ElfFile& elf, uint64_t start, uint64_t end);

}  // namespace gilscan
