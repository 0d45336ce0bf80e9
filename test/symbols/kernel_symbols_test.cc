// Kernel frame names: which recordings get this machine's symbols, and how a
// recorded address moves to this boot's (KASLR, module bases).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <future>
#include <sstream>

#include <sys/utsname.h>

#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

MmapEvent kernel_map(int32_t pid, uint64_t start, uint64_t len, uint64_t pgoff, std::string_view name) {
    MmapEvent e;
    e.pid = pid;
    e.start = start;
    e.len = len;
    e.pgoff = pgoff;
    e.filename = name;
    return e;
}

// A note as /sys/kernel/notes holds it (host order, name and descriptor padded to 4).
void put_note(std::string& out, uint32_t type, std::string_view name, std::string_view desc) {
    auto u32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
    u32(static_cast<uint32_t>(name.size()));
    u32(static_cast<uint32_t>(desc.size()));
    u32(type);
    out.append(name);
    out.append((4 - name.size() % 4) % 4, '\0');
    out.append(desc);
    out.append((4 - desc.size() % 4) % 4, '\0');
}

// This boot's kernel, as a test lays it out: the image at 0xffffffff9a000000,
// nf_tables loaded at 0xffffffffc0100000.
const char* const kKallsyms =
    "ffffffff9a000000 T _text\n"
    "ffffffff9a000000 T _stext\n"
    "ffffffff9a001000 T schedule\n"
    "ffffffff9a001100 t __schedule\n"
    "ffffffff9a002000 D some_data\n"
    "ffffffffc0100000 t nft_do_chain\t[nf_tables]\n"
    "ffffffffc0100400 t nft_lookup_eval\t[nf_tables]\n"
    "ffffffffc0300010 t foo_hook\t[xt_foo]\n";
const char* const kModules =
    "nf_tables 352256 583 nft_chain_nat, Live 0xffffffffc0100000\n"
    "hidden 4096 0 - Live 0x0000000000000000\n"
    "xt_foo 4096 0 - Live 0xffffffffc0300000 (OE)\n";  // out-of-tree, unsigned: flags after the base

// The recording's: the image 0x19000000 lower (another boot), nf_tables
// elsewhere, xfs loaded then but not now.
KernelLayout recorded_elsewhere() {
    KernelMapsLog log;
    log.add(kernel_map(-1, 0xffffffff81000000, 0x1276f48, 0xffffffff81000000, "[kernel.kallsyms]_text"));
    log.add(kernel_map(-1, 0xffffffffc0500000, 0x56000, 0, "/lib/modules/6.1.0-13-amd64/kernel/net/netfilter/nf_tables.ko.xz"));
    log.add(kernel_map(-1, 0xffffffffc0800000, 0x10000, 0, "[xfs]"));
    return log.layout();
}

}  // namespace

TEST_CASE("kernel symbols from /proc/kallsyms: the nearest text symbol below, greatest name on a tie") {
    struct utsname u {};
    REQUIRE(::uname(&u) == 0);
    CHECK(KernelSymbols("0.0.0-not-this-kernel").name(0xffffffff81000000ull) == "0xffffffff81000000 ([kernel])");
    // A reference parse of the same file, line by line.
    std::ifstream f("/proc/kallsyms");
    // address -> the greatest name there and where it is ("[kernel]", or its "[module]")
    std::map<uint64_t, std::pair<std::string, std::string>> ref;
    std::string line;
    size_t in_modules = 0;
    uint64_t text_end = 0;  // past it, the image's symbols name nothing
    while (std::getline(f, line)) {
        std::istringstream ls(line);
        std::string addr, type, name, module;
        if (!(ls >> addr >> type >> name) || type.size() != 1 || std::string("tTwW").find(type[0]) == std::string::npos)
            continue;
        if (!(ls >> module)) module = "[kernel]";
        uint64_t a = std::stoull(addr, nullptr, 16);
        if (a == 0) continue;
        if (name == "_etext" || name == "_einittext") text_end = std::max(text_end, a);
        // BPF programs, ftrace and kprobe trampolines: not named (they come and go)
        if (module == "[bpf]" || module.rfind("[__builtin__", 0) == 0) continue;
        auto& n = ref[a];
        if (name > n.first) n = {name, module};
    }
    for (const auto& [a, n] : ref) in_modules += n.second != "[kernel]";
    KernelSymbols ks(u.release);
    if (ref.empty()) {  // kptr_restrict hides the addresses (not root): nothing to name
        CHECK(ks.name(0x1234) == "0x1234 ([kernel])");
        return;
    }
    size_t i = 0, checked = 0;
    size_t modules_checked = 0;
    for (const auto& [addr, named] : ref) {
        const auto& [name, where] = named;
        // a spread of them, and every module's symbol
        if (i++ % 97 != 0 && where == "[kernel]" && (text_end == 0 || addr < text_end - 64)) continue;
        char hex[32];
        std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(addr));
        if (where == "[kernel]" && text_end && addr >= text_end) {
            CHECK(ks.name(addr) == std::string(hex) + " ([kernel])");
            continue;
        }
        CHECK(ks.name(addr) == name + "+0x0 (" + where + ")");
        // addr + 3 may already be past the next symbol: some are 2-3 bytes
        // long (__x86_indirect_*_thunk_*, .cold stubs), so ask the reference.
        const auto& [below, below_named] = *std::prev(ref.upper_bound(addr + 3));
        char off[32];
        std::snprintf(off, sizeof off, "+0x%llx", static_cast<unsigned long long>(addr + 3 - below));
        if (below_named.second == "[kernel]" && text_end && addr + 3 >= text_end) {
            std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(addr + 3));
            CHECK(ks.name(addr + 3) == std::string(hex) + " ([kernel])");
        } else {
            CHECK(ks.name(addr + 3) == below_named.first + off + " (" + below_named.second + ")");
        }
        ++checked;
        modules_checked += where != "[kernel]";
    }
    CHECK(checked > 10);
    CHECK(modules_checked == in_modules);
    CHECK(ks.name(ref.begin()->first - 1).find("([kernel])") != std::string::npos);
}

TEST_CASE("kernel maps: the image's reference symbol and each module's base, from pid -1 MMAPs") {
    KernelMapsLog log;
    CHECK_FALSE(log.layout().recorded());
    log.add(kernel_map(-1, 0xffffffff81000000, 0x1276f48, 0xffffffff81000000, "[kernel.kallsyms]_text"));
    // x86's PTI trampoline map comes after, under the same prefix: the first is the image
    log.add(kernel_map(-1, 0xfffffe0000000000, 0x1000, 0, "[kernel.kallsyms]__entry_SYSCALL_64_trampoline"));
    log.add(kernel_map(-1, 0xffffffffc0200000, 0x3000, 0, "/lib/modules/6.1.0/kernel/drivers/x/virtio-net.ko"));
    log.add(kernel_map(-1, 0xffffffffc0100000, 0x2000, 0, "[nf_tables]"));
    log.add(kernel_map(-1, 0xffffffffc0100000, 0x2000, 0, "[nf_tables]"));  // the other decoding thread's
    log.add(kernel_map(1234, 0xffffffffc0300000, 0x1000, 0, "[ignored]"));  // a process's
    log.add(kernel_map(-1, 0xffffffffc0400000, 0, 0, "[empty]"));           // nothing mapped
    const KernelLayout l = log.layout();
    REQUIRE(l.recorded());
    CHECK(l.reloc_symbol == "_text");
    CHECK(l.reloc_addr == 0xffffffff81000000);
    CHECK(l.text_start == 0xffffffff81000000);
    CHECK(l.text_end == 0xffffffff81000000 + 0x1276f48);
    REQUIRE(l.modules.size() == 2);
    CHECK(l.modules[0].name == "nf_tables");
    CHECK(l.modules[0].start == 0xffffffffc0100000);
    CHECK(l.modules[0].end == 0xffffffffc0102000);
    CHECK(l.modules[1].name == "virtio_net");

    CHECK(kernel_module_name("[nf_tables]") == "nf_tables");
    CHECK(kernel_module_name("/lib/modules/6.1/kernel/fs/xfs/xfs.ko.zst") == "xfs");
    CHECK(kernel_module_name("/lib/modules/6.1/kernel/fs/x/snd-hda-intel.ko.gz") == "snd_hda_intel");
    CHECK(kernel_module_name("[kernel.kallsyms]_text") == "");
    CHECK(kernel_module_name("[vdso]") == "");
    CHECK(kernel_module_name("/usr/lib/libfoo.so") == "");
    CHECK(kernel_module_name("/tmp/x.kobj") == "");
}

TEST_CASE("the kernel build-id from an ELF notes blob, as /sys/kernel/notes holds it") {
    std::string notes;
    put_note(notes, 6, std::string_view("Linux\0", 6), std::string_view("\x01\x01\x00\x00", 4));
    put_note(notes, 3, std::string_view("GNU\0", 4), std::string_view("\x10\x1a\xb6\xe3\xd5", 5));
    CHECK(build_id_of_notes(notes) == "101ab6e3d5");
    CHECK(build_id_of_notes(notes.substr(0, notes.size() - 4)) == "");  // the descriptor cut short
    CHECK(build_id_of_notes("") == "");
    std::string other;
    put_note(other, 3, std::string_view("Xen\0", 4), std::string_view("\x01\x02", 2));  // not GNU's
    CHECK(build_id_of_notes(other) == "");
    // This machine's, when it has /sys/kernel/notes: what readelf would print.
    std::ifstream f("/sys/kernel/notes", std::ios::binary);
    if (f) {
        const std::string running = running_kernel_build_id();
        CHECK(running.size() >= 16);
        CHECK(running.find_first_not_of("0123456789abcdef") == std::string::npos);
    }
}

TEST_CASE("the recording's kernel: release and build-id from the header") {
    Session s(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data");
    const RecordedKernel rec = recorded_kernel(s.features());
    CHECK(rec.release == "6.18.44-fc-v782");
    CHECK(rec.build_id == "85c7e4e2ed76f4417e8aaad7c6b040d2bb897a26");  // perf buildid-list's [kernel.kallsyms]
    // And its kernel map, logged by ProcessMaps as the records are read.
    ProcessMaps maps;
    maps.set_kernel_log(rec.maps);
    s.run(maps);
    const KernelLayout l = rec.maps->layout();
    CHECK(l.reloc_symbol == "_text");
    CHECK(l.reloc_addr == 0xffffffff81000000);
    CHECK(l.text_start == 0xffffffff81000000);
    CHECK(l.text_end == 0xffffffff81000000 + 0x1276f48);
    CHECK(l.modules.empty());
}

TEST_CASE("this machine's symbols only for its own kernel: the build-id decides over the release") {
    struct utsname u {};
    REQUIRE(::uname(&u) == 0);
    const std::string running = running_kernel_build_id();
    const uint64_t text = [] {  // this boot's _text, if kallsyms shows addresses
        std::ifstream f("/proc/kallsyms");
        std::string a, t, n;
        while (f >> a >> t >> n)
            if (n == "_text") return std::stoull(a, nullptr, 16);
        return 0ull;
    }();
    if (running.empty() || text == 0) {
        MESSAGE("no /sys/kernel/notes or kallsyms addresses hidden: only the negative cases");
    }
    RecordedKernel same_release_other_build(u.release);
    same_release_other_build.build_id = "00112233445566778899aabbccddeeff00112233";
    CHECK(KernelSymbols(same_release_other_build).name(text) == KernelSymbols(RecordedKernel{}).name(text));
    CHECK(KernelSymbols(same_release_other_build).name(text).find("([kernel])") != std::string::npos);
    CHECK(KernelSymbols(same_release_other_build).name(text).rfind("0x", 0) == 0);  // an address, unnamed
    if (running.empty() || text == 0) return;
    RecordedKernel same_build_other_release("0.0.0-renamed");
    same_build_other_release.build_id = running;
    CHECK(KernelSymbols(same_build_other_release).name(text).rfind("0x", 0) != 0);  // named
    CHECK(KernelSymbols(std::string(u.release)).name(text).rfind("0x", 0) != 0);  // no build-id: the release
}

TEST_CASE("recorded kernel addresses move to this boot's: the image by _text, modules by their bases") {
    const KernelSymbols ks(KernelSymbols::texts, kKallsyms, kModules);
    const KernelLayout rec = recorded_elsewhere();
    // The image: recorded _text 0xffffffff81000000 is 0xffffffff9a000000 here.
    CHECK(ks.name(0xffffffff81001010, rec) == "schedule+0x10 ([kernel])");
    CHECK(ks.name(0xffffffff81001100, rec) == "__schedule+0x0 ([kernel])");
    // Unmoved, the same address would fall below every symbol here.
    CHECK(ks.name(0xffffffff81001010) == "0xffffffff81001010 ([kernel])");
    // A module, by its base: recorded at 0xffffffffc0500000, here at 0xffffffffc0100000.
    CHECK(ks.name(0xffffffffc0500420, rec) == "nft_lookup_eval+0x20 ([nf_tables])");
    // A module not loaded on this boot: its name, no symbol.
    CHECK(ks.name(0xffffffffc0800010, rec) == "0xffffffffc0800010 ([xfs])");
    // Outside every recorded map while the image moved: not guessed.
    CHECK(ks.name(0xffffffffa0000000, rec) == "0xffffffffa0000000 ([kernel])");

    // The same boot (the image did not move): outside the maps named as they are.
    KernelMapsLog same;
    same.add(kernel_map(-1, 0xffffffff9a000000, 0x1276f48, 0xffffffff9a000000, "[kernel.kallsyms]_text"));
    const KernelLayout here = same.layout();
    CHECK(ks.name(0xffffffff9a001010, here) == "schedule+0x10 ([kernel])");
    CHECK(ks.name(0xffffffffc0100410, here) == "nft_lookup_eval+0x10 ([nf_tables])");
    // An older perf's reference symbol, _stext.
    KernelMapsLog old;
    old.add(kernel_map(-1, 0xffffffff81000000, 0x1276f48, 0xffffffff81000000, "[kernel.kallsyms]_stext"));
    CHECK(ks.name(0xffffffff81001010, old.layout()) == "schedule+0x10 ([kernel])");
    // No reference symbol to move by: the image's addresses are not guessed.
    KernelMapsLog bare;
    bare.add(kernel_map(-1, 0xffffffff81000000, 0x1276f48, 0, "[kernel.kallsyms]"));
    CHECK(ks.name(0xffffffff81001010, bare.layout()) == "0xffffffff81001010 ([kernel])");
    // No kernel maps recorded at all (perf always writes them; synthetic
    // recordings may not): as they are, as perf does.
    CHECK(ks.name(0xffffffff9a001010, KernelLayout{}) == "schedule+0x10 ([kernel])");
    // A module whose base /proc/modules hides (kptr_restrict): unnamed.
    KernelMapsLog hidden;
    hidden.add(kernel_map(-1, 0xffffffff9a000000, 0x1276f48, 0xffffffff9a000000, "[kernel.kallsyms]_text"));
    hidden.add(kernel_map(-1, 0xffffffffc0900000, 0x1000, 0, "[hidden]"));
    CHECK(ks.name(0xffffffffc0900010, hidden.layout()) == "0xffffffffc0900010 ([hidden])");
    hidden.add(kernel_map(-1, 0xffffffffc0a00000, 0x1000, 0, "/lib/modules/6.1/extra/xt-foo.ko"));
    CHECK(ks.name(0xffffffffc0a00020, hidden.layout()) == "foo_hook+0x10 ([xt_foo])");
    // Not this kernel (no symbols): addresses whatever the maps say.
    CHECK(KernelSymbols(KernelSymbols::texts, "", "").name(0xffffffff81001010, rec) == "0xffffffff81001010 ([kernel])");
}

TEST_CASE("sleep stacks name their kernel frames at this boot's addresses") {
    // stacks_py311.data's kernel frames, named by a stand-in for this boot's
    // kallsyms in which the image sits 0x19000000 higher than when it was
    // recorded: every kernel frame must be named through its recorded
    // _text, which only the maps ProcessMaps logged give.
    Session s(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data");
    const RecordedKernel rec = recorded_kernel(s.features());
    ProcessMaps maps;
    maps.set_kernel_log(rec.maps);
    ModuleCache modules{ModuleOptions()};
    auto moved = std::make_shared<GilStackClassifier::NameCache>(rec, false);
    std::promise<std::shared_ptr<const KernelSymbols>> ks;
    ks.set_value(std::make_shared<KernelSymbols>(KernelSymbols::texts, "ffffffff9a000000 T _text\nffffffff9a000000 T image_start\n", ""));
    moved->ksyms = ks.get_future().share();
    GilStackClassifier gsc(&maps, modules, 8, rec, moved);
    // The same symbols without the recorded maps: nothing moves.
    auto unmoved = std::make_shared<GilStackClassifier::NameCache>(RecordedKernel{}, false);
    unmoved->ksyms = moved->ksyms;
    GilStackClassifier plain(&maps, modules, 8, RecordedKernel{}, unmoved);
    uint64_t stacks = 0, named = 0, addresses = 0, frames = 0;
    classify_side_by_side(s, maps, gsc, plain, [&](const PrevState& ps, const SleepLabel& label, const SleepLabel& other) {
        if (ps.cls != StateClass::Sleeping || label.stack().empty()) return;
        ++stacks;
        const std::string_view st = label.stack();
        for (size_t at = st.find("image_start+0x"); at != std::string::npos; at = st.find("image_start+0x", at + 1)) {
            ++frames;
            // the offset into the recorded image, within the recorded map's length
            CHECK(std::stoull(std::string(st.substr(at + 14, 16)), nullptr, 16) < 0x1276f48);
        }
        named += st.find("image_start+0x") != std::string::npos && st.find("0xffffffff8") == std::string::npos;
        addresses += other.stack().find("\"0xffffffff8") != std::string::npos &&
                     other.stack().find("image_start") == std::string::npos;
    });
    CHECK(stacks > 100);
    CHECK(named == stacks);
    CHECK(addresses == stacks);
    CHECK(frames >= 4 * stacks);  // schedule, the futex wait, the syscall entry...
}
