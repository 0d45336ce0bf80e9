// The fast unwinder (cached CFI rules, src/cfi_rules.cc) against libdw
// alone: on every sample with a user stack in the real recordings of
// testdata/, both give the same frames (pc, module, link-time address) and
// the same status, to 64 frames. The fast path must also be what does the
// work, and hand the stacks it cannot describe (-X perf trampolines without
// CFI) to libdw.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"
#include "gilscan/cfi_rules.h"
#include "gilscan/unwind.h"

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

struct Compare final : EventSink {
    explicit Compare(ProcessMaps& m, ModuleCache& mods) : maps(m), fast(mods), slow(mods) { slow.set_fast(false); }
    ProcessMaps& maps;
    DwarfUnwinder fast, slow;
    uint64_t stacks = 0, frames = 0, differ = 0;

    using Frames = std::vector<std::tuple<uint64_t, const Module*, uint64_t, unsigned>>;
    static UnwindStatus walk(DwarfUnwinder& u, const AddressSpace& as, const Sample& s, Frames& out, unsigned stop_at) {
        return u.unwind(as, s, [&](const Frame& f) {
            out.emplace_back(f.pc, f.module, f.vaddr, f.depth);
            return out.size() == stop_at ? FrameAction::Stop : FrameAction::Continue;
        }, 64);
    }
    void on_sample(const Sample& s, const EventInfo&) override {
        if (s.regs_user_abi == 0 || s.stack_user.empty()) return;
        const AddressSpace* as = maps.space(s.pid);
        if (!as) return;
        ++stacks;
        // Whole stacks, and stacks cut short by the callback.
        for (unsigned stop_at : {0u, 3u}) {
            Frames a, b;
            const UnwindStatus sa = walk(fast, *as, s, a, stop_at);
            const UnwindStatus sb = walk(slow, *as, s, b, stop_at);
            frames += a.size();
            if (a != b || sa != sb) ++differ;
        }
    }
};

}  // namespace

TEST_CASE("fast CFI-rule unwinding gives libdw's frames on every real recording") {
    const fs::path dir = GILSCAN_TESTDATA;
    uint64_t fast_frames = 0, libdw_frames = 0;
    for (std::string name : {"stacks_py39", "stacks_py311", "stacks_py312", "stacks_py312_xperf", "stacks_py313",
                             "stacks_shim", "stacks_pipe", "stacks_zstd", "stacks_debian", "mixed_callgraph"}) {
        CAPTURE(name);
        Session session((dir / (name + ".data")).string());
        ProcessMaps maps;
        ModuleCache modules(ModuleOptions{});
        Compare cmp(maps, modules);
        FanOutOf<ProcessMaps, Compare> stages(maps, cmp);
        session.run(stages);
        MESSAGE(name << ": " << cmp.stacks << " stacks, " << cmp.frames << " frames; fast path "
                     << cmp.fast.fast_frames() << " frames, libdw " << cmp.fast.libdw_frames() << " frames in "
                     << cmp.fast.fallbacks() << " walks");
        CHECK(cmp.stacks > 0);
        CHECK(cmp.differ == 0);
        fast_frames += cmp.fast.fast_frames();
        libdw_frames += cmp.fast.libdw_frames();
    }
    // The rules describe nearly every frame of CPython and glibc code; libdw
    // finishes the stacks that end in code without CFI (-X perf trampolines,
    // a garbage return address past the thread's first frame).
    CHECK(fast_frames > 5 * libdw_frames);
}

TEST_CASE("CFI rules: nothing to describe without a Dwfl or a module") {
    CHECK(read_cfi_rule(nullptr, 0x401000).kind == CfiRule::Other);
    CfiRuleCache cache;
    CHECK(cache.at(nullptr, 0x1234).kind == CfiRule::Other);
    CHECK(cache.size() == 1);
    cache.clear();
    CHECK(cache.size() == 0);
}

TEST_CASE("CFI rules: the cache is bounded") {
    CfiRuleCache cache;
    for (uint64_t pc = 0; pc < (1u << 18) + 10; ++pc) cache.at(nullptr, 0x1000 + pc);
    CHECK(cache.size() <= (1u << 18));
    CHECK(cache.size() > 0);
}
