// Stage: classify each sleep from its unwound user stack — S(GIL) when the
// thread sleeps inside take_gil, S(GIL handoff) inside drop_gil (the
// FORCE_SWITCHING wait on switch_cond), S otherwise.
//
//   ProcessMaps maps; ModuleCache mods(opts); GilStackClassifier gsc(maps, mods);
//   timeline.set_classifier([&](auto& s, auto& ev, auto& ps, auto& label) { gsc.classify(s, ev, ps, label); });
//   gsc.stats().decided, gsc.stats().failed ...
//
// Only switch-outs into S of a thread whose process maps a CPython are
// unwound, and only until the first frame in CPython: a GIL waiter's stack is
// glibc's wait frames, then take_gil (or the exported caller it is inlined
// into), so the first CPython frame decides. Frames are matched by address
// against the extents of take_gil / drop_gil in that module (symbols, clones
// and .cold parts, or the disassembly locator on stripped builds), not by
// name, so a stripped Debian python3 classifies like a pyenv one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <future>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <unordered_map>

#include "gilscan/symbols/kernel_symbols.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/symbols/stack_texts.h"
#include "gilscan/sched/sched_events.h"
#include "gilscan/sched/timeline.h"
#include "gilscan/symbols/unwind.h"

namespace gilscan {

struct StackStats {
    uint64_t sleeps_seen = 0;     // switch-outs into S
    uint64_t not_python = 0;      // the process maps no CPython: not unwound
    uint64_t no_stack = 0;        // the sample carries no user regs/stack
    uint64_t decided = 0;         // reached a CPython frame: answer known
    uint64_t complete = 0;        // walked the whole stack without a CPython frame
    uint64_t stopped_early = 0;   // unwinding stopped before a CPython frame
    uint64_t failed = 0;          // no frame beyond the first
    uint64_t gil = 0, handoff = 0;
    uint64_t py2_gil = 0;         // of gil: Python 2's, PyThread_acquire_lock called by a GIL taker
    uint64_t from_reader = 0;     // of the decided and the rest: labels the reader thread made (-j 2; not reported)
    StackStats& operator+=(const StackStats& o) {
        sleeps_seen += o.sleeps_seen;
        not_python += o.not_python;
        no_stack += o.no_stack;
        decided += o.decided;
        complete += o.complete;
        stopped_early += o.stopped_early;
        failed += o.failed;
        gil += o.gil;
        handoff += o.handoff;
        py2_gil += o.py2_gil;
        from_reader += o.from_reader;
        return *this;
    }
    StackStats& operator-=(const StackStats& o) {
        sleeps_seen -= o.sleeps_seen;
        not_python -= o.not_python;
        no_stack -= o.no_stack;
        decided -= o.decided;
        complete -= o.complete;
        stopped_early -= o.stopped_early;
        failed -= o.failed;
        gil -= o.gil;
        handoff -= o.handoff;
        py2_gil -= o.py2_gil;
        from_reader -= o.from_reader;
        return *this;
    }
};

// A decided sleep's evidence, "take_gil+0xbe in /path/libpython3.11.so (frame 2)",
// written over `out` (its capacity kept: a label is rewritten at every
// sleep without allocating). snprintf's format parsing cost 8% of a DWARF
// capture's instructions, once per sleep.
void frame_evidence(std::string& out, std::string_view function, uint64_t offset, std::string_view file, unsigned depth);

class GilStackClassifier {
public:
    // Symbolized frames by (address space layout, pc), shared between the
    // classifiers of -j workers: libdw's symbol and inline lookups are slow
    // and the same frames recur in nearly every stack. A classifier sharing
    // the cache keeps a private copy of what it used (no lock per frame).
    // From -j 3 a miss takes the lock, and is symbolized once for all
    // workers through one `symbolizer` Dwfl, so a module's DWARF is read and
    // decompressed once, not per worker. At -j 2 (no symbolizer) each of the
    // two threads names its misses through its own Dwfl, outside the lock and
    // at the same time as the other (`pending`): the first stacks of a run
    // bring hundreds of new frames, tens of milliseconds of libdw work that
    // one thread did while the other waited. The kernel's symbols are read
    // from /proc/kallsyms on a background thread as soon as the cache is
    // made (that read costs tens of milliseconds of kernel time).
    struct NameCache {
        // background = false: read on first use, on the thread that needs it (-j 1).
        // The recording's kernel: whether this machine's symbols are its,
        // and (rec.maps, filled as the records are read) where it was laid out.
        NameCache(const RecordedKernel& rec, bool kernel_names, bool background = true);
        std::mutex mu;  // the maps and the symbolizer
        // layout -> pc -> the frame's names as JSON strings ("a","b"), escaped once
        std::unordered_map<uint64_t, std::unordered_map<uint64_t, std::string>> names;
        std::unordered_map<uint64_t, std::string> kernel;  // kernel address -> its name as a JSON string
        std::shared_future<std::shared_ptr<const KernelSymbols>> ksyms;
        std::shared_ptr<KernelMapsLog> kernel_maps;
        // The recorded kernel maps, taken from kernel_maps at the first
        // kernel frame named: perf writes them before any sample.
        const KernelLayout& kernel_layout();
        std::once_flag layout_once;
        KernelLayout layout;
        // nullptr: each classifier names frames through its own Dwfl (-j 1,
        // and -j 2's two threads: see `pending`).
        std::unique_ptr<DwarfUnwinder> symbolizer;
        // Without a symbolizer, a shared cache's misses are named outside
        // the lock, each thread through its own Dwfl; (layout, pc) pairs
        // being named are here meanwhile, so that two threads meeting the
        // same new frames (the same stacks recur) name different ones: one
        // that never waits skips the frame, the other waits on `named`.
        std::set<std::pair<uint64_t, uint64_t>> pending;
        std::condition_variable named;
    };

    // A sleep's answer: from its first kAnswerFrames frames, whatever stack_frames is.
    static constexpr unsigned kAnswerFrames = 64;
    // stack_frames > 0: also attach the symbolized stack (kernel frames from
    // CALLCHAIN, then up to that many user frames) to every sleep's label.
    // `names`: a cache shared with other classifiers (default: its own).
    // `background`: for a cache of its own, whether /proc/kallsyms is read on a thread of its own.
    GilStackClassifier(const ProcessMaps* maps, ModuleCache& modules, unsigned stack_frames = 0,
                       const RecordedKernel& kernel = {}, std::shared_ptr<NameCache> names = nullptr,
                       bool background = true);

    // A SleepClassifier: sleeps ("S") only, in the sample's process.
    void classify(const Sample& s, const EventInfo& ev, const PrevState& ps, SleepLabel& label);
    // A sleep switch-out in a given address space (worker threads), into a
    // label whose strings are reused.
    void classify_into(const AddressSpace* as, const Sample& s, SleepLabel& label);
    const StackStats& stats() const { return stats_; }
    // The reader thread's classifier (-j 2) never waits for another thread.
    // A sleep whose label would have to wait (for a frame the stages' thread
    // is naming right now, or for /proc/kallsyms still being read) is
    // abandoned: abandoned() is then true, and the label and counts are as
    // before the call. Its other frames are still named into the shared
    // cache, so that the stages find them named when they classify that
    // sleep themselves.
    void set_never_wait(bool on) { never_wait_ = on; }
    // --gil-functions: a GIL wait's stack is unwound on past take_gil to
    // its first frame in JIT code, and the perf map's name for it goes to
    // SleepLabel::function: up to kAnswerFrames deep (stack_frames if
    // more), past the stack_frames kept. Answers and kept stacks stay the same.
    void set_gil_functions(bool on) { gil_functions_ = on; }
    // Sleep stacks' texts are kept once per distinct stack (StackTexts),
    // up to this many bytes (default kStackTextBytes); past it labels own
    // their texts. Kept texts live as long as the classifier.
    static constexpr size_t kStackTextBytes = 16u << 20;
    void limit_stack_texts(size_t bytes);
    const StackTexts& stack_texts() const { return texts_; }
    bool abandoned() const { return abandoned_; }

private:
    // One sleep's unwind, frame by frame (classify_into).
    struct Walk {
        const AddressSpace* as = nullptr;
        SleepLabel* label = nullptr;
        unsigned frames_kept = 0;
        bool decided = false;
        bool seeking_function = false;  // --gil-functions: past take_gil, looking for the JIT frame
        bool cut = false;  // the answer's frames ran out undecided: "complete", as the unwinder says at its max
        const AddrRange* py2_lock = nullptr;  // the frame before, py2_frame, was Python 2's PyThread_acquire_lock
        Frame py2_frame;
    };
    FrameAction on_frame(Walk& w, const Frame& f);
    void decide_py2(Walk& w, const Frame& f);
    void decide_by_frame(Walk& w, const Frame& f);
    // --sleep-stacks: the sleep's stack as trace text, kept once per distinct stack.
    void keep_stack_text(const AddressSpace& as, const Sample& s, uint64_t layout, SleepLabel& label);
    void count(UnwindStatus st, bool decided);
    bool maps_python(const AddressSpace& as);
    const std::string& user_frame_json(const AddressSpace& as, uint64_t layout, const Frame& f);
    const std::string& kernel_frame_json(uint64_t ip);
    bool names_jit_frames(const AddressSpace& as);
    const PerfMap& jit_map(const AddressSpace& as);
    // --gil-functions: the function a GIL wait's JIT frame f names, into label.
    [[gnu::noinline]] void name_gil_function(const AddressSpace& as, const Frame& f, SleepLabel& label);
    const std::string* jit_frame_json(const Frame& f);
    const std::string& name_unlocked(std::unique_lock<std::mutex>& l, uint64_t layout, const Frame& f,
                                     std::unordered_map<uint64_t, std::string>& shared,
                                     std::unordered_map<uint64_t, std::string>& local);
    const ProcessMaps* maps_;
    ModuleCache& modules_;
    DwarfUnwinder unwinder_;
    std::unordered_map<uint64_t, std::pair<uint64_t, bool>> python_spaces_;  // space id -> (version, answer)
    StackStats stats_;
    unsigned stack_frames_;
    bool shared_names_;  // names_ came from outside (-j workers): hits go through local_*
    bool never_wait_ = false;
    bool gil_functions_ = false;
    bool abandoned_ = false;  // of the last classify_into
    std::vector<Frame> frames_;  // the user frames of the sleep being classified, named after the unwind
    StackTexts texts_{kStackTextBytes};  // each distinct stack's text, kept once (labels point at it)
    std::vector<uint64_t> key_;  // the stack being classified, as StackTexts keys it
    std::string scratch_;        // its text being built
    std::shared_ptr<NameCache> names_;
    std::shared_future<std::shared_ptr<const KernelSymbols>> ksyms_;  // this thread's copy of names_->ksyms
    std::unordered_map<uint64_t, std::unordered_map<uint64_t, std::string>> local_names_;  // shared cache only
    void maps_for(uint64_t layout);  // sets the three below
    uint64_t maps_layout_ = 0;
    std::unordered_map<uint64_t, std::string>* local_map_ = nullptr;   // local_names_[layout] (shared cache only)
    std::unordered_map<uint64_t, std::string>* shared_map_ = nullptr;  // names_->names[layout]
    std::unordered_map<uint64_t, std::string> local_kernel_;                               // shared cache only
    // Perf maps (JIT code's names): the map of each process met, and the
    // frames named from it, by pid then pc; the sleep being named's map and pid.
    std::unordered_map<int32_t, std::shared_ptr<const PerfMap>> jit_maps_;
    std::unordered_map<int32_t, std::unordered_map<uint64_t, std::string>> jit_names_;
    const PerfMap* jit_map_ = nullptr;
    int32_t jit_pid_ = 0;
};

}  // namespace gilscan

namespace gilscan {

// -j N: the stack classification of sleeps on N worker threads, in the one
// pass over the recording. At a switch-out into S, submit() hands the worker
// a snapshot of the address space and a copy of the registers and stack and
// returns a ticket; the timeline resolves the ticket only when it emits the
// sleep's span, after the wake-up, so unwinding overlaps decoding. Spans come
// out in the same order with the same labels as -j 1. The workers share one
// module cache and one frame-name cache; each has its own Dwfls (libdw is
// not thread-safe).
class ParallelStackClassifier {
public:
    // Batches queued for the workers: when the workers fall behind, the
    // decoding thread unwinds the next batch itself instead of queueing (and
    // copying) ever more stacks. 0: every batch on the decoding thread (tests).
    static constexpr size_t kMaxQueuedBatches = 8;
    ParallelStackClassifier(unsigned jobs, const ModuleOptions& mopt, unsigned stack_frames, const RecordedKernel& kernel,
                            size_t max_queued_batches = kMaxQueuedBatches);
    ~ParallelStackClassifier();

    // Jobs go to the workers in batches and labels come back in batches: a
    // thread wake-up per sleep would cost more than unwinding it.
    int64_t submit(std::shared_ptr<const AddressSpace> space, const Sample& s);
    // Whether the labels' texts are read (SleepLabel::text; default true):
    // false for a summary-only run, whose labels then carry no evidence text.
    void set_text(bool on) { text_ = on; }
    // GilStackClassifier::set_gil_functions for every thread's classifier;
    // before the first submit().
    void set_gil_functions(bool on);
    std::optional<SleepLabel> resolve(int64_t ticket, bool wait);  // nothing yet unless wait
    void finish();                       // stops the workers
    StackStats stats() const;
    // The problems of the binaries the workers met (missing, changed).
    std::vector<std::string> problems() const;
    // Perf maps wanted and missing or damaged (perf_map.h), sorted.
    std::vector<std::string> perf_map_problems() const;

private:
    struct Job;
    struct Worker;
    struct Shared;
    void work(Worker& w);
    void hand_staged();  // the staged jobs to the workers
    void take_back(std::unique_ptr<Job>& job);  // a labelled job: label to ready_, job to spare_
    std::unique_ptr<ModuleCache> modules_;  // shared by the workers
    std::unique_ptr<GilStackClassifier> here_;  // this thread's, for batches the workers have no room for
    std::unique_ptr<Shared> sh_;
    std::vector<std::unique_ptr<Worker>> workers_;
    int64_t next_ticket_ = 0;
    bool text_ = true;
    size_t max_queued_;
    // The decoding thread's side: jobs not yet handed over, labels taken
    // over, and finished jobs to reuse. Jobs are recycled, never freed by a
    // worker: a free into another thread's malloc arena takes that arena's
    // lock, and the two threads then contend on every sleep.
    std::vector<std::unique_ptr<Job>> staged_;
    std::unordered_map<int64_t, SleepLabel> ready_;
    std::vector<std::unique_ptr<Job>> spare_;
    uint64_t seen_posted_ = 0;
};

}  // namespace gilscan
