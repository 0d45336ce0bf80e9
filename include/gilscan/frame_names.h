// Stage: the names of an unwound frame's pc — the innermost inlined call
// around it ("[inlined] PyCOND_TIMEDWAIT (libpython3.11.so.1.0)") and its
// function ("take_gil+0xbe (libpython3.11.so.1.0)") — for --sleep-stacks.
//
//   FrameNamer names;                          // one per set of Dwfls (a DwarfUnwinder's)
//   std::vector<std::string> text = names.describe(frame);  // frame.dwfl: one of those Dwfls
//   describe_frame(frame)                       // the same text, from libdw's lookups alone
//
// Why not libdw's lookups alone: dwfl_module_addrinfo searches the whole
// symbol table for every address (about 2 million instructions for
// libpython's 15,000 symbols) and dwarf_getscopes walks the compilation
// unit's DIE tree from its root; naming the 36 distinct frames of the
// bench's DWARF capture was a fifth of its instructions, and on a short
// recording most of the run. FrameNamer keeps, per module, libdwfl's own
// symbol list (dwfl_module_getsym_info) sorted by address and makes the
// same choice libdwfl's __libdwfl_addrsym makes among the few symbols
// around the address; where that choice depends on what the index does not
// keep (size-less symbols, which need the sections), it asks libdw. The
// tests compare the two on every symbol boundary of real binaries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

struct Dwfl_Module;

namespace gilscan {

struct Frame;

// From libdw's lookups alone: dwfl_module_addrinfo, dwarf_getscopes.
std::vector<std::string> describe_frame(const Frame& f);
// libdw's symbol for pc in module m (dwfl_module_addrinfo): its name, or
// nullptr; off: pc's offset from it.
const char* libdw_symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off);

class FrameNamer {
public:
    FrameNamer();
    ~FrameNamer();
    FrameNamer(const FrameNamer&) = delete;
    FrameNamer& operator=(const FrameNamer&) = delete;

    // The text describe_frame(f) gives. f.dwfl must stay alive as long as
    // this namer (its modules' indexes are kept by Dwfl_Module).
    std::vector<std::string> describe(const Frame& f);
    // The symbol part alone: what libdw_symbol(m, pc, off) gives.
    const char* symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off);

    // Lookups answered by the index, and those it handed to libdw.
    uint64_t symbol_hits() const { return symbol_hits_; }
    uint64_t symbol_fallbacks() const { return symbol_fallbacks_; }

    struct SymbolIndex;  // frame_names.cc

private:
    std::unordered_map<Dwfl_Module*, std::unique_ptr<SymbolIndex>> symbols_;
    uint64_t symbol_hits_ = 0, symbol_fallbacks_ = 0;
};

}  // namespace gilscan
