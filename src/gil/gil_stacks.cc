#include "gilscan/gil/gil_stacks.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/symbols/frame_names.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/perf_map.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/gil/trace_sink.h"

namespace gilscan {

void frame_evidence(std::string& out, std::string_view function, uint64_t offset, std::string_view file,
                    unsigned depth) {
    char hex[16];
    char* h = hex + sizeof hex;
    do {
        *--h = "0123456789abcdef"[offset & 15];
        offset >>= 4;
    } while (offset);
    char dec[10];
    char* d = dec + sizeof dec;
    do {
        *--d = static_cast<char>('0' + depth % 10);
        depth /= 10;
    } while (depth);
    out.assign(function);
    out += "+0x";
    out.append(h, static_cast<size_t>(hex + sizeof hex - h));
    out += " in ";
    out += file;
    out += " (frame ";
    out.append(d, static_cast<size_t>(dec + sizeof dec - d));
    out += ')';
}

GilStackClassifier::NameCache::NameCache(const RecordedKernel& rec, bool kernel_names, bool background)
    : kernel_maps(rec.maps) {
    if (!kernel_names) return;
    // The kernel's table is kept beside the inflated debug files (--cache-dir, --no-cache).
    ksyms = std::async(background ? std::launch::async : std::launch::deferred, [rec, dir = debuginfo_cache_dir()] {
                return std::shared_ptr<const KernelSymbols>(std::make_shared<KernelSymbols>(rec, dir));
            }).share();
}

const KernelLayout& GilStackClassifier::NameCache::kernel_layout() {
    std::call_once(layout_once, [this] {
        if (kernel_maps) layout = kernel_maps->layout();
    });
    return layout;
}

GilStackClassifier::GilStackClassifier(const ProcessMaps* maps, ModuleCache& modules, unsigned stack_frames,
                                       const RecordedKernel& kernel, std::shared_ptr<NameCache> names,
                                       bool background)
    : maps_(maps),
      modules_(modules),
      unwinder_(modules),
      stack_frames_(stack_frames),
      shared_names_(names != nullptr),
      names_(names ? std::move(names) : std::make_shared<NameCache>(kernel, stack_frames > 0, background)),
      ksyms_(names_->ksyms) {}

void GilStackClassifier::limit_stack_texts(size_t bytes) { texts_.set_max_bytes(bytes); }

namespace {
std::string names_json(const std::vector<std::string>& names) {
    std::string j;
    for (const auto& n : names) {
        if (!j.empty()) j += ',';
        append_json_string(j, n);
    }
    return j;
}
}  // namespace

// With a cache of its own (-j 1) the classifier uses the cache's entries
// directly; a shared cache's entries are copied to the classifier's private
// maps, so that a hit takes no lock.
const std::string& GilStackClassifier::kernel_frame_json(uint64_t ip) {
    if (shared_names_) {
        auto it = local_kernel_.find(ip);
        if (it != local_kernel_.end()) return it->second;
    }
    // Waits for the background read of /proc/kallsyms the first time (on this
    // classifier's own copy of the future, outside the lock).
    static const KernelSymbols kNone(RecordedKernel{});  // a cache made without kernel names: addresses only
    if (!shared_names_) {  // a cache of its own is this thread's alone: no lock
        auto it = names_->kernel.find(ip);
        if (it != names_->kernel.end()) return it->second;
    }
    const KernelSymbols& ksyms = ksyms_.valid() ? *ksyms_.get() : kNone;
    std::unique_lock<std::mutex> l(names_->mu, std::defer_lock);
    if (shared_names_) l.lock();
    auto sh = names_->kernel.find(ip);
    if (sh == names_->kernel.end()) sh = names_->kernel.emplace(ip, names_json({ksyms.name(ip, names_->kernel_layout())})).first;
    if (!shared_names_) return sh->second;
    std::string j = sh->second;
    l.unlock();
    return local_kernel_.emplace(ip, std::move(j)).first->second;
}

// The name maps of a layout, looked up when the layout changes rather than
// for every frame (a second hash lookup per frame). Elements of an
// unordered_map keep their address when it rehashes, so the pointers stay
// valid; the shared map's contents are still read under its lock.
void GilStackClassifier::maps_for(uint64_t layout) {
    if (maps_layout_ == layout && shared_map_) return;
    local_map_ = shared_names_ ? &local_names_[layout] : nullptr;
    std::unique_lock<std::mutex> l(names_->mu, std::defer_lock);
    if (shared_names_) l.lock();
    shared_map_ = &names_->names[layout];
    maps_layout_ = layout;
}

namespace {
// A frame in anonymous executable memory, no file's: what perf names from
// the process's perf map (perf_map.h).
bool in_jit_code(const Frame& f) {
    return !f.module && f.mapping && f.mapping->exec && is_jit_mapping(f.mapping->path);
}
// A frame in one of the ELF files `perf inject --jit` wrote for a jitdump's
// code loads (jitted-PID-N.so): the same JIT code, in a recording already
// injected, named by its file's symbol.
bool in_injected_jit(const Frame& f) { return f.module && f.module->elf && is_injected_jit_path(f.module->path); }
}  // namespace

// A frame in a process's JIT code named by its perf map: the process's own
// names, so cached by pc per pid (jit_pid_), not per layout (a forked
// child's trampolines sit where its parent's did, for other functions).
// nullptr when the map does not cover the pc: it is named as any other.
const std::string* GilStackClassifier::jit_frame_json(const Frame& f) {
    if (!jit_map_ || !in_jit_code(f)) return nullptr;
    auto& names = jit_names_[jit_pid_];
    auto it = names.find(f.pc);
    if (it != names.end()) return &it->second;
    const PerfMapSymbol* sym = jit_map_->find(f.pc);
    if (!sym) return nullptr;
    const std::string text = names_json({frame_text(sym->name, f.pc - sym->start, jit_map_->source())});
    return &names.emplace(f.pc, text).first->second;
}

// Whether the sleep's user frames run through JIT code its process's perf
// map names; sets jit_map_ and jit_pid_ for jit_frame_json. Called for
// every sleep stack before its text is looked up, so a process's map is
// read at its first sleep through JIT code whichever thread meets it, kept
// text or not: the same maps are read (and the same problems reported) at
// any -j.
bool GilStackClassifier::names_jit_frames(const AddressSpace& as) {
    jit_map_ = nullptr;
    if (modules_.perf_maps().dir().empty() ||
        std::none_of(frames_.begin(), frames_.end(), [](const Frame& f) { return in_jit_code(f); }))
        return false;
    const PerfMap& m = jit_map(as);
    if (m.size() == 0) return false;
    jit_map_ = &m;
    jit_pid_ = as.pid;
    return true;
}

// The process's perf map, read at the first of its frames in JIT code (an
// empty map when there is none, or no directory).
const PerfMap& GilStackClassifier::jit_map(const AddressSpace& as) {
    auto& m = jit_maps_[as.pid];
    if (!m) m = modules_.perf_maps().of(as);
    return *m;
}

void GilStackClassifier::name_gil_function(const AddressSpace& as, const Frame& f, SleepLabel& label) {
    if (f.module) {
        // An injected jitted-*.so: its function symbol at the pc (the names
        // live as long as the module cache, as the labels need).
        for (const ElfSymbol& s : f.module->elf->symbols())
            if (s.defined && s.type == STT_FUNC && f.vaddr - s.value < s.size) {
                label.function = s.name;
                return;
            }
        return;
    }
    if (const PerfMapSymbol* sym = jit_map(as).find(f.pc)) label.function = sym->name;
}

const std::string& GilStackClassifier::user_frame_json(const AddressSpace& as, uint64_t layout, const Frame& f) {
    if (const std::string* j = jit_frame_json(f)) return *j;
    maps_for(layout);
    std::unordered_map<uint64_t, std::string>* const local = local_map_;
    if (local) {
        auto it = local->find(f.pc);
        if (it != local->end()) return it->second;
    }
    std::unique_lock<std::mutex> l(names_->mu, std::defer_lock);
    if (shared_names_) l.lock();
    auto& shared = *shared_map_;
    auto sh = shared.find(f.pc);
    if (sh == shared.end() && local && !names_->symbolizer) return name_unlocked(l, layout, f, shared, *local);
    if (sh == shared.end()) {
        Frame g = f;
        DwarfUnwinder& namer = names_->symbolizer ? *names_->symbolizer : unwinder_;
        if (names_->symbolizer) g.dwfl = names_->symbolizer->dwfl_for(as);
        sh = shared.emplace(f.pc, names_json(namer.describe(g))).first;
    }
    if (!local) return sh->second;
    std::string j = sh->second;
    l.unlock();
    return local->emplace(f.pc, std::move(j)).first->second;
}

namespace {
const std::string kNoName;  // a frame's text in a label that is being abandoned
}

// A frame missing from the shared cache, named through this classifier's own
// Dwfl with the lock released (`l` holds it on entry and on return): libdw
// is slow to name a frame (a linear search of the symbol table,
// then a walk of the compilation unit's DIEs for the inlined call), and the
// first stacks of a run bring hundreds of new frames. Under the lock, -j 2's
// threads named them one at a time, and the reader waited for the stages.
// The text is the same whichever Dwfl names a frame: a function of its
// module's files and its pc, which is also what -j 1 writes. `shared` is
// names_->names[layout] (an element of that map: it survives rehashing
// while the lock is released).
const std::string& GilStackClassifier::name_unlocked(std::unique_lock<std::mutex>& l, uint64_t layout,
                                                     const Frame& f, std::unordered_map<uint64_t, std::string>& shared,
                                                     std::unordered_map<uint64_t, std::string>& local) {
    const std::pair<uint64_t, uint64_t> key{layout, f.pc};
    while (names_->pending.count(key)) {   // another thread is naming it
        if (never_wait_) {
            abandoned_ = true;
            return kNoName;
        }
        names_->named.wait(l);
    }
    auto sh = shared.find(f.pc);
    if (sh == shared.end()) {
        names_->pending.insert(key);
        l.unlock();
        std::string j;
        try {
            j = names_json(unwinder_.describe(f));
        } catch (...) {
            l.lock();
            names_->pending.erase(key);
            names_->named.notify_all();
            throw;
        }
        l.lock();
        names_->pending.erase(key);
        sh = shared.emplace(f.pc, std::move(j)).first;
        names_->named.notify_all();
    }
    std::string copy = sh->second;
    l.unlock();
    return local.emplace(f.pc, std::move(copy)).first->second;
}

bool GilStackClassifier::maps_python(const AddressSpace& as) {
    auto& cached = python_spaces_[as.id];
    if (cached.first == as.version + 1) return cached.second;
    bool python = false;
    for (const auto& [start, m] : as.maps) {
        if (!m.exec) continue;
        // Cheap name test before opening anything: libpython*, python*.
        std::string base = std::filesystem::path(m.path).filename().string();
        if (base.rfind("libpython", 0) != 0 && base.rfind("python", 0) != 0) continue;
        const Module* mod = modules_.get(m);
        if (mod && mod->python) {
            python = true;
            break;
        }
    }
    cached = {as.version + 1, python};
    return python;
}

void GilStackClassifier::classify(const Sample& s, const EventInfo&, const PrevState& ps, SleepLabel& label) {
    if (ps.cls != StateClass::Sleeping) return;
    classify_into(maps_ ? maps_->space(s.pid) : nullptr, s, label);
}

void GilStackClassifier::classify_into(const AddressSpace* as, const Sample& s, SleepLabel& label) {
    // Cleared, not replaced: a recycled label (a worker's job, a thread's
    // own) keeps its strings' capacity, so a warm classifier allocates
    // nothing per sleep here.
    label.clear();
    abandoned_ = false;
    const StackStats before = stats_;
    ++stats_.sleeps_seen;
    if (s.regs_user_abi == 0 || s.stack_user.empty()) {
        ++stats_.no_stack;
        return;
    }
    if (!as || !maps_python(*as)) {
        ++stats_.not_python;
        return;
    }
    bool decided = false;
    // Frames are cached as JSON fragments, escaped once ("a","b" for a pc
    // with an inlined call): a stack is then a few appends, not a character
    // loop per frame per sleep.
    std::string& stack = scratch_;
    stack.clear();
    auto add_json = [&stack](const std::string& fragment) {
        if (fragment.empty()) return;
        stack += stack.empty() ? '[' : ',';  // a char: no strlen per frame
        stack += fragment;
    };
    // Kernel frames are kept from CALLCHAIN (PERF_CONTEXT_KERNEL .. PERF_CONTEXT_USER).
    auto for_kernel_frames = [&s](auto&& each) {
        bool kernel = false;
        for (size_t i = 0; i < s.callchain.size(); ++i) {
            uint64_t ip = s.callchain[i];
            if (ip >= PERF_CONTEXT_MAX) {
                kernel = ip == PERF_CONTEXT_KERNEL;
                if (ip == PERF_CONTEXT_USER) break;
                continue;
            }
            if (kernel) each(ip);
        }
    };
    frames_.clear();
    // A sleep's answer comes from its first kAnswerFrames frames, however
    // many --sleep-stacks keeps for the trace: how much of a stack is shown
    // must not change its label (with the kept frames as the limit, `-j 1
    // --sleep-stacks 2` labelled no GIL wait at all: take_gil is frame 2 to
    // 5). The unwind goes on for the frames kept, and with --gil-functions
    // past a GIL wait's take_gil frame to its first frame in JIT code, the
    // Python function that waits (a -X perf trampoline; on a CPython without
    // frame pointers the unwind ends there anyway).
    const unsigned frames_kept = stack_frames_;
    bool seeking_function = false;
    bool cut = false;  // the answer's frames ran out undecided: "complete", as the unwinder says at its max
    const AddrRange* py2_lock = nullptr;  // the frame before, py2_frame, was Python 2's PyThread_acquire_lock
    Frame py2_frame;
    // The user frames are named after the unwind, and only for a stack not
    // seen before (StackTexts): the text is a function of the layout and the
    // frames' addresses.
    const uint64_t layout = stack_frames_ ? layout_of(*as) : 0;
    auto on_frame = [&](const Frame& f) {
        // An unmapped pc is where unwinding ran off the copied stack.
        if (f.depth < frames_kept && f.mapping) frames_.push_back(f);
        if (py2_lock) {
            // The frame above Python 2's PyThread_acquire_lock: a GIL taker
            // of the same libpython makes the wait a GIL wait; anything else
            // (lock_PyThread_acquire_lock: a threading.Lock) a plain sleep.
            decided = true;
            const AddrRange* c = f.module == py2_frame.module ? f.module->in_py2_gil_caller(f.vaddr) : nullptr;
            if (c) {
                label.name = "S(GIL)";
                if (label.text) {
                    frame_evidence(label.evidence_built, py2_lock->name, py2_frame.vaddr - py2_lock->begin,
                                   py2_frame.mapping ? std::string_view(py2_frame.mapping->path) : "?",
                                   py2_frame.depth);
                    label.evidence_built += " called from ";
                    label.evidence_built += c->name;
                }
                label.gil = true;
                ++stats_.gil;
                ++stats_.py2_gil;
            }
            py2_lock = nullptr;
        } else if (decided) {
            if (seeking_function && (in_jit_code(f) || in_injected_jit(f))) {
                seeking_function = false;
                name_gil_function(*as, f, label);
            }
        } else if (f.depth < kAnswerFrames) {
            const AddrRange* lock = f.module && f.module->python ? f.module->in_py2_lock(f.vaddr) : nullptr;
            if (lock) {
                py2_lock = lock;  // decided by the next frame (kAnswerFrames + 1 at most)
                py2_frame = f;
            } else if (f.module && f.module->python) {
                decided = true;
                const std::string_view file = f.mapping ? std::string_view(f.mapping->path) : std::string_view("?");
                // The evidence text only where it is read (label.text: a trace is
                // written); a summary reads the answer alone, and building the text
                // was 7% of a summary-only DWARF run's instructions.
                if (const AddrRange* r = f.module->in_take(f.vaddr)) {
                    label.name = "S(GIL)";
                    if (label.text) frame_evidence(label.evidence_built, r->name, f.vaddr - r->begin, file, f.depth);
                    label.gil = true;
                    ++stats_.gil;
                } else if (const AddrRange* d = f.module->in_drop(f.vaddr)) {
                    label.name = "S(GIL handoff)";
                    if (label.text) frame_evidence(label.evidence_built, d->name, f.vaddr - d->begin, file, f.depth);
                    ++stats_.handoff;
                }
                seeking_function = gil_functions_ && label.gil;
            } else if (f.depth + 1 == kAnswerFrames) {
                cut = true;
            }
        }
        // On for the answer, the frames kept, or the function sought.
        const bool on = (!decided && !cut) || py2_lock || f.depth + 1 < frames_kept || seeking_function;
        return on ? FrameAction::Continue : FrameAction::Stop;
    };
    // By reference: a std::function holding the lambda itself (larger than
    // its inline buffer) would allocate once per sleep.
    UnwindStatus st = unwinder_.unwind(*as, s, std::ref(on_frame), std::max(frames_kept, kAnswerFrames + 1));
    if (cut) st = UnwindStatus::Complete;
    if (stack_frames_) {
        // The stack's key: its layout, how many kernel frames, their
        // addresses, then the user frames' pcs.
        // With frames named from a perf map, the pid follows (flagged in the
        // count's top bit): the same pcs are other functions in another
        // process of the same layout.
        key_.clear();
        key_.push_back(layout);
        key_.push_back(0);
        const bool jit = names_jit_frames(*as);
        if (jit) key_.push_back(static_cast<uint32_t>(as->pid));
        const size_t before_kernel = key_.size();
        for_kernel_frames([this](uint64_t ip) { key_.push_back(ip); });
        key_[1] = (key_.size() - before_kernel) | (jit ? uint64_t{1} << 63 : 0);
        for (const Frame& f : frames_) key_.push_back(f.pc);
        const uint64_t h = StackTexts::hash(key_);
        if (const std::string* kept = texts_.find(key_, h)) {
            label.stack_shared = kept;  // seen before: nothing to name or build
        } else {
            // While /proc/kallsyms is still being read (the first sleeps),
            // the user frames are named first: loading the modules' DWARF
            // for their names then overlaps that read instead of following
            // it. (A deferred read, -j 1, happens at the first kernel frame:
            // nothing to overlap.)
            const bool kernel_last =
                ksyms_.valid() && ksyms_.wait_for(std::chrono::seconds(0)) == std::future_status::timeout;
            // Never waiting: the user frames are named all the same (the
            // stages will want them), the kernel frames are not waited for.
            if (kernel_last && never_wait_) abandoned_ = true;
            // The reader's classifier (-j 2) names a stack's new frames
            // outermost first: the stages' thread, meeting the same new
            // stacks at the same time, names them innermost first, and the
            // two meet in the middle instead of one waiting for each frame
            // the other has just begun.
            const bool named_last = never_wait_ && shared_names_ && !names_->symbolizer;
            if (named_last)
                for (size_t i = frames_.size(); i-- > 0;) user_frame_json(*as, layout, frames_[i]);
            else if (kernel_last)
                for (const Frame& f : frames_) user_frame_json(*as, layout, f);
            if (!abandoned_) {
                for_kernel_frames([&](uint64_t ip) { add_json(kernel_frame_json(ip)); });
                for (const Frame& f : frames_) add_json(user_frame_json(*as, layout, f));  // each now cached
                if (!stack.empty()) stack += ']';
                if (const std::string* added = texts_.add(key_, h, stack)) label.stack_shared = added;
                else label.stack_json = stack;  // no room left to keep it: the label's own
            }
        }
    }
    if (abandoned_) {
        label.clear();
        stats_ = before;
        return;
    }
    if (decided && st != UnwindStatus::Stopped) st = UnwindStatus::Stopped;  // answered, stack walked on
    switch (st) {
    case UnwindStatus::Stopped: ++stats_.decided; break;
    case UnwindStatus::Complete: ++stats_.complete; break;
    case UnwindStatus::StoppedEarly: ++stats_.stopped_early; break;
    case UnwindStatus::Failed: ++stats_.failed; break;
    }
}

}  // namespace gilscan

namespace gilscan {

struct ParallelStackClassifier::Job {
    int64_t ticket = 0;
    std::shared_ptr<const AddressSpace> space;
    Sample sample;               // spans point into `bytes`
    ChunkBytes bytes;            // callchain, regs and stack copies (resized without zero fill)
    SleepLabel label;            // the worker's answer
};

struct ParallelStackClassifier::Worker {
    std::unique_ptr<GilStackClassifier> gsc;
    std::thread thread;
};

namespace {
// A hand-over wakes a sleeping worker and a posted batch may wake the
// decoding thread; on a VM a wake-up costs tens of microseconds, so jobs
// travel in batches of 64 (a few hundred microseconds of unwinding).
constexpr size_t kJobBatch = 64;
}

struct ParallelStackClassifier::Shared {
    std::mutex mu;
    std::condition_variable ready, result;
    std::deque<std::vector<std::unique_ptr<Job>>> queue;
    bool done = false;
    std::vector<std::unique_ptr<Job>> finished;  // labelled, not yet taken by resolve()
    std::atomic<uint64_t> posted{0};  // batches of labels posted: resolve() locks only when it moved
};

ParallelStackClassifier::ParallelStackClassifier(unsigned jobs, const ModuleOptions& mopt, unsigned stack_frames,
                                                 const RecordedKernel& kernel, size_t max_queued_batches)
    : modules_(std::make_unique<ModuleCache>(mopt)), sh_(std::make_unique<Shared>()), max_queued_(max_queued_batches) {
    auto names = std::make_shared<GilStackClassifier::NameCache>(kernel, stack_frames > 0);
    if (stack_frames) names->symbolizer = std::make_unique<DwarfUnwinder>(*modules_);
    for (unsigned i = 0; i < std::max(1u, jobs); ++i) {
        auto w = std::make_unique<Worker>();
        w->gsc = std::make_unique<GilStackClassifier>(nullptr, *modules_, stack_frames, kernel, names);
        workers_.push_back(std::move(w));
    }
    here_ = std::make_unique<GilStackClassifier>(nullptr, *modules_, stack_frames, kernel, names);
    // The kept stack texts of all the classifiers together stay within
    // what two classifiers keep at -j 2 (with -j 64 a bound per
    // classifier would be a gigabyte).
    const size_t share = std::max<size_t>(GilStackClassifier::kStackTextBytes * 2 / (workers_.size() + 1), 1u << 20);
    here_->limit_stack_texts(share);
    for (auto& w : workers_) w->gsc->limit_stack_texts(share);
    for (auto& w : workers_) w->thread = std::thread([this, wp = w.get()] { work(*wp); });
}

ParallelStackClassifier::~ParallelStackClassifier() { finish(); }

void ParallelStackClassifier::work(Worker& w) {
    pthread_setname_np(pthread_self(), "gilscan-unwind");
    for (;;) {
        std::vector<std::unique_ptr<Job>> jobs;
        {
            std::unique_lock<std::mutex> l(sh_->mu);
            sh_->ready.wait(l, [&] { return sh_->done || !sh_->queue.empty(); });
            if (sh_->queue.empty()) return;
            jobs = std::move(sh_->queue.front());
            sh_->queue.pop_front();
        }
        for (auto& job : jobs) w.gsc->classify_into(job->space.get(), job->sample, job->label);
        {
            std::lock_guard<std::mutex> l(sh_->mu);
            for (auto& job : jobs) sh_->finished.push_back(std::move(job));
            sh_->posted.fetch_add(1, std::memory_order_release);
        }
        sh_->result.notify_all();
    }
}

void ParallelStackClassifier::hand_staged() {
    if (staged_.empty()) return;
    std::vector<std::unique_ptr<Job>> batch;
    batch.reserve(kJobBatch);
    batch.swap(staged_);
    {
        std::lock_guard<std::mutex> l(sh_->mu);
        if (sh_->queue.size() < max_queued_) {
            sh_->queue.push_back(std::move(batch));
            batch.clear();
        }
    }
    if (batch.empty()) {
        sh_->ready.notify_one();
        return;
    }
    // The workers are behind: this thread unwinds the batch itself rather
    // than wait (or copy ever more stacks). The labels are the same whoever
    // computes them.
    for (auto& job : batch) {
        here_->classify_into(job->space.get(), job->sample, job->label);
        take_back(job);
    }
}

void ParallelStackClassifier::set_gil_functions(bool on) {
    here_->set_gil_functions(on);
    for (auto& w : workers_) w->gsc->set_gil_functions(on);
}

void ParallelStackClassifier::take_back(std::unique_ptr<Job>& job) {
    // A label waits in ready_ until its span is emitted, which can be long
    // after the wake-up; the job (and its stack copy) is reused at once. The
    // label is copied, not moved: its strings stay with the job to be refilled
    // (in the worker's malloc arena: moved, they would be freed on this thread).
    ready_.emplace(job->ticket, job->label);
    job->space.reset();  // the snapshot is released on this thread
    spare_.push_back(std::move(job));
}

int64_t ParallelStackClassifier::submit(std::shared_ptr<const AddressSpace> space, const Sample& s) {
    std::unique_ptr<Job> job;
    if (spare_.empty()) {
        job = std::make_unique<Job>();
    } else {
        job = std::move(spare_.back());
        spare_.pop_back();
    }
    job->ticket = next_ticket_++;
    job->label.text = text_;  // kept by classify_into's clear()
    job->space = std::move(space);
    job->sample = s;
    // The record's chunk is reused once it is delivered: copy what the
    // worker reads (a few KiB, against microseconds of unwinding) into the
    // job's own buffer, which keeps its capacity from one sleep to the next.
    const size_t nc = s.callchain.bytes.size(), nr = s.regs_user.bytes.size(), ns = s.stack_user.size();
    job->bytes.resize(nc + nr + ns);
    uint8_t* p = job->bytes.data();
    if (nc) std::memcpy(p, s.callchain.bytes.data(), nc);
    if (nr) std::memcpy(p + nc, s.regs_user.bytes.data(), nr);
    if (ns) std::memcpy(p + nc + nr, s.stack_user.data(), ns);
    job->sample.callchain = U64Array{Bytes(p, nc), s.callchain.swap};
    job->sample.regs_user = U64Array{Bytes(p + nc, nr), s.regs_user.swap};
    job->sample.stack_user = Bytes(p + nc + nr, ns);
    job->sample.raw = {};
    job->sample.aux = {};
    job->sample.regs_intr = {};
    const int64_t ticket = job->ticket;
    staged_.push_back(std::move(job));
    if (staged_.size() >= kJobBatch) hand_staged();
    return ticket;
}

std::optional<SleepLabel> ParallelStackClassifier::resolve(int64_t ticket, bool wait) {
    auto take = [&]() -> std::optional<SleepLabel> {
        auto it = ready_.find(ticket);
        if (it == ready_.end()) return std::nullopt;
        SleepLabel label = std::move(it->second);
        ready_.erase(it);
        return label;
    };
    if (auto l = take()) return l;
    if (wait) {
        hand_staged();  // the ticket may still be staged here
        // ... and labelled by that call, on this thread, when the workers
        // had no room for the batch: the wait below is for workers' jobs
        // only, and would never end for it.
        if (auto l = take()) return l;
    }
    if (!wait && sh_->posted.load(std::memory_order_acquire) == seen_posted_) return std::nullopt;
    {
        std::unique_lock<std::mutex> l(sh_->mu);
        if (wait) sh_->result.wait(l, [&] {
            for (const auto& job : sh_->finished)
                if (job->ticket == ticket) return true;
            return false;
        });
        for (auto& job : sh_->finished) take_back(job);
        sh_->finished.clear();
        seen_posted_ = sh_->posted.load(std::memory_order_relaxed);
    }
    return take();
}

void ParallelStackClassifier::finish() {
    hand_staged();
    {
        std::lock_guard<std::mutex> l(sh_->mu);
        sh_->done = true;
    }
    sh_->ready.notify_all();
    for (auto& w : workers_)
        if (w->thread.joinable()) w->thread.join();
}

StackStats ParallelStackClassifier::stats() const {
    StackStats t;
    std::vector<const GilStackClassifier*> all{here_.get()};
    for (const auto& w : workers_) all.push_back(w->gsc.get());
    for (const GilStackClassifier* c : all) t += c->stats();
    return t;
}

std::vector<std::string> ParallelStackClassifier::problems() const {
    std::vector<std::string> out = modules_->problems();
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::string> ParallelStackClassifier::perf_map_problems() const { return modules_->perf_maps().problems(); }

}  // namespace gilscan
