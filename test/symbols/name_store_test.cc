// The frame-name store (name_store.h) on real binaries of this machine
// kind: answers kept by one run compose, in the next, the text libdw's own
// lookups give, at another load bias; a file replaced or a damaged store
// is a miss. That a whole recording's trace is the same with the store
// cold, warm and off is checked in golden_test.cc.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gilscan/symbols/frame_names.h"
#include "gilscan/symbols/name_store.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/symbols/unwind.h"
#include "support/dwfl_report.h"
#include "support/perf_writer.h"

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <utime.h>

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

const std::string kLibpython = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
const std::string kLibc = "/usr/lib/x86_64-linux-gnu/libc.so.6";

// A shared object reported at `base`, with the mapping its frames name.
struct Loaded : test::ReportedElf {
    Mapping mapping;
    Loaded(const std::string& path, uint64_t base) : ReportedElf(path, base) {
        mapping.path = path;
        mapping.exec = true;
    }
    Frame frame(uint64_t pc) const {
        Frame f;
        f.pc = pc;
        f.mapping = &mapping;
        f.dwfl = dwfl;
        return f;
    }
};

// Link-time addresses to name: the statement addresses of the module's
// first units' line tables (inside inlined calls as often as the code is),
// and the middle and the byte past the end of sized symbols.
std::vector<uint64_t> addresses(Dwfl_Module* m, size_t want) {
    std::vector<uint64_t> out;
    Dwarf_Addr bias = 0;
    for (Dwarf_Die* cu = nullptr; out.size() < want / 2 && (cu = dwfl_module_nextcu(m, cu, &bias)) != nullptr;) {
        Dwarf_Lines* lines = nullptr;
        size_t n = 0;
        if (dwarf_getsrclines(cu, &lines, &n) != 0) continue;
        for (size_t i = 0; i < n; i += 13) {
            Dwarf_Addr a = 0;
            if (dwarf_lineaddr(dwarf_onesrcline(lines, i), &a) == 0 && a) out.push_back(a);
        }
    }
    const int nsym = dwfl_module_getsymtab(m);
    for (int i = 1; i < nsym && out.size() < want; i += 7) {
        GElf_Sym sym;
        GElf_Addr value = 0;
        const char* name = dwfl_module_getsym_info(m, i, &sym, &value, nullptr, nullptr, nullptr);
        if (!name || !sym.st_size || sym.st_shndx == SHN_UNDEF) continue;
        out.push_back(value + sym.st_size / 2 - bias);
        out.push_back(value + sym.st_size - bias);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// Names every address (link-time) with `names`, each against libdw's own text.
size_t name_all(const Loaded& l, FrameNamer& names, const std::vector<uint64_t>& vaddrs, uint64_t base) {
    size_t inlined = 0;
    for (uint64_t v : vaddrs) {
        const Frame f = l.frame(v + base);
        CAPTURE(v);
        const std::vector<std::string> want = describe_frame(f);
        CHECK(names.describe(f) == want);
        inlined += want.size() > 1;
    }
    return inlined;
}

void write_text(const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string build_id_of(Dwfl_Module* m) {
    return NameStore::key_of(m).substr(0, NameStore::key_of(m).find('\t'));
}

}  // namespace

TEST_CASE("name store: answers kept by one run name the next run's frames as libdw does, at another load bias") {
    for (const std::string& path : {kLibpython, kLibc}) {
        CAPTURE(path);
        REQUIRE(fs::exists(path));
        test::TempDir dir("gilscan-names");
        const uint64_t base1 = 0x7f1234000000ull, base2 = 0x7f5678000000ull;
        std::vector<uint64_t> vaddrs;
        {
            Loaded l(path, base1);
            REQUIRE(l.mod);
            Dwarf_Addr bias = 0;
            REQUIRE(dwfl_module_getdwarf(l.mod, &bias));  // DWARF: inline names to keep
            vaddrs = addresses(l.mod, 600);
            NameStore store(dir.path.string());
            FrameNamer names;
            names.set_store(&store);
            const size_t inlined = name_all(l, names, vaddrs, base1);
            CHECK(inlined >= 20);
            CHECK(store.hits() == 0);
            CHECK(store.misses() == vaddrs.size());
            CHECK(names.symbol_hits() + names.symbol_fallbacks() == vaddrs.size());
            CHECK(store.save());
            CHECK(fs::exists(dir.path / ("names-" + build_id_of(l.mod))));
        }
        MESSAGE(fs::path(path).filename().string() << ": " << vaddrs.size() << " addresses kept");
        Loaded l(path, base2);
        NameStore store(dir.path.string());
        FrameNamer names;
        names.set_store(&store);
        name_all(l, names, vaddrs, base2);
        CHECK(store.hits() == vaddrs.size());
        CHECK(store.misses() == 0);
        CHECK(names.symbol_hits() + names.symbol_fallbacks() == 0);  // libdw not asked
        CHECK(names.scope_hits() + names.scope_fallbacks() == 0);
    }
}

TEST_CASE("name store: another file behind the same build-id, or the file changed, is another key") {
    test::TempDir dir("gilscan-names");
    const fs::path copy = dir.path / "libpython3.11.so.1.0";
    fs::copy_file(kLibpython, copy);
    Loaded a(kLibpython, 0x7f1234000000ull), b(copy.string(), 0x7f1234000000ull);
    const std::string ka = NameStore::key_of(a.mod), kb = NameStore::key_of(b.mod);
    CHECK(!ka.empty());
    CHECK(!kb.empty());
    CHECK(build_id_of(a.mod) == build_id_of(b.mod));
    CHECK(ka != kb);
    // Touched (a rewrite in place keeps path and inode): another key too.
    struct utimbuf t {1000000000, 1000000000};
    REQUIRE(::utime(copy.c_str(), &t) == 0);
    Loaded c(copy.string(), 0x7f1234000000ull);
    CHECK(NameStore::key_of(c.mod) != kb);
    // A key of another module's answers is not used.
    const uint64_t v = addresses(a.mod, 10).front();
    {
        NameStore store((dir.path / "s").string());
        FrameNamer names;
        names.set_store(&store);
        CHECK(names.describe(b.frame(v + 0x7f1234000000ull)) == describe_frame(b.frame(v + 0x7f1234000000ull)));
        CHECK(store.save());
    }
    NameStore store((dir.path / "s").string());
    NameStore::Module* mod = store.module(a.mod);
    REQUIRE(mod);
    CHECK(store.find(*mod, a.mod, v + 0x7f1234000000ull) == nullptr);  // b's file, a's key
}

TEST_CASE("name store: a damaged file is a miss and is written anew; names with a tab or newline are not kept") {
    test::TempDir dir("gilscan-names");
    Loaded l(kLibpython, 0x7f1234000000ull);
    const std::vector<uint64_t> vaddrs = addresses(l.mod, 40);
    REQUIRE(vaddrs.size() >= 10);
    const fs::path file = dir.path / ("names-" + build_id_of(l.mod));
    auto run = [&](size_t& hits) {
        NameStore store(dir.path.string());
        FrameNamer names;
        names.set_store(&store);
        name_all(l, names, vaddrs, 0x7f1234000000ull);
        hits = store.hits();
        CHECK(store.save());
    };
    size_t hits = 0;
    run(hits);
    CHECK(hits == 0);
    const std::string good = test::slurp(file);
    run(hits);
    CHECK(hits == vaddrs.size());
    // Cut, or changed anywhere (its last line holds a hash of the rest):
    // nothing of it is used.
    const size_t names_at = good.find('\n', good.find('\n') + 1) + 1;  // after the magic and the key
    std::string renamed = good;
    renamed[good.find('\t', good.find("\tS\t", names_at) + 3) + 1] ^= 0x20;  // one symbol's first letter
    const std::vector<std::string> damaged = {
        good.substr(0, good.size() - 1),                                      // the hash's line cut
        good.substr(0, good.rfind("end\t")),                                // no hash
        good.substr(0, good.find('\n')),                                     // the magic alone, unended
        "gilscan frame names 0" + good.substr(good.find('\n')),
        renamed,
        good.substr(0, names_at) + good.substr(good.find('\n', names_at) + 1),  // an answer gone
        good.substr(0, good.rfind("end\t")) + "zz\tS\t1\tx\n" + good.substr(good.rfind("end\t")),
        "",
    };
    for (size_t i = 0; i < damaged.size(); ++i) {
        CAPTURE(i);
        write_text(file, damaged[i]);
        NameStore store(dir.path.string());
        NameStore::Module* mod = store.module(l.mod);
        REQUIRE(mod);
        for (uint64_t v : vaddrs) CHECK(store.find(*mod, l.mod, v + 0x7f1234000000ull) == nullptr);
    }
    run(hits);  // written anew
    CHECK(test::slurp(file) == good);

    // An answer whose names hold a tab or a newline is named by libdw every time.
    fs::remove(file);
    {
        NameStore store(dir.path.string());
        NameStore::Module* mod = store.module(l.mod);
        REQUIRE(mod);
        store.add(*mod, l.mod, 0x7f1234000000ull + vaddrs[0], StoredName{{}, true, "a\tb", 1});
        store.add(*mod, l.mod, 0x7f1234000000ull + vaddrs[1], StoredName{{"x\ny"}, true, "c", 1});
        store.add(*mod, l.mod, 0x7f1234000000ull + vaddrs[2], StoredName{{"inl"}, true, "d", 2});
        CHECK(store.save());
    }
    NameStore store(dir.path.string());
    NameStore::Module* mod = store.module(l.mod);
    REQUIRE(mod);
    CHECK(store.find(*mod, l.mod, 0x7f1234000000ull + vaddrs[0]) == nullptr);
    CHECK(store.find(*mod, l.mod, 0x7f1234000000ull + vaddrs[1]) == nullptr);
    const StoredName* kept = store.find(*mod, l.mod, 0x7f1234000000ull + vaddrs[2]);
    REQUIRE(kept);
    CHECK(kept->symbol == "d");
    CHECK(kept->offset == 2);
    CHECK(kept->inlined == std::vector<std::string>{"inl"});
    // No directory: nothing kept, nothing written.
    NameStore off("");
    CHECK(off.module(l.mod) == nullptr);
    CHECK(off.save());
}

namespace {
void age(const fs::path& p, int64_t seconds) {
    const timespec t[2] = {{::time(nullptr) - seconds, 0}, {::time(nullptr) - seconds, 0}};
    REQUIRE(::utimensat(AT_FDCWD, p.c_str(), t, 0) == 0);
}
int64_t age_of(const fs::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return static_cast<int64_t>(::time(nullptr)) - static_cast<int64_t>(st.st_mtime);
}
}  // namespace

TEST_CASE("name store: its files are entries of the cache, marked used when loaded and pruned under its limit") {
    Loaded l(kLibc, 0x7f1234000000ull);
    REQUIRE(l.mod);
    test::TempDir dir("gilscan-names");
    const int64_t day = 24 * 3600;
    // Another binary's names (used 3 days ago), a debug file (2 days ago);
    // what is not an entry: the kernel's symbols, a names file of no
    // build-id, a file of the user's.
    for (const char* name : {"kallsyms-cccc", "names-xyz", "notes.txt"}) write_text(dir.path / name, std::string(1000, 'x'));
    write_text(dir.path / "names-bbbb", "gilscan frame names 1\n" + std::string(978, 'x'));
    write_text(dir.path / "aaaa.debug", "\x7f" "ELF" + std::string(996, 'x'));
    age(dir.path / "names-bbbb", 3 * day);
    age(dir.path / "aaaa.debug", 2 * day);
    age(dir.path / "kallsyms-cccc", 5 * day);
    age(dir.path / "names-xyz", 5 * day);
    const fs::path mine = dir.path / ("names-" + build_id_of(l.mod));
    {
        // 1,500 bytes allowed: with this binary's new file the two entries
        // are over it, and the least recently used one goes.
        NameStore store(dir.path.string(), 1500);
        NameStore::Module* mod = store.module(l.mod);
        REQUIRE(mod);
        store.add(*mod, l.mod, 0x7f1234000000ull + 0x1000, StoredName{{}, true, "f", 1});
        CHECK(store.save());
    }
    CHECK(fs::exists(mine));
    CHECK_FALSE(fs::exists(dir.path / "names-bbbb"));
    CHECK(fs::exists(dir.path / "aaaa.debug"));
    for (const char* name : {"kallsyms-cccc", "names-xyz", "notes.txt"}) CHECK(fs::exists(dir.path / name));

    // Loaded and used: marked now when last marked two days ago, left as
    // it is when an hour ago (no write per run). Nothing new: not written.
    for (int64_t ago : {2 * day, int64_t{3600}}) {
        CAPTURE(ago);
        age(mine, ago);
        NameStore store(dir.path.string(), 1500);
        NameStore::Module* mod = store.module(l.mod);
        REQUIRE(mod);
        CHECK(store.find(*mod, l.mod, 0x7f1234000000ull + 0x1000) != nullptr);
        CHECK(store.save());
        if (ago > day)
            CHECK(age_of(mine) < 60);
        else
            CHECK(age_of(mine) >= ago - 60);
    }
}

TEST_CASE("name store: the debuginfo cache's entry keeps its key when the cache marks it used") {
    // The cache marks an entry used by its mtime (debuginfo_cache.h): the
    // entry of the module's own build-id is keyed without it; any other
    // file, and that name under another build-id, with it.
    test::TempDir dir("gilscan-names");
    const std::string id = "93ac61ec5a8eb1396f9fbd350e3169a558528a40";
    const fs::path entry = dir.path / (id + ".debug"), other = dir.path / "libc.so.6.debug";
    write_text(entry, "inflated debug file");
    write_text(other, "a debug file");
    auto key = [](const fs::path& p, std::string_view build_id) {
        std::string k;
        REQUIRE(NameStore::append_file_id(k, p.c_str(), build_id));
        return k;
    };
    const std::string entry_before = key(entry, id), other_before = key(other, id), foreign_before = key(entry, "ab");
    CHECK(entry_before.find(" - ") != std::string::npos);
    CHECK(other_before.find(" - ") == std::string::npos);
    struct utimbuf t {1000000000, 1000000000};
    REQUIRE(::utime(entry.c_str(), &t) == 0);
    REQUIRE(::utime(other.c_str(), &t) == 0);
    CHECK(key(entry, id) == entry_before);
    CHECK(key(other, id) != other_before);
    CHECK(key(entry, "ab") != foreign_before);
    // Replaced (the cache writes a new entry and renames it over): another key.
    write_text(dir.path / "new", "inflated debug file");
    fs::rename(dir.path / "new", entry);
    CHECK(key(entry, id) != entry_before);
    std::string k;
    CHECK_FALSE(NameStore::append_file_id(k, (dir.path / "missing.debug").c_str(), id));
}
