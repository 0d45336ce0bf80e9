// MappingMemo: the unwinder's memo of mappings, modules and biases, against
// AddressSpace::find and ModuleCache::get on real libpython builds.
#include <doctest/doctest.h>

#include "gilscan/symbols/mapping_memo.h"

using namespace gilscan;

namespace {

const char* kLib311 = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
const char* kLib312 = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0";

// libpython's text mapping (its second PT_LOAD, file offset 0xf5000 in
// 3.11.7) at `start`, and a stack's anonymous mapping above it.
AddressSpace space_with(const char* lib, uint64_t start, uint64_t id) {
    AddressSpace as;
    as.pid = static_cast<int32_t>(1000 + id);
    as.id = id;
    as.version = 1;
    as.maps[start] = Mapping{start, start + 0x200000, 0xf5000, lib, "", 1, true};
    as.maps[0x7ffd00000000] = Mapping{0x7ffd00000000, 0x7ffd00100000, 0, "[stack]", "", 0, false};
    return as;
}

}  // namespace

TEST_CASE("mapping memo: find answers as the space does, inside, between and after the mapping found last") {
    ModuleCache modules({});
    AddressSpace as = space_with(kLib311, 0x7f0000000000, 1);
    MappingMemo maps;
    maps.bind(as, modules);
    for (uint64_t addr : {0x7f0000000010ull, 0x7f00000fffffull, 0x7f0000200000ull, 0x7ffd00000008ull, 0x7f0000000000ull,
                          0x1000ull, 0x7f00001fffffull, 0x7ffd00100000ull}) {
        CAPTURE(addr);
        CHECK(maps.find(addr) == as.find(addr));
    }
}

TEST_CASE("mapping memo: a mapping's module and bias, loaded once and kept for a space of the same layout") {
    ModuleCache modules({});
    AddressSpace a = space_with(kLib311, 0x7f0000000000, 1);
    AddressSpace b = space_with(kLib311, 0x7f0000000000, 2);  // another process of one layout
    MappingMemo maps;
    maps.bind(a, modules);
    const Mapping* ma = maps.find(0x7f0000001000);
    REQUIRE(ma);
    const MappingMemo::Entry& ea = maps.entry(*ma);
    REQUIRE(ea.mod);
    CHECK(ea.mod == modules.get(*ma));
    REQUIRE(ea.bias);
    CHECK(*ea.bias == 0x7f0000000000 - 0xf5000);  // file offset 0xf5000 is link-time address 0xf5000
    CHECK(&maps.entry(*ma) == &ea);  // the same entry, not a new one
    maps.bind(b, modules);
    const Mapping* mb = maps.find(0x7f0000001000);
    REQUIRE(mb);
    REQUIRE(mb != ma);
    const MappingMemo::Entry& eb = maps.entry(*mb);
    CHECK(&eb == &ea);  // found by path, build-id, start and pgoff
    CHECK(eb.map == mb);
    CHECK(eb.mod == ea.mod);
}

TEST_CASE("mapping memo: a space changed in place (its version bumped) is looked up again") {
    // The same std::map node now holds another library: only the version
    // says that the memo's pointer to it means something else.
    ModuleCache modules({});
    AddressSpace as = space_with(kLib311, 0x7f0000000000, 1);
    MappingMemo maps;
    maps.bind(as, modules);
    const Mapping* m = maps.find(0x7f0000001000);
    REQUIRE(m);
    const Module* old_mod = maps.module(*m);
    REQUIRE(old_mod);
    as.maps[0x7f0000000000] = Mapping{0x7f0000000000, 0x7f0000200000, 0x1000, kLib312, "", 2, true};
    ++as.version;
    maps.bind(as, modules);
    const Mapping* now = maps.find(0x7f0000001000);
    REQUIRE(now == m);  // the same node
    const MappingMemo::Entry& e = maps.entry(*now);
    CHECK(e.path == kLib312);
    CHECK(e.pgoff == 0x1000);
    REQUIRE(e.mod);
    CHECK(e.mod != old_mod);
    CHECK(e.mod == modules.get(*now));
}
