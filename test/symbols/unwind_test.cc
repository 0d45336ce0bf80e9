// The fast unwinder (cached CFI rules, src/symbols/cfi_rules.cc) against libdw
// alone: on every sample with a user stack in the real recordings of
// testdata/, both give the same frames (pc, module, link-time address) and
// the same status, to 64 frames. The fast path must also be what does the
// work: frames outside every module (the kernel's uretprobe trampoline,
// which a take_gil return uprobe puts in place of take_gil's return address,
// -X perf trampolines in anonymous memory) it steps by the frame pointer as libdw
// does; what its rules cannot describe (DWARF expressions, signal frames)
// goes to libdw.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_util.h"
#include "gilscan/symbols/cfi_rules.h"
#include "gilscan/symbols/unwind.h"
#include "gilscan/perfdata/kernel_records.h"
#include "gilscan/symbols/process_maps.h"

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
    uint64_t fast_frames = 0, libdw_frames = 0, fp_frames = 0;
    for (std::string name : {"stacks_py39", "stacks_py311", "stacks_py312", "stacks_py312_xperf",
                             "stacks_py312_perfmap", "stacks_py313", "stacks_shim", "stacks_pipe", "stacks_zstd",
                             "stacks_debian", "mixed_callgraph"}) {
        CAPTURE(name);
        Session session((dir / (name + ".data")).string());
        ProcessMaps maps;
        ModuleCache modules(ModuleOptions{});
        Compare cmp(maps, modules);
        FanOutOf<ProcessMaps, Compare> stages(maps, cmp);
        session.run(stages);
        MESSAGE(name << ": " << cmp.stacks << " stacks, " << cmp.frames << " frames; fast path "
                     << cmp.fast.fast_frames() << " frames (" << cmp.fast.fp_frames() << " by the frame pointer), libdw "
                     << cmp.fast.libdw_frames() << " frames in " << cmp.fast.fallbacks() << " walks");
        CHECK(cmp.stacks > 0);
        CHECK(cmp.differ == 0);
        fast_frames += cmp.fast.fast_frames();
        libdw_frames += cmp.fast.libdw_frames();
        fp_frames += cmp.fast.fp_frames();
    }
    // The rules describe nearly every frame of CPython and glibc code, and
    // the frame-pointer step the frames outside any module (most of these
    // stacks end in the uretprobe trampoline after take_gil); libdw takes
    // only the rest.
    CHECK(fast_frames > 5 * libdw_frames);
    // ... and the frame-pointer step was compared with libdw's many times.
    CHECK(fp_frames > 500);
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

namespace {

// A thread stopped in code outside any module, its stack a frame-pointer
// chain through more such code and through libpython's take_gil (whose CFI
// restores rbp from the stack): the fast unwinder's frame-pointer step
// against libdw's (elfutils' x86_64_unwind), on stacks built for it.
struct FpStack {
    static constexpr uint64_t kBase = 0x7f1200000000ull;  // libpython's load bias
    static constexpr uint64_t kS = 0x7ffd00001000ull;     // the sampled stack pointer
    static constexpr uint64_t kTakeGilCall = 0x24f86e;    // take_gil+0xbe: CFA = rsp + 112 there
    std::vector<uint64_t> words = std::vector<uint64_t>(0x400 / 8, 0x00000000deadbee0ull);
    uint64_t rbp = 0, rsp = kS, ip = 0x1000;
    void at(uint64_t addr, uint64_t v) { words.at((addr - kS) / 8) = v; }
};

std::vector<std::tuple<uint64_t, const Module*, uint64_t, unsigned>> unwind_fp(DwarfUnwinder& u, const AddressSpace& as,
                                                                                const FpStack& st, UnwindStatus& status) {
    std::vector<uint8_t> regs(24), stack(st.words.size() * 8);
    const uint64_t r[3] = {st.rbp, st.rsp, st.ip};  // perf's order by register number: BP (6), SP (7), IP (8)
    std::memcpy(regs.data(), r, sizeof r);
    std::memcpy(stack.data(), st.words.data(), stack.size());
    Sample s;
    s.pid = s.tid = 100;
    s.regs_user_abi = 2;  // PERF_SAMPLE_REGS_ABI_64
    s.regs_user_mask = 1u << 6 | 1u << 7 | 1u << 8;
    s.regs_user = U64Array{Bytes(regs.data(), regs.size()), false};
    s.stack_user = Bytes(stack.data(), stack.size());
    std::vector<std::tuple<uint64_t, const Module*, uint64_t, unsigned>> out;
    status = u.unwind(as, s, [&](const Frame& f) {
        out.emplace_back(f.pc, f.module, f.vaddr, f.depth);
        return FrameAction::Continue;
    }, 64);
    return out;
}

}  // namespace

TEST_CASE("outside any module, the fast unwinder steps by the frame pointer as libdw does") {
    const std::string lib = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
    REQUIRE(fs::exists(lib));
    ProcessMaps maps;
    MmapEvent m;
    m.pid = m.tid = 100;
    m.start = FpStack::kBase + 0xf5000;  // its text segment (file offset = address there)
    m.len = 0x23c000;
    m.pgoff = 0xf5000;
    m.filename = lib;
    maps.on_mmap(m);
    const AddressSpace* as = maps.space(100);
    REQUIRE(as != nullptr);
    ModuleCache modules(ModuleOptions{});
    constexpr uint64_t S = FpStack::kS;

    // The whole chain: 0x1000 -> 0x2000 (frame pointer), -> take_gil+0xbe
    // (frame pointer), -> 0x3000 (take_gil's CFI, rbp restored from its
    // frame), -> 0x4000 -> 0x5000 (frame pointer, the last with rbp 0: the
    // walk ends there in an error, as libdw's does).
    FpStack chain;
    chain.rbp = S + 0x10;
    chain.at(S + 0x10, S + 0x40);
    chain.at(S + 0x18, 0x2001);
    chain.at(S + 0x40, S + 0x200);
    chain.at(S + 0x48, FpStack::kBase + FpStack::kTakeGilCall + 1);
    // take_gil's frame: rsp = S + 0x50, CFA = S + 0xc0; rbp saved at CFA - 48, the return address at CFA - 8.
    chain.at(S + 0x90, S + 0x100);
    chain.at(S + 0xb8, 0x3001);
    chain.at(S + 0x100, S + 0x140);
    chain.at(S + 0x108, 0x4001);
    chain.at(S + 0x140, 0);
    chain.at(S + 0x148, 0x5001);

    // rbp below rsp, into libpython's mapped file (so both words there can
    // be read): the stack pointer would not move up.
    FpStack below = chain;
    below.rbp = FpStack::kBase + 0x100000;
    FpStack no_return = chain;  // the return address lies past the stack copy
    no_return.rbp = S + 0x3f8;
    FpStack no_saved_fp = chain;  // [rbp] unreadable, [rbp + 8] readable: rbp 0 in the caller
    no_saved_fp.rbp = S - 8;

    for (const auto& [name, st, want_frames] : {std::tuple<const char*, FpStack, size_t>{"the whole chain", chain, 6},
                                                {"rbp below rsp", below, 1},
                                                {"the return address past the copy", no_return, 1},
                                                {"the saved rbp unreadable", no_saved_fp, 2}}) {
        const char* const what = name;  // clang 14 cannot capture a structured binding in CAPTURE's lambda
        CAPTURE(what);
        DwarfUnwinder fast(modules), slow(modules);
        slow.set_fast(false);
        UnwindStatus sf{}, ss{};
        const auto a = unwind_fp(fast, *as, st, sf);
        const auto b = unwind_fp(slow, *as, st, ss);
        CHECK(a == b);
        CHECK(static_cast<int>(sf) == static_cast<int>(ss));
        CHECK(a.size() == want_frames);
        CHECK(fast.fallbacks() == 0);  // the fast unwinder did it all
        CHECK(fast.fp_frames() > 0);
    }
}
