#include "gilscan/gil_stacks.h"

#include <cstdio>
#include <filesystem>

namespace gilscan {

GilStackClassifier::GilStackClassifier(const ProcessMaps& maps, ModuleCache& modules)
    : maps_(maps), modules_(modules), unwinder_(modules) {}

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
    UnwindStatus st = unwinder_.unwind(*as, s, [&](const Frame& f) {
        if (!f.module || !f.module->python) return FrameAction::Continue;
        decided = true;
        char where[256];
        const char* file = f.mapping ? f.mapping->path.c_str() : "?";
        if (const AddrRange* r = f.module->in_take(f.vaddr)) {
            std::snprintf(where, sizeof where, "%s+0x%llx in %s (frame %u)", r->name.c_str(),
                          static_cast<unsigned long long>(f.vaddr - r->begin), file, f.depth);
            label = {"S(GIL)", where, true};
            ++stats_.gil;
        } else if (const AddrRange* d = f.module->in_drop(f.vaddr)) {
            std::snprintf(where, sizeof where, "%s+0x%llx in %s (frame %u)", d->name.c_str(),
                          static_cast<unsigned long long>(f.vaddr - d->begin), file, f.depth);
            label = {"S(GIL handoff)", where, false};
            ++stats_.handoff;
        }
        return FrameAction::Stop;
    });
    switch (st) {
    case UnwindStatus::Stopped: ++stats_.decided; break;
    case UnwindStatus::Complete: ++stats_.complete; break;
    case UnwindStatus::StoppedEarly: ++stats_.stopped_early; break;
    case UnwindStatus::Failed: ++stats_.failed; break;
    }
    (void)decided;
    return label;
}

}  // namespace gilscan
