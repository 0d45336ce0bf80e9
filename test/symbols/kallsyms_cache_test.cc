// The kernel symbol cache (kallsyms_cache.h): an entry is used only for the
// same kernel, boot, modules and first kallsyms line, checked before use,
// written aside with mode 0600, and names what /proc/kallsyms names.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/utsname.h>

#include "gilscan/symbols/kallsyms_cache.h"
#include "gilscan/symbols/kernel_symbols.h"
#include "support/perf_writer.h"

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

struct TempDir : gilscan::test::TempDir {
    TempDir() : gilscan::test::TempDir("gilscan-kallsyms") {}
};

// A table over text in /proc/kallsyms's form, records pointing at the names.
struct Table {
    std::string text =
        "ffffffff9a000000 T _text\n"
        "ffffffff9a001000 T schedule\n"
        "ffffffff9a001100 t __schedule\n"
        "ffffffffc0100000 t nft_do_chain\t[nf_tables]\n";
    std::vector<KallsymsSym> syms;
    Table() {
        for (const char* n : {"_text", "schedule", "__schedule", "nft_do_chain"}) {
            const size_t at = text.find(std::string(" ") + n) + 1;
            const size_t line = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
            syms.push_back({std::stoull(text.substr(line, 16), nullptr, 16), static_cast<uint32_t>(at),
                            static_cast<uint32_t>(std::strlen(n))});
        }
    }
    KallsymsTable view() const {
        KallsymsTable t;
        t.names = text;
        t.syms = reinterpret_cast<const unsigned char*>(syms.data());
        t.nsyms = syms.size();
        t.text_addr = 0xffffffff9a000000;
        t.stext_addr = 0xffffffff9a000010;
        t.text_end = 0xffffffff9b000000;
        return t;
    }
};

KallsymsKey key() {
    return {"0123456789abcdef", "1cc07564-db03-4942-994c-e173a94f8df5", "nf_tables 352256 0xffffffffc0100000\n",
            "ffffffff9a000000 T _text"};
}

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << s;
}

// name and its line's rest ("\t[module]" or nothing), from an entry's table
std::string line_of(const KallsymsTable& t, size_t i) {
    const KallsymsSym s = t.sym(i);
    return std::string(t.names.substr(s.name, t.names.find('\n', s.name) - s.name));
}

}  // namespace

TEST_CASE("kallsyms cache: an entry written, used for the same key only, its names compacted") {
    TempDir dir;
    const Table tab;
    REQUIRE(write_kallsyms_cache(dir.path, key(), tab.view()));
    const fs::path path = kallsyms_cache_path(dir.path, key().build_id);
    REQUIRE(fs::exists(path));
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);  // kernel addresses: this user's only

    auto e = load_kallsyms_cache(dir.path, key());
    REQUIRE(e);
    const KallsymsTable& t = e->table();
    REQUIRE(t.nsyms == 4);
    CHECK(t.text_addr == 0xffffffff9a000000);
    CHECK(t.stext_addr == 0xffffffff9a000010);
    CHECK(t.text_end == 0xffffffff9b000000);
    CHECK(t.sym(1).addr == 0xffffffff9a001000);
    CHECK(line_of(t, 1) == "schedule");
    CHECK(line_of(t, 3) == "nft_do_chain\t[nf_tables]");
    CHECK(t.names == "_text\nschedule\n__schedule\nnft_do_chain\t[nf_tables]\n");  // no addresses or types

    // Any part of the key different: not this boot's table.
    for (int part = 0; part < 4; ++part) {
        KallsymsKey k = key();
        std::string& s = part == 0 ? k.boot_id : part == 1 ? k.modules : part == 2 ? k.first_visible : k.build_id;
        s += "x";
        CHECK_FALSE(load_kallsyms_cache(dir.path, k));
    }
    CHECK_FALSE(load_kallsyms_cache("", key()));
    CHECK_FALSE(load_kallsyms_cache(dir.path / "none", key()));
}

TEST_CASE("kallsyms cache: nothing written for a key that cannot tell boots apart or hides addresses") {
    TempDir dir;
    const Table tab;
    KallsymsKey hidden = key();
    hidden.first_visible = "0000000000000000 T _text";  // kptr_restrict
    CHECK_FALSE(hidden.usable());
    CHECK_FALSE(write_kallsyms_cache(dir.path, hidden, tab.view()));
    KallsymsKey no_boot = key();
    no_boot.boot_id.clear();
    CHECK_FALSE(write_kallsyms_cache(dir.path, no_boot, tab.view()));
    KallsymsKey no_build = key();
    no_build.build_id.clear();
    CHECK_FALSE(write_kallsyms_cache(dir.path, no_build, tab.view()));
    CHECK_FALSE(write_kallsyms_cache(dir.path, key(), KallsymsTable{}));  // no symbols
    CHECK_FALSE(write_kallsyms_cache("", key(), tab.view()));
    CHECK(fs::is_empty(dir.path));
    // and such a key never loads one
    REQUIRE(write_kallsyms_cache(dir.path, key(), tab.view()));
    hidden.build_id = key().build_id;
    CHECK_FALSE(load_kallsyms_cache(dir.path, hidden));
}

TEST_CASE("kallsyms cache: one entry per kernel build; other builds' removed, temporaries not left") {
    TempDir dir;
    const Table tab;
    KallsymsKey other = key();
    other.build_id = "fedcba9876543210";
    REQUIRE(write_kallsyms_cache(dir.path, other, tab.view()));
    spit(dir.path / "0123.debug", "not ours");
    REQUIRE(write_kallsyms_cache(dir.path, key(), tab.view()));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"0123.debug", "kallsyms-" + key().build_id});
    // Rewritten in place for a new boot.
    KallsymsKey next_boot = key();
    next_boot.boot_id = "another-boot";
    REQUIRE(write_kallsyms_cache(dir.path, next_boot, tab.view()));
    CHECK(load_kallsyms_cache(dir.path, next_boot));
    CHECK_FALSE(load_kallsyms_cache(dir.path, key()));
}

TEST_CASE("kallsyms cache: a damaged or foreign entry is a miss, whatever byte is wrong") {
    TempDir dir;
    const Table tab;
    REQUIRE(write_kallsyms_cache(dir.path, key(), tab.view()));
    const fs::path path = kallsyms_cache_path(dir.path, key().build_id);
    const std::string good = slurp(path);
    REQUIRE(load_kallsyms_cache(dir.path, key()));
    // Every cut is refused.
    for (size_t n = 0; n < good.size(); ++n) {
        spit(path, good.substr(0, n));
        CHECK_FALSE(load_kallsyms_cache(dir.path, key()));
    }
    // A byte more.
    spit(path, good + "x");
    CHECK_FALSE(load_kallsyms_cache(dir.path, key()));
    // The records (16 bytes each: address, name offset, length) sit between
    // the header, whose last fields are the record count and the arena's
    // size, and the arena.
    const std::string arena = "_text\nschedule\n__schedule\nnft_do_chain\t[nf_tables]\n";
    REQUIRE(good.size() > arena.size() + 64 + 16);
    const size_t recs = good.size() - arena.size() - 64;
    REQUIRE(good.substr(recs + 64) == arena);
    auto patched = [&](size_t at, const void* v, size_t n) {
        std::string b = good;
        std::memcpy(b.data() + at, v, n);
        spit(path, b);
        return load_kallsyms_cache(dir.path, key()) != nullptr;
    };
    const uint32_t far = 1u << 20, mid = 2;  // "_t|ext"
    CHECK_FALSE(patched(recs + 16 + 8, &far, 4));  // schedule's name offset
    CHECK_FALSE(patched(recs + 16 + 12, &mid, 4));  // schedule's length 2: "sc", not a line
    const uint64_t low = 0x1000;
    CHECK_FALSE(patched(recs + 16, &low, 8));  // below _text's address
    const uint32_t zero = 0;
    CHECK_FALSE(patched(recs + 16 + 12, &zero, 4));  // an empty name
    CHECK_FALSE(patched(recs + 16 + 8, &zero, 4));  // offset 0 with length 8: "_text\nsc" is no line end
    const uint64_t count = 1ull << 60;
    CHECK_FALSE(patched(recs - 16, &count, 8));  // a record count past the file
    CHECK_FALSE(patched(0, "GSKSYM2\n", 8));     // another format
    const uint64_t swapped = 0x0807060504030201ull;
    CHECK_FALSE(patched(8, &swapped, 8));        // another byte order
    // Every byte flipped in turn: refused, or a table whose every record
    // names a line inside its arena (what KernelSymbols::name relies on).
    size_t loaded = 0;
    for (size_t i = 0; i < good.size(); ++i) {
        std::string b = good;
        b[i] = static_cast<char>(b[i] ^ 0xff);
        spit(path, b);
        auto e = load_kallsyms_cache(dir.path, key());
        if (!e) continue;
        ++loaded;
        const KallsymsTable& t = e->table();
        for (size_t k = 0; k < t.nsyms; ++k) {
            const KallsymsSym sym = t.sym(k);
            REQUIRE(uint64_t{sym.name} + sym.len < t.names.size());
            CHECK(t.names.find('\n', sym.name) >= sym.name + sym.len);
            if (k) CHECK(t.sym(k - 1).addr <= sym.addr);
        }
    }
    CHECK(loaded > 0);  // flips in addresses and in names' letters still load (they are not checked)
    CHECK(loaded < good.size() / 2);
    spit(path, good);
    CHECK(load_kallsyms_cache(dir.path, key()));  // and the original still loads
}

TEST_CASE("kernel symbols through the cache: read once, then the entry; the same names either way") {
    struct utsname u {};
    REQUIRE(::uname(&u) == 0);
    const std::string running = running_kernel_build_id();
    std::string head(4096, '\0');
    {
        std::ifstream f("/proc/kallsyms");
        f.read(head.data(), static_cast<std::streamsize>(head.size()));
        head.resize(static_cast<size_t>(f.gcount()));
    }
    if (running.empty() || kallsyms_first_visible(head).empty()) {
        MESSAGE("no /sys/kernel/notes or kallsyms addresses hidden: nothing to cache");
        TempDir dir;
        CHECK(KernelSymbols(RecordedKernel(u.release), dir.path).source() != KernelSymbols::Source::cache);
        return;
    }
    TempDir dir;
    const KernelSymbols plain(RecordedKernel(u.release));
    CHECK(plain.source() == KernelSymbols::Source::proc);
    const KernelSymbols made(RecordedKernel(u.release), dir.path);
    CHECK(made.source() == KernelSymbols::Source::proc_cached);
    const KernelSymbols used(RecordedKernel(u.release), dir.path);
    CHECK(used.source() == KernelSymbols::Source::cache);
    REQUIRE(plain.size() > 1000);
    CHECK(used.size() == plain.size());
    // Names of addresses across the whole table, and between and past them.
    std::ifstream f("/proc/kallsyms");
    std::string a, t, n;
    size_t i = 0, checked = 0;
    while (f >> a >> t >> n) {
        if (i++ % 53 != 0) continue;
        const uint64_t addr = std::stoull(a, nullptr, 16);
        for (uint64_t d : {0ull, 1ull, 7ull, 4096ull}) {
            CHECK(used.name(addr + d) == plain.name(addr + d));
            CHECK(made.name(addr + d) == plain.name(addr + d));
        }
        ++checked;
    }
    CHECK(checked > 100);
    // A damaged entry: read again, and rewritten.
    const std::string path = kallsyms_cache_path(dir.path, running);
    std::string bytes = slurp(path);
    bytes[bytes.size() / 2] ^= 0x55;
    spit(path, bytes.substr(0, bytes.size() - 1));
    const KernelSymbols again(RecordedKernel(u.release), dir.path);
    CHECK(again.source() == KernelSymbols::Source::proc_cached);
    CHECK(KernelSymbols(RecordedKernel(u.release), dir.path).source() == KernelSymbols::Source::cache);
    // Not this kernel: neither read nor cached.
    CHECK(KernelSymbols(RecordedKernel("0.0.0-other"), dir.path).source() == KernelSymbols::Source::none);
}

TEST_CASE("kallsyms cache key: the first line with a visible address, past per-CPU symbols at 0") {
    // Linux 6.1 (Debian 12) as root: per-CPU offsets first.
    CHECK(kallsyms_first_visible("0000000000000000 A fixed_percpu_data\n"
                                 "0000000000000000 A __per_cpu_start\n"
                                 "0000000000001000 A cpu_debug_store\n"
                                 "0000000000002000 A irq_stack_backing_store\n") == "0000000000001000 A cpu_debug_store");
    // Without the per-CPU symbols (newer kernels).
    CHECK(kallsyms_first_visible("ffffffff81000000 T _stext\nffffffff81000000 T _text\n") ==
          "ffffffff81000000 T _stext");
    // kptr_restrict: every address 0, none visible; and a line cut by the read is not taken.
    CHECK(kallsyms_first_visible("0000000000000000 A fixed_percpu_data\n0000000000000000 T _text\n") == "");
    CHECK(kallsyms_first_visible("0000000000000000 A fixed_percpu_data\nffffffff8100") == "");
    CHECK(kallsyms_first_visible("") == "");
    // A key's line: one whole line whose address is not 0.
    const std::pair<const char*, bool> lines[] = {
        {"0000000000001000 A cpu_debug_store", true},
        {"1 T _stext", true},
        {"", false},
        {"ffffffff81000000 T _stext\nffffffff81000000 T _text", false},
        {"ffffffff81000000 T _stext\n", false},
        {" T _stext", false},
        {"ffffffff81000000", false},
        {"0000 T _stext", false},
    };
    for (const auto& [line, usable] : lines) {
        KallsymsKey k = key();
        k.first_visible = line;
        const std::string shown = line;  // clang 14 cannot capture a structured binding in CAPTURE's lambda
        CAPTURE(shown);
        CHECK(k.usable() == usable);
    }
}

TEST_CASE("kallsyms cache key: a module moved or resized changes it, its users and state do not") {
    const std::string mods =
        "nf_tables 352256 583 nft_chain_nat, Live 0xffffffffc0100000\n"
        "xt_foo 4096 0 - Live 0xffffffffc0300000 (OE)\n";
    CHECK(kallsyms_modules_key(mods) == "nf_tables 352256 0xffffffffc0100000\nxt_foo 4096 0xffffffffc0300000\n");
    CHECK(kallsyms_modules_key("nf_tables 352256 2 -, Unloading 0xffffffffc0100000\n"
                               "xt_foo 4096 1 - Live 0xffffffffc0300000 (OE)") == kallsyms_modules_key(mods));
    CHECK(kallsyms_modules_key("nf_tables 352256 583 nft_chain_nat, Live 0xffffffffc0200000\n"
                               "xt_foo 4096 0 - Live 0xffffffffc0300000 (OE)\n") != kallsyms_modules_key(mods));
    CHECK(kallsyms_modules_key("nf_tables 352000 583 nft_chain_nat, Live 0xffffffffc0100000\n"
                               "xt_foo 4096 0 - Live 0xffffffffc0300000 (OE)\n") != kallsyms_modules_key(mods));
    CHECK(kallsyms_modules_key("") == "");
    CHECK(kallsyms_modules_key("garbage\n\n") == "");
}
