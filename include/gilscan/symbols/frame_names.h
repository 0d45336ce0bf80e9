// Stage: the names of an unwound frame's pc — the innermost inlined call
// around it ("[inlined] PyCOND_TIMEDWAIT (libpython3.11.so.1.0)") and its
// function ("take_gil+0xbe (libpython3.11.so.1.0)") — for --sleep-stacks.
//
//   FrameNamer names;                          // one per set of Dwfls (a DwarfUnwinder's)
//   std::vector<std::string> text = names.describe(frame);  // frame.dwfl: one of those Dwfls
//   describe_frame(frame)                       // the same text, from libdw's lookups alone
//   frame_text("take_gil", 0xbe, "libpython3.11.so.1.0")  // "take_gil+0xbe (libpython3.11.so.1.0)"
//
// Why not libdw's lookups alone: dwfl_module_addrinfo searches the whole
// symbol table for every address (about 2 million instructions for
// libpython's 15,000 symbols) and dwarf_getscopes walks the compilation
// unit's DIE tree from its root, then every function body before the
// inline function's abstract instance; naming the 36 distinct frames of
// the bench's DWARF capture was a third of its instructions, and on a short
// recording most of the run. FrameNamer keeps, per module, libdwfl's own
// symbol list (dwfl_module_getsym_info) sorted by address and makes the
// choice libdwfl's __libdwfl_addrsym makes among the few symbols around the
// address, and lists each DIE's children once to follow dwarf_getscopes's
// path to the innermost inlined call (elfutils 0.188's rules). Where an
// answer depends on what the indexes do not keep (size-less symbols, an
// abstract instance not at the unit's top level, imported units, DWARF
// errors), libdw answers. The tests compare the two at symbol boundaries,
// inside inlined calls and at random addresses of real binaries, and at
// every byte of a shared object built with symbols made to disagree.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

struct Dwfl_Module;

namespace gilscan {

struct Frame;
class NameStore;

// A frame's text as perf script prints it, one format for every namer
// (libdw's symbols, the GIL extents, kernel symbols, perf maps):
// "name+0xOFF (module)", and "0xPC (module)" where nothing names pc.
std::string frame_text(std::string_view name, uint64_t offset, std::string_view module);
std::string unnamed_frame_text(uint64_t pc, std::string_view module);

// From libdw's lookups alone: dwfl_module_addrinfo, dwarf_getscopes.
std::vector<std::string> describe_frame(const Frame& f);
// libdw's symbol for pc in module m (dwfl_module_addrinfo): its name, or
// nullptr; off: pc's offset from it.
const char* libdw_symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off);
// libdw's inlined calls around pc in module m (dwarf_getscopes), innermost first.
std::vector<std::string> libdw_inline_names(Dwfl_Module* m, uint64_t pc);

class FrameNamer {
public:
    FrameNamer();
    ~FrameNamer();
    FrameNamer(const FrameNamer&) = delete;
    FrameNamer& operator=(const FrameNamer&) = delete;

    // The text describe_frame(f) gives. f.dwfl must stay alive as long as
    // this namer (its modules' indexes are kept by Dwfl_Module).
    std::vector<std::string> describe(const Frame& f);
    // Answers kept from earlier runs (name_store.h), asked before libdw;
    // what libdw answers goes to it. Null: none (the default).
    void set_store(NameStore* store) { store_ = store; }
    // The symbol part alone: what libdw_symbol(m, pc, off) gives.
    const char* symbol(Dwfl_Module* m, uint64_t pc, uint64_t& off);
    // The inline part alone: what libdw_inline_names(m, pc) gives.
    std::vector<std::string> inline_names(Dwfl_Module* m, uint64_t pc);

    // Lookups answered by the index, and those it handed to libdw.
    uint64_t symbol_hits() const { return symbol_hits_; }
    uint64_t symbol_fallbacks() const { return symbol_fallbacks_; }
    uint64_t scope_hits() const { return scope_hits_; }
    uint64_t scope_fallbacks() const { return scope_fallbacks_; }

    struct SymbolIndex;  // frame_names.cc
    struct ScopeIndex;

private:
    template <class Push>
    void inline_names_into(Dwfl_Module* m, uint64_t pc, Push&& push);
    std::unordered_map<Dwfl_Module*, std::unique_ptr<SymbolIndex>> symbols_;
    std::unordered_map<Dwfl_Module*, std::unique_ptr<ScopeIndex>> scopes_;
    NameStore* store_ = nullptr;
    std::unordered_map<Dwfl_Module*, void*> stored_;  // module -> its NameStore::Module (null: not kept)
    uint64_t symbol_hits_ = 0, symbol_fallbacks_ = 0, scope_hits_ = 0, scope_fallbacks_ = 0;
};

}  // namespace gilscan
