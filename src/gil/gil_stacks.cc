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

namespace {

// Kernel frames are kept from CALLCHAIN (PERF_CONTEXT_KERNEL .. PERF_CONTEXT_USER).
template <class Each>
void for_kernel_frames(const Sample& s, Each&& each) {
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
}

}  // namespace

// A sleep's answer comes from its first kAnswerFrames frames, however many
// --sleep-stacks keeps for the trace: how much of a stack is shown must not
// change its label (take_gil is frame 2 to 5). The unwind goes on for the
// frames kept, and with --gil-functions past a GIL wait's take_gil frame to
// its first frame in JIT code, the Python function that waits (a -X perf
// trampoline; on a CPython without frame pointers the unwind ends there
// anyway).
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
    frames_.clear();
    const uint64_t layout = stack_frames_ ? layout_of(*as) : 0;
    Walk w;
    w.as = as;
    w.label = &label;
    w.frames_kept = stack_frames_;
    auto on = [this, &w](const Frame& f) { return on_frame(w, f); };
    // By reference: a std::function holding the lambda itself (larger than
    // its inline buffer) would allocate once per sleep.
    UnwindStatus st = unwinder_.unwind(*as, s, std::ref(on), std::max(w.frames_kept, kAnswerFrames + 1));
    if (w.cut) st = UnwindStatus::Complete;
    // The user frames are named after the unwind, and only for a stack not
    // seen before (StackTexts): the text is a function of the layout and
    // the frames' addresses.
    if (stack_frames_) keep_stack_text(*as, s, layout, label);
    if (abandoned_) {
        label.clear();
        stats_ = before;
        return;
    }
    count(st, w.decided);
}

FrameAction GilStackClassifier::on_frame(Walk& w, const Frame& f) {
    // An unmapped pc is where unwinding ran off the copied stack.
    if (f.depth < w.frames_kept && f.mapping) frames_.push_back(f);
    if (w.py2_lock) {
        decide_py2(w, f);
    } else if (w.decided) {
        if (w.seeking_function && (in_jit_code(f) || in_injected_jit(f))) {
            w.seeking_function = false;
            name_gil_function(*w.as, f, *w.label);
        }
    } else if (f.depth < kAnswerFrames) {
        const AddrRange* lock = f.module && f.module->python ? f.module->in_py2_lock(f.vaddr) : nullptr;
        if (lock) {
            w.py2_lock = lock;  // decided by the next frame (kAnswerFrames + 1 at most)
            w.py2_frame = f;
        } else if (f.module && f.module->python) {
            decide_by_frame(w, f);
        } else if (f.depth + 1 == kAnswerFrames) {
            w.cut = true;
        }
    }
    // On for the answer, the frames kept, or the function sought.
    const bool on = (!w.decided && !w.cut) || w.py2_lock || f.depth + 1 < w.frames_kept || w.seeking_function;
    return on ? FrameAction::Continue : FrameAction::Stop;
}

// The frame above Python 2's PyThread_acquire_lock: a GIL taker of the same
// libpython makes the wait a GIL wait; anything else
// (lock_PyThread_acquire_lock: a threading.Lock) a plain sleep.
void GilStackClassifier::decide_py2(Walk& w, const Frame& f) {
    w.decided = true;
    SleepLabel& label = *w.label;
    const Frame& lf = w.py2_frame;
    const AddrRange* c = f.module == lf.module ? f.module->in_py2_gil_caller(f.vaddr) : nullptr;
    if (c) {
        label.name = "S(GIL)";
        if (label.text) {
            frame_evidence(label.evidence_built, w.py2_lock->name, lf.vaddr - w.py2_lock->begin,
                           lf.mapping ? std::string_view(lf.mapping->path) : "?", lf.depth);
            label.evidence_built += " called from ";
            label.evidence_built += c->name;
        }
        label.gil = true;
        ++stats_.gil;
        ++stats_.py2_gil;
    }
    w.py2_lock = nullptr;
}

// The first CPython frame decides: inside take_gil a GIL wait, inside
// drop_gil the hand-off wait, else a plain sleep.
void GilStackClassifier::decide_by_frame(Walk& w, const Frame& f) {
    w.decided = true;
    SleepLabel& label = *w.label;
    const std::string_view file = f.mapping ? std::string_view(f.mapping->path) : std::string_view("?");
    // The evidence text only where it is read (label.text: a trace is
    // written); a summary reads the answer alone.
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
    w.seeking_function = gil_functions_ && label.gil;
}

void GilStackClassifier::count(UnwindStatus st, bool decided) {
    if (decided && st != UnwindStatus::Stopped) st = UnwindStatus::Stopped;  // answered, stack walked on
    switch (st) {
    case UnwindStatus::Stopped: ++stats_.decided; break;
    case UnwindStatus::Complete: ++stats_.complete; break;
    case UnwindStatus::StoppedEarly: ++stats_.stopped_early; break;
    case UnwindStatus::Failed: ++stats_.failed; break;
    }
}

// The stack's key: its layout, how many kernel frames, their addresses,
// then the user frames' pcs. With frames named from a perf map, the pid
// follows (flagged in the count's top bit): the same pcs are other
// functions in another process of the same layout. Frames are cached as
// JSON fragments, escaped once ("a","b" for a pc with an inlined call): a
// stack is then a few appends, not a character loop per frame per sleep.
void GilStackClassifier::keep_stack_text(const AddressSpace& as, const Sample& s, uint64_t layout, SleepLabel& label) {
    key_.clear();
    key_.push_back(layout);
    key_.push_back(0);
    const bool jit = names_jit_frames(as);
    if (jit) key_.push_back(static_cast<uint32_t>(as.pid));
    const size_t before_kernel = key_.size();
    for_kernel_frames(s, [this](uint64_t ip) { key_.push_back(ip); });
    key_[1] = (key_.size() - before_kernel) | (jit ? uint64_t{1} << 63 : 0);
    for (const Frame& f : frames_) key_.push_back(f.pc);
    const uint64_t h = StackTexts::hash(key_);
    if (const std::string* kept = texts_.find(key_, h)) {
        label.stack_shared = kept;  // seen before: nothing to name or build
        return;
    }
    // While /proc/kallsyms is still being read (the first sleeps), the user
    // frames are named first: loading the modules' DWARF for their names
    // then overlaps that read instead of following it. (A deferred read,
    // -j 1, happens at the first kernel frame: nothing to overlap.)
    const bool kernel_last = ksyms_.valid() && ksyms_.wait_for(std::chrono::seconds(0)) == std::future_status::timeout;
    // Never waiting: the user frames are named all the same (the stages
    // will want them), the kernel frames are not waited for.
    if (kernel_last && never_wait_) abandoned_ = true;
    // The reader's classifier (-j 2) names a stack's new frames outermost
    // first: the stages' thread, meeting the same new stacks at the same
    // time, names them innermost first, and the two meet in the middle
    // instead of one waiting for each frame the other has just begun.
    const bool named_last = never_wait_ && shared_names_ && !names_->symbolizer;
    if (named_last)
        for (size_t i = frames_.size(); i-- > 0;) user_frame_json(as, layout, frames_[i]);
    else if (kernel_last)
        for (const Frame& f : frames_) user_frame_json(as, layout, f);
    if (abandoned_) return;
    std::string& stack = scratch_;
    stack.clear();
    auto add_json = [&stack](const std::string& fragment) {
        if (fragment.empty()) return;
        stack += stack.empty() ? '[' : ',';  // a char: no strlen per frame
        stack += fragment;
    };
    for_kernel_frames(s, [&](uint64_t ip) { add_json(kernel_frame_json(ip)); });
    for (const Frame& f : frames_) add_json(user_frame_json(as, layout, f));  // each now cached
    if (!stack.empty()) stack += ']';
    if (const std::string* added = texts_.add(key_, h, stack)) label.stack_shared = added;
    else label.stack_json = stack;  // no room left to keep it: the label's own
}


}  // namespace gilscan
