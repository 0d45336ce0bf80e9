// Stage: DWARF unwinding of a sample's user stack (REGS_USER + STACK_USER)
// with elfutils libdw.
//
//   DwarfUnwinder uw(modules);
//   UnwindStatus st = uw.unwind(space, sample, [&](const Frame& f) {
//       return f.module && f.module->in_take(f.vaddr) ? FrameAction::Stop : FrameAction::Continue;
//   });
//
// One long-lived Dwfl per layout of executable mappings (never one per
// sample: that is the classic 10x slowness); modules mapped later are added
// to it with dwfl_report_begin_add. libdw reads .eh_frame (and .debug_frame
// from separate debuginfo when it finds it) from the files; memory reads
// come from the sample's stack copy (only its dyn_size valid bytes) or,
// outside it, from the mapped file. Frames are computed from the CFI rules
// libdw reports, cached per pc (cfi_rules.h); libdw walks what those rules
// cannot describe, with the same results (test/symbols/unwind_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <unordered_map>

#include "gilscan/symbols/frame_names.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/perf_map.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/perfdata/sample.h"

namespace gilscan {

struct Frame {
    uint64_t pc = 0;        // runtime address (return addresses already moved back into the call)
    uint64_t vaddr = 0;     // the module's link-time address of pc
    const Module* module = nullptr;
    const Mapping* mapping = nullptr;
    unsigned depth = 0;
    void* dwfl = nullptr;   // the Dwfl it was unwound with (for describe_frame)
};

// A frame in anonymous executable memory, no file's: JIT code, which perf
// (and gilscan) name from the process's perf map (perf_map.h).
inline bool in_jit_code(const Frame& f) {
    return !f.module && f.mapping && f.mapping->exec && is_jit_mapping(f.mapping->path);
}

enum class FrameAction { Continue, Stop };

enum class UnwindStatus {
    Stopped,      // the callback had its answer
    Complete,     // walked to the outermost frame
    StoppedEarly, // an error after some frames
    Failed,       // no usable registers/stack, or no frame beyond the first
};

class DwarfUnwinder {
public:
    explicit DwarfUnwinder(ModuleCache& modules);
    ~DwarfUnwinder();
    DwarfUnwinder(const DwarfUnwinder&) = delete;
    DwarfUnwinder& operator=(const DwarfUnwinder&) = delete;

    UnwindStatus unwind(const AddressSpace& as, const Sample& s, const std::function<FrameAction(const Frame&)>& cb,
                        unsigned max_frames = 64);
    size_t dwfl_count() const { return spaces_.size(); }
    // The Dwfl (as void*) of this address space's layout, its modules
    // reported: for describe() on frames unwound elsewhere.
    void* dwfl_for(const AddressSpace& as);
    // Symbolized names of a frame unwound with one of this unwinder's Dwfls
    // (f.dwfl), innermost first: DWARF inline frames ("[inlined] take_gil"),
    // then the function from symtab / dynsym / MiniDebugInfo with compiler
    // clone suffixes removed, "+0xOFF (module)". The text describe_frame(f)
    // gives, from indexes kept per module (frame_names.h).
    std::vector<std::string> describe(const Frame& f) { return names_.describe(f); }
    const FrameNamer& namer() const { return names_; }

    // Frames from cached CFI rules first (on by default), libdw for the
    // stacks they cannot describe. Off: libdw alone (tests compare the two).
    void set_fast(bool on) { fast_ = on; }
    // Stacks the fast path handed to libdw, and the frames each path delivered.
    uint64_t fallbacks() const { return fallbacks_; }
    uint64_t fast_frames() const { return fast_frames_; }
    // Of fast_frames: frames outside any module, stepped by the frame pointer.
    uint64_t fp_frames() const { return fp_frames_; }
    // Of fast_frames: frames in JIT code stepped by the CFI its process's
    // jitdump recorded (jit_cfi.h; CPython 3.13+'s -X perf_jit).
    uint64_t jit_frames() const { return jit_frames_; }
    uint64_t libdw_frames() const { return libdw_frames_; }

    // Callback plumbing (libdw's C callbacks reach the current sample here).
    struct Current;

private:
    struct Space;
    Space* space_for(const AddressSpace& as);
    std::optional<UnwindStatus> unwind_fast(Space& sp, const std::function<FrameAction(const Frame&)>& cb,
                                            unsigned max_frames, unsigned& delivered, bool& restart);
    const CfiRule* jit_rule(const AddressSpace& as, uint64_t pc);
    bool fast_ = true;
    uint64_t fallbacks_ = 0, fast_frames_ = 0, libdw_frames_ = 0, fp_frames_ = 0, jit_frames_ = 0;
    int32_t jit_pid_ = 0;
    std::shared_ptr<const PerfMap> jit_map_;  // jit_pid_'s
    ModuleCache& modules_;
    std::unordered_map<uint64_t, std::unique_ptr<Space>> spaces_;
    FrameNamer names_;  // after spaces_: destroyed first, while the Dwfls its indexes point into exist
};

// x86-64: perf_event_x86_regs index -> DWARF register number (-1: none).
int perf_reg_to_dwarf(unsigned perf_reg);

}  // namespace gilscan
