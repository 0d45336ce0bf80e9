#include "gilscan/gil_stacks.h"

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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

GilStackClassifier::GilStackClassifier(const ProcessMaps& maps, ModuleCache& modules, unsigned stack_frames,
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
    SleepLabel label;
    if (ps.cls != StateClass::Sleeping) return label;
    ++stats_.sleeps_seen;
    if (s.regs_user_abi == 0 || s.stack_user.empty()) {
        ++stats_.no_stack;
        return label;
    }
    const AddressSpace* as = maps_.space(s.pid);
    if (!as || !maps_python(*as)) {
        ++stats_.not_python;
        return label;
    }
    bool decided = false;
    std::string stack;
    auto add_frame = [&stack](const std::string& name) {
        stack += stack.empty() ? "[" : ",";
        append_json_string(stack, name);
    };
    if (stack_frames_) {
        // Kernel frames are kept from CALLCHAIN (PERF_CONTEXT_KERNEL .. PERF_CONTEXT_USER).
        if (!ksyms_) ksyms_ = std::make_unique<KernelSymbols>(kernel_release_);
        bool kernel = false;
        for (size_t i = 0; i < s.callchain.size(); ++i) {
            uint64_t ip = s.callchain[i];
            if (ip >= PERF_CONTEXT_MAX) {
                kernel = ip == PERF_CONTEXT_KERNEL;
                if (ip == PERF_CONTEXT_USER) break;
                continue;
            }
            if (kernel) add_frame(ksyms_->name(ip));
        }
    }
    const unsigned max_frames = stack_frames_ ? stack_frames_ : 64;
    UnwindStatus st = unwinder_.unwind(*as, s, [&](const Frame& f) {
        if (stack_frames_ && f.mapping)  // an unmapped pc is where unwinding ran off the copied stack
            for (const auto& n : describe_frame(f)) add_frame(n);
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
