// Stage: the stacks GIL blame names — a holder's CPU sample or the
// switch-out of a sleep it took with the GIL held — unwound whole and named
// by function, each distinct stack once.
//
//   BlameStacks stacks(modules);
//   uint32_t id = stacks.resolve(*maps.space(s.pid), s);   // interned: same frames, same id
//   const BlameStack& b = stacks.stack(id);   // b.frames (root first), b.python, b.native
//
// Two names per stack:
//   python  the innermost Python function: a JIT frame its process's perf
//           map or jitdump names (CPython 3.12+ -X perf / -X perf_jit:
//           "py::hog:/app/prog.py" -> "hog (/app/prog.py)"), or "".
//   native  the native culprit: walking from the leaf outwards, the frame
//           just inside the innermost interpreter frame (the eval loop, the
//           call dispatch, ctypes and libffi's call glue), so a ctypes call
//           blocked in clock_nanosleep is named `usleep`, and sorted() is
//           `list_sort`; the leaf itself when it is an interpreter frame
//           (pure Python code: `_PyEval_EvalFrameDefault`).
// Kernel frames are left out: the user stack says what the program asked.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gilscan/perfdata/sample.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/symbols/unwind.h"

namespace gilscan {

struct BlameStack {
    std::vector<std::string> frames;  // function names, root first ("[inlined] x" parts included as x)
    std::string python;               // innermost Python function, or ""
    std::string native;               // the native culprit
    std::string module;               // native's file name ("libc.so.6"), or ""
};

// A sample kept for later: its address space as it was, and its own copy of
// the registers and stack (the record's bytes are reused once delivered).
struct SampleCopy {
    std::shared_ptr<const AddressSpace> space;
    Sample sample;
    std::vector<uint8_t> bytes;
    SampleCopy(std::shared_ptr<const AddressSpace> as, const Sample& s) { assign(std::move(as), s); }
    // Another sample into the same copy (its buffer's capacity kept).
    void assign(std::shared_ptr<const AddressSpace> as, const Sample& s);
    SampleCopy(const SampleCopy&) = delete;
    SampleCopy& operator=(const SampleCopy&) = delete;
};

// Whether a function (its symbol, clone suffixes removed) is the
// interpreter's own machinery: evaluation, call dispatch, ctypes/libffi
// call glue. Exposed for the tests.
bool is_interpreter_frame(std::string_view function);
// "py::hog:/app/prog.py" -> "hog (/app/prog.py)"; "" when not a perf-map Python name.
std::string python_function_name(std::string_view jit_symbol);

class BlameStacks {
public:
    // Ids below kFirstStack stand for time without a stack to name it.
    static constexpr uint32_t kNoSample = 0;   // on CPU, no CPU sample of the thread came after
    static constexpr uint32_t kNoStack = 1;    // off CPU, its switch-out carried no user stack
    static constexpr uint32_t kUnknown = 2;    // its state was unknown (lost events, before first seen)
    static constexpr uint32_t kSampleNoStack = 3;  // on CPU, charged to a CPU sample without a user stack
    static constexpr uint32_t kFirstStack = 4;
    static constexpr unsigned kMaxFrames = 256;

    explicit BlameStacks(ModuleCache& modules);
    // Whole stacks, root to leaf (for folded output). Off (the default):
    // each walk ends at the innermost Python function and native culprit,
    // and a stack's frames are those up to there.
    void set_full_stacks(bool on) { full_ = on; }
    // gilscan top: the processes are running, and their perf maps grow. A
    // JIT frame its map does not name yet is looked up again (once the map
    // has grown), and a stack with such a frame is not kept by its pcs.
    void set_live(bool on) { live_ = on; }
    static constexpr size_t kLivePcStacks = 50'000;  // live: the most stacks kept by their pcs
    // The stack of a sample with REGS_USER and STACK_USER, or kNoStack /
    // kSampleNoStack (on_cpu) when it has none or not one frame unwound.
    uint32_t resolve(const AddressSpace& as, const Sample& s, bool on_cpu);
    const BlameStack& stack(uint32_t id) const { return stacks_[id]; }
    size_t size() const { return stacks_.size(); }
    // Some stack reached a Python function's name (a perf map's or jitdump's).
    bool named_python() const { return named_python_; }
    uint64_t unwound() const { return unwound_; }

private:
    struct FrameName {
        std::vector<std::string> names;  // innermost first: inlined calls, then the function
        std::string module;
        bool jit_python = false;
        bool glue = false;  // the interpreter's machinery (is_interpreter_frame, or libffi's / _ctypes's file)
        bool jit_unnamed = false;  // JIT code its process's map did not name (yet)
    };
    void name_jit(const AddressSpace& as, const Frame& f, FrameName& n);
    const FrameName& name(const AddressSpace& as, const Frame& f);
    uint32_t name_stack(const AddressSpace& as);  // frames_ named and interned
    bool has_jit_code(const AddressSpace& as);    // maps code a perf map or jitdump may name
    uint32_t intern(BlameStack&& b);
    ModuleCache& modules_;
    DwarfUnwinder unwinder_;
    std::deque<BlameStack> stacks_;  // deque: views of their names stay valid (the trace's culprits)
    std::unordered_map<std::string, uint32_t> ids_;     // frames joined -> id
    std::unordered_map<std::string, uint32_t> by_pcs_;  // (pid, layout, pcs) as bytes -> id
    std::string pc_key_;
    // (layout, pc) of a file's frame, or (pid, pc) of JIT code -> its names
    std::unordered_map<uint64_t, std::unordered_map<uint64_t, FrameName>> names_, jit_names_;
    std::unordered_map<int32_t, std::shared_ptr<const PerfMap>> jit_maps_;
    std::vector<Frame> frames_;
    std::unordered_map<uint64_t, std::pair<uint64_t, bool>> jit_spaces_;  // space id -> (version, has_jit_code)
    bool full_ = false;
    bool live_ = false;
    bool named_python_ = false;
    uint64_t unwound_ = 0;
};

}  // namespace gilscan
