#include "gilscan/gil_stacks.h"

#include <atomic>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <unordered_map>
#include <mutex>
#include <thread>

#include <sys/utsname.h>

#include "gilscan/perf_abi.h"
#include "gilscan/trace_writer.h"

namespace gilscan {

KernelSymbols::KernelSymbols(const std::string& recorded_release) {
    struct utsname u {};
    if (recorded_release.empty() || ::uname(&u) != 0 || recorded_release != u.release) return;
    std::ifstream f("/proc/kallsyms");
    std::string line;
    while (std::getline(f, line)) {
        // "ffffffff81000000 T _stext" (optionally "\t[module]")
        size_t a = line.find(' ');
        if (a == std::string::npos || a + 3 > line.size()) continue;
        char type = line[a + 1];
        if (type != 't' && type != 'T' && type != 'w' && type != 'W') continue;
        uint64_t addr = std::strtoull(line.c_str(), nullptr, 16);
        if (addr == 0) continue;  // kptr_restrict hides them
        std::string name = line.substr(a + 3);
        size_t tab = name.find('\t');
        if (tab != std::string::npos) name.resize(tab);
        syms_.emplace_back(addr, std::move(name));
    }
    std::sort(syms_.begin(), syms_.end());
}

std::string KernelSymbols::name(uint64_t addr) const {
    char buf[64];
    auto it = std::upper_bound(syms_.begin(), syms_.end(), std::make_pair(addr, std::string("\xff")));
    if (it == syms_.begin() || syms_.empty()) {
        std::snprintf(buf, sizeof buf, "0x%llx ([kernel])", static_cast<unsigned long long>(addr));
        return buf;
    }
    --it;
    std::snprintf(buf, sizeof buf, "+0x%llx ([kernel])", static_cast<unsigned long long>(addr - it->first));
    return it->second + buf;
}

GilStackClassifier::GilStackClassifier(const ProcessMaps* maps, ModuleCache& modules, unsigned stack_frames,
                                       std::string kernel_release)
    : maps_(maps),
      modules_(modules),
      unwinder_(modules),
      stack_frames_(stack_frames),
      kernel_release_(std::move(kernel_release)) {}

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

SleepLabel GilStackClassifier::classify(const Sample& s, const EventInfo&, const PrevState& ps) {
    if (ps.cls != StateClass::Sleeping) return {};
    return classify_in(maps_ ? maps_->space(s.pid) : nullptr, s);
}

SleepLabel GilStackClassifier::classify_in(const AddressSpace* as, const Sample& s) {
    SleepLabel label;
    ++stats_.sleeps_seen;
    if (s.regs_user_abi == 0 || s.stack_user.empty()) {
        ++stats_.no_stack;
        return label;
    }
    if (!as || !maps_python(*as)) {
        ++stats_.not_python;
        return label;
    }
    bool decided = false;
    std::string stack;
    // Frames are cached as JSON fragments, escaped once ("a","b" for a pc
    // with an inlined call): a stack is then a few appends, not a character
    // loop per frame per sleep.
    auto add_json = [&stack](const std::string& fragment) {
        if (fragment.empty()) return;
        stack += stack.empty() ? "[" : ",";
        stack += fragment;
    };
    auto to_json = [](const std::vector<std::string>& names) {
        std::string j;
        for (const auto& n : names) {
            if (!j.empty()) j += ',';
            append_json_string(j, n);
        }
        return j;
    };
    if (stack_frames_) {
        // Kernel frames are kept from CALLCHAIN (PERF_CONTEXT_KERNEL .. PERF_CONTEXT_USER).
        std::call_once(names_->ksyms_once, [&] { names_->ksyms = std::make_unique<KernelSymbols>(kernel_release_); });
        const KernelSymbols& ksyms = *names_->ksyms;
        bool kernel = false;
        for (size_t i = 0; i < s.callchain.size(); ++i) {
            uint64_t ip = s.callchain[i];
            if (ip >= PERF_CONTEXT_MAX) {
                kernel = ip == PERF_CONTEXT_KERNEL;
                if (ip == PERF_CONTEXT_USER) break;
                continue;
            }
            if (!kernel) continue;
            {
                std::shared_lock<std::shared_mutex> l(names_->mu);
                auto it = names_->kernel.find(ip);
                if (it != names_->kernel.end()) {
                    add_json(it->second);
                    continue;
                }
            }
            std::string j = to_json({ksyms.name(ip)});
            add_json(j);
            std::unique_lock<std::shared_mutex> l(names_->mu);
            names_->kernel.emplace(ip, std::move(j));
        }
    }
    const unsigned max_frames = stack_frames_ ? stack_frames_ : 64;
    const uint64_t layout = stack_frames_ ? layout_of(*as) : 0;
    UnwindStatus st = unwinder_.unwind(*as, s, [&](const Frame& f) {
        if (stack_frames_ && f.mapping) {  // an unmapped pc is where unwinding ran off the copied stack
            bool found = false;
            {
                std::shared_lock<std::shared_mutex> l(names_->mu);
                auto sp = names_->names.find(layout);
                if (sp != names_->names.end()) {
                    auto it = sp->second.find(f.pc);
                    if (it != sp->second.end()) {
                        add_json(it->second);
                        found = true;
                    }
                }
            }
            if (!found) {
                std::string j = to_json(describe_frame(f));
                add_json(j);
                std::unique_lock<std::shared_mutex> l(names_->mu);
                names_->names[layout].emplace(f.pc, std::move(j));
            }
        }
        if (decided || !f.module || !f.module->python) return FrameAction::Continue;
        decided = true;
        char where[256];
        const char* file = f.mapping ? f.mapping->path.c_str() : "?";
        if (const AddrRange* r = f.module->in_take(f.vaddr)) {
            std::snprintf(where, sizeof where, "%s+0x%llx in %s (frame %u)", r->name.c_str(),
                          static_cast<unsigned long long>(f.vaddr - r->begin), file, f.depth);
            label = {"S(GIL)", where, true, {}};
            ++stats_.gil;
        } else if (const AddrRange* d = f.module->in_drop(f.vaddr)) {
            std::snprintf(where, sizeof where, "%s+0x%llx in %s (frame %u)", d->name.c_str(),
                          static_cast<unsigned long long>(f.vaddr - d->begin), file, f.depth);
            label = {"S(GIL handoff)", where, false, {}};
            ++stats_.handoff;
        }
        return stack_frames_ ? FrameAction::Continue : FrameAction::Stop;  // with stacks: the whole stack
    }, max_frames);
    if (!stack.empty()) label.stack_json = stack + "]";
    if (decided && st != UnwindStatus::Stopped) st = UnwindStatus::Stopped;  // answered, stack walked on
    switch (st) {
    case UnwindStatus::Stopped: ++stats_.decided; break;
    case UnwindStatus::Complete: ++stats_.complete; break;
    case UnwindStatus::StoppedEarly: ++stats_.stopped_early; break;
    case UnwindStatus::Failed: ++stats_.failed; break;
    }
    return label;
}

}  // namespace gilscan

namespace gilscan {

struct ParallelStackClassifier::Job {
    int64_t ticket = 0;
    std::shared_ptr<const AddressSpace> space;
    Sample sample;               // spans point into `bytes`
    std::vector<uint8_t> bytes;  // callchain, regs and stack copies
};

struct ParallelStackClassifier::Worker {
    std::unique_ptr<ModuleCache> modules;
    std::unique_ptr<GilStackClassifier> gsc;
    std::thread thread;
};

namespace {
constexpr size_t kJobBatch = 32;
}

struct ParallelStackClassifier::Shared {
    std::mutex mu;
    std::condition_variable ready, result;
    std::deque<std::vector<std::unique_ptr<Job>>> queue;
    bool done = false;
    std::vector<std::pair<int64_t, SleepLabel>> labels;  // finished, not yet taken by resolve()
    std::atomic<uint64_t> posted{0};  // batches of labels posted: resolve() locks only when it moved
};

ParallelStackClassifier::ParallelStackClassifier(unsigned jobs, const ModuleOptions& mopt, unsigned stack_frames,
                                                 std::string kernel_release)
    : sh_(std::make_unique<Shared>()) {
    auto names = std::make_shared<GilStackClassifier::NameCache>();
    for (unsigned i = 0; i < std::max(1u, jobs); ++i) {
        auto w = std::make_unique<Worker>();
        w->modules = std::make_unique<ModuleCache>(mopt);
        w->gsc = std::make_unique<GilStackClassifier>(nullptr, *w->modules, stack_frames, kernel_release);
        w->gsc->share_names(names);
        workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) w->thread = std::thread([this, wp = w.get()] { work(*wp); });
}

ParallelStackClassifier::~ParallelStackClassifier() { finish(); }

void ParallelStackClassifier::work(Worker& w) {
    std::vector<std::pair<int64_t, SleepLabel>> out;
    for (;;) {
        std::vector<std::unique_ptr<Job>> jobs;
        {
            std::unique_lock<std::mutex> l(sh_->mu);
            sh_->ready.wait(l, [&] { return sh_->done || !sh_->queue.empty(); });
            if (sh_->queue.empty()) return;
            jobs = std::move(sh_->queue.front());
            sh_->queue.pop_front();
        }
        for (auto& job : jobs) out.emplace_back(job->ticket, w.gsc->classify_in(job->space.get(), job->sample));
        {
            std::lock_guard<std::mutex> l(sh_->mu);
            for (auto& o : out) sh_->labels.push_back(std::move(o));
            sh_->posted.fetch_add(1, std::memory_order_release);
        }
        out.clear();
        sh_->result.notify_all();
    }
}

void ParallelStackClassifier::hand_staged() {
    if (staged_.empty()) return;
    {
        std::lock_guard<std::mutex> l(sh_->mu);
        sh_->queue.push_back(std::move(staged_));
    }
    staged_.clear();
    sh_->ready.notify_one();
}

int64_t ParallelStackClassifier::submit(std::shared_ptr<const AddressSpace> space, const Sample& s) {
    auto job = std::make_unique<Job>();
    job->ticket = next_ticket_++;
    job->space = std::move(space);
    job->sample = s;
    // The record's chunk is reused once it is delivered: copy what the
    // worker reads (a few KiB, against tens of microseconds of unwinding).
    job->bytes.reserve(s.callchain.bytes.size() + s.regs_user.bytes.size() + s.stack_user.size());
    job->bytes.insert(job->bytes.end(), s.callchain.bytes.begin(), s.callchain.bytes.end());
    job->bytes.insert(job->bytes.end(), s.regs_user.bytes.begin(), s.regs_user.bytes.end());
    job->bytes.insert(job->bytes.end(), s.stack_user.begin(), s.stack_user.end());
    const uint8_t* p = job->bytes.data();
    job->sample.callchain = U64Array{Bytes(p, s.callchain.bytes.size()), s.callchain.swap};
    p += s.callchain.bytes.size();
    job->sample.regs_user = U64Array{Bytes(p, s.regs_user.bytes.size()), s.regs_user.swap};
    p += s.regs_user.bytes.size();
    job->sample.stack_user = Bytes(p, s.stack_user.size());
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
    if (wait) hand_staged();  // the ticket may still be staged here
    if (!wait && sh_->posted.load(std::memory_order_acquire) == seen_posted_) return std::nullopt;
    {
        std::unique_lock<std::mutex> l(sh_->mu);
        if (wait) sh_->result.wait(l, [&] {
            for (const auto& [t, label] : sh_->labels)
                if (t == ticket) return true;
            return false;
        });
        for (auto& [t, label] : sh_->labels) ready_.emplace(t, std::move(label));
        sh_->labels.clear();
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
    for (const auto& w : workers_) {
        const StackStats& s = w->gsc->stats();
        t.sleeps_seen += s.sleeps_seen;
        t.not_python += s.not_python;
        t.no_stack += s.no_stack;
        t.decided += s.decided;
        t.complete += s.complete;
        t.stopped_early += s.stopped_early;
        t.failed += s.failed;
        t.gil += s.gil;
        t.handoff += s.handoff;
    }
    return t;
}

std::vector<std::string> ParallelStackClassifier::problems() const {
    std::vector<std::string> out;
    for (const auto& w : workers_)
        for (const auto& p : w->modules->problems())
            if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace gilscan
