// Module lookup and GIL extents for stripped builds with separate symbols:
// a stand-in "libpython" is compiled here, then stripped three ways.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gilscan/symbols/modules.h"
#include "support/perf_writer.h"

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

const char* kFakePython = R"(#include <pthread.h>
#include <time.h>
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
__attribute__((noinline)) static void take_gil(void) {
    struct timespec ts = {0, 0};
    pthread_mutex_lock(&m);
    pthread_cond_timedwait(&c, &m, &ts);
    pthread_mutex_unlock(&m);
}
__attribute__((noinline)) static void drop_gil(void) {
    pthread_mutex_lock(&m);
    pthread_cond_signal(&c);
    pthread_mutex_unlock(&m);
}
void PyEval_RestoreThread(void *t) { (void)t; take_gil(); }
void PyEval_AcquireThread(void *t) { (void)t; take_gil(); }
void *PyEval_SaveThread(void) { drop_gil(); return 0; }
void PyEval_ReleaseThread(void *t) { (void)t; drop_gil(); }
)";

struct Workdir : gilscan::test::TempDir {
    Workdir() : TempDir("gilscan-mod") {}
    const fs::path& dir = path;
    int sh(const std::string& cmd) const { return std::system(("cd " + dir.string() + " && " + cmd).c_str()); }
};

Mapping mapping_of(const std::string& path) {
    Mapping m;
    m.start = 0x7f0000001000;
    m.end = m.start + 0x1000;
    m.pgoff = 0x1000;
    m.path = path;
    return m;
}

}  // namespace

TEST_CASE("GIL extents from the symtab, MiniDebugInfo and a .gnu_debuglink file") {
    Workdir w;
    std::ofstream(w.dir / "fake.c") << kFakePython;
    REQUIRE(w.sh("gcc -O1 -g -shared -fPIC -o libpython3.99.so fake.c -lpthread") == 0);
    ModuleCache plain({});
    const Module* m = plain.get(mapping_of((w.dir / "libpython3.99.so").string()));
    REQUIRE(m);
    CHECK(m->python);
    REQUIRE(m->take.size() == 1);
    const uint64_t take = m->take[0].begin;
    CHECK(m->symbols_from.empty());

    // MiniDebugInfo, the Fedora recipe: a small .symtab, xz-compressed into .gnu_debugdata.
    REQUIRE(w.sh("objcopy --only-keep-debug libpython3.99.so full.debug && "
                 "nm full.debug --format=posix --defined-only | awk '$2 ~ /[tT]/ {print $1}' > funcs && "
                 "objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols=funcs full.debug mini && "
                 "xz -f mini && strip --strip-all -R .comment -o mini.so libpython3.99.so && "
                 "objcopy --add-section .gnu_debugdata=mini.xz mini.so") == 0);
    ModuleCache minic({});
    const Module* mm = minic.get(mapping_of((w.dir / "mini.so").string()));
    REQUIRE(mm);
    CHECK_FALSE(mm->elf->has_symtab());
    REQUIRE(mm->take.size() == 1);
    CHECK(mm->take[0].begin == take);
    CHECK(mm->symbols_from.find(".gnu_debugdata") != std::string::npos);

    // .gnu_debuglink to a file in .debug/ beside the binary.
    REQUIRE(w.sh("mkdir -p .debug && cp full.debug .debug/linked.debug && strip --strip-all -o linked.so "
                 "libpython3.99.so && objcopy --add-gnu-debuglink=.debug/linked.debug linked.so") == 0);
    ModuleCache linkc({});
    const Module* ml = linkc.get(mapping_of((w.dir / "linked.so").string()));
    REQUIRE(ml);
    REQUIRE(ml->take.size() == 1);
    CHECK(ml->take[0].begin == take);
    CHECK(ml->symbols_from.find("linked.debug") != std::string::npos);

    // No symbols at all: the disassembly locator finds the same function.
    REQUIRE(w.sh("strip --strip-all -o bare.so libpython3.99.so") == 0);
    ModuleCache barec({});
    const Module* mb = barec.get(mapping_of((w.dir / "bare.so").string()));
    REQUIRE(mb);
    REQUIRE_FALSE(mb->take.empty());
    CHECK(mb->take[0].begin == take);
    REQUIRE_FALSE(mb->drop.empty());
}

TEST_CASE("perf's build-id cache and --symfs are searched; a binary that is not there is named once") {
    Workdir w;
    std::ofstream(w.dir / "fake.c") << kFakePython;
    REQUIRE(w.sh("gcc -O1 -shared -fPIC -Wl,--build-id -o libpython3.99.so fake.c -lpthread") == 0);
    ElfFile elf((w.dir / "libpython3.99.so").string());
    const std::string id = elf.build_id();
    REQUIRE(id.size() == 40);
    // As `perf archive` lays it out: <root>/.build-id/xx/rest/elf
    fs::create_directories(w.dir / "archive" / ".build-id" / id.substr(0, 2) / id.substr(2));
    fs::copy_file(w.dir / "libpython3.99.so", w.dir / "archive" / ".build-id" / id.substr(0, 2) / id.substr(2) / "elf");
    ModuleOptions o;
    o.symfs = (w.dir / "archive").string();
    o.build_ids["/recorded/elsewhere/libpython3.99.so"] = id;
    ModuleCache mc(o);
    const Module* m = mc.get(mapping_of("/recorded/elsewhere/libpython3.99.so"));
    REQUIRE(m);
    CHECK(m->python);
    CHECK(m->file.find("archive/.build-id") != std::string::npos);

    ModuleCache missing({});
    CHECK(missing.get(mapping_of("/recorded/elsewhere/libpython3.99.so")) == nullptr);
    CHECK(missing.get(mapping_of("/recorded/elsewhere/libpython3.99.so")) == nullptr);
    CHECK(missing.problems().size() == 1);
    CHECK(missing.get(mapping_of("//anon")) == nullptr);
    CHECK(missing.problems().size() == 1);
}

TEST_CASE("ModuleCache::preload: get() adopts the module, and problems come when get() asks, in its order") {
    Workdir w;
    std::ofstream(w.dir / "fake.c") << kFakePython;
    REQUIRE(w.sh("gcc -O1 -shared -fPIC -o libpython3.99.so fake.c -lpthread") == 0);
    const Mapping lib = mapping_of((w.dir / "libpython3.99.so").string());
    const Mapping gone = mapping_of("/recorded/elsewhere/libgone.so");
    const Mapping gone2 = mapping_of("/recorded/elsewhere/libgone2.so");
    ModuleCache mc({});
    CHECK(mc.preload(gone2));
    CHECK(mc.preload(lib));
    CHECK(mc.preload(gone));
    CHECK_FALSE(mc.preload(lib));  // there already
    CHECK_FALSE(mc.preload(mapping_of("//anon")));  // no file
    CHECK(mc.preloaded_unused() == 3);
    CHECK(mc.problems().empty());  // nothing asked for yet: a preload records nothing
    const Module* m = mc.get(lib);
    REQUIRE(m);
    CHECK(m->python);
    CHECK(m->take.size() == 1);
    CHECK(mc.preloaded_unused() == 2);
    CHECK(mc.get(lib) == m);
    CHECK_FALSE(mc.preload(lib));  // loaded: nothing to do
    CHECK(mc.get(gone) == nullptr);
    CHECK(mc.get(gone2) == nullptr);
    // In the order get() met them, as without a preload.
    ModuleCache plain({});
    CHECK(plain.get(gone) == nullptr);
    CHECK(plain.get(gone2) == nullptr);
    REQUIRE(mc.problems().size() == 2);
    CHECK(mc.problems() == plain.problems());
    CHECK(mc.problems()[0].find("libgone.so: not found") != std::string::npos);
    CHECK(mc.preloaded_unused() == 0);
}

TEST_CASE("load bias from the PT_LOAD holding the mapping's file offset (p_vaddr != p_offset)") {
    // Debian's python3.11 is non-PIE: its text PT_LOAD has p_vaddr - p_offset = 0x400000,
    // so `start - pgoff` (0x400000) is wrong and the bias is 0.
    ModuleCache mc({});
    Mapping m;
    m.path = "/usr/bin/python3.11";
    ElfFile elf(m.path);
    const ElfSegment* text = nullptr;
    for (const auto& s : elf.segments())
        if (s.type == PT_LOAD && (s.flags & PF_X)) text = &s;
    REQUIRE(text);
    REQUIRE(text->vaddr != text->offset);
    m.pgoff = text->offset & ~uint64_t{0xfff};
    m.start = text->vaddr & ~uint64_t{0xfff};
    m.end = m.start + text->memsz;
    const Module* mod = mc.get(m);
    REQUIRE(mod);
    CHECK(mod->bias_for(m) == 0u);
    // The same file mapped 0x10000 higher (as if relocated): the bias follows.
    Mapping moved = m;
    moved.start += 0x10000;
    CHECK(mod->bias_for(moved) == 0x10000u);
}
