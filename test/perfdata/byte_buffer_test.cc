// The buffers' page handling (byte_buffer.h): what is prefaulted is
// resident before anything writes it, and keeps its contents.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "gilscan/perfdata/byte_buffer.h"

using namespace gilscan;

namespace {

// How many of the pages [p, p + bytes) touches are resident (mincore), and
// how many it touches.
struct Pages {
    size_t resident, spanned;
};
Pages pages_of(const void* p, size_t bytes) {
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t from = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
    std::vector<unsigned char> in((to - from) / page);
    REQUIRE(::mincore(reinterpret_cast<void*>(from), to - from, in.data()) == 0);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return {n, in.size()};
}

}  // namespace

TEST_CASE("prefault: a fresh mapping's pages are all resident at once, and written pages keep their bytes") {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), bytes = 256 * page;
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    ::madvise(m, bytes, MADV_NOHUGEPAGE);  // pages counted one by one
    auto* p = static_cast<unsigned char*>(m);
    p[3 * page + 5] = 42;  // one page written already
    CHECK(pages_of(p, bytes).resident == 1);
    prefault(p + 10, bytes - 20);  // rounded out to whole pages
    CHECK(pages_of(p, bytes).resident == 256);
    CHECK(p[3 * page + 5] == 42);
    CHECK(p[7 * page] == 0);
    prefault(p, 0);  // nothing to do
    ::munmap(m, bytes);
}

TEST_CASE("PrefaultAllocator: a large array's pages are resident before it is written") {
    // 64 MiB: past glibc's largest mmap threshold, so always a fresh
    // mapping, whose pages only a prefault makes resident before a write.
    std::vector<uint64_t, PrefaultAllocator<uint64_t>> v;
    v.reserve((64u << 20) / sizeof(uint64_t));
    const Pages got = pages_of(v.data(), v.capacity() * sizeof(uint64_t));
    CHECK(got.spanned >= (64u << 20) / static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
    CHECK(got.resident == got.spanned);
    // And it is a vector like any other (resize() leaves new elements as they are).
    v.resize(3);
    v[0] = 1;
    v.push_back(7);
    CHECK(v.size() == 4);
    CHECK(v[3] == 7);
}

TEST_CASE("same_short and copy_short: every length from 0 to 40, a difference at every position") {
    const std::string base = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEF";
    for (size_t n = 0; n <= 40; ++n) {
        const std::string a = base.substr(0, n);
        std::string b = a;
        CHECK(same_short(a, b));
        for (size_t i = 0; i < n; ++i) {
            b[i] ^= 0x20;
            CHECK_FALSE(same_short(a, b));
            b[i] ^= 0x20;
        }
        if (n) CHECK_FALSE(same_short(a, std::string_view(a).substr(0, n - 1)));
        std::string out(n + 8, '.');
        copy_short(out.data() + 4, a.data(), n);
        CHECK(out == std::string(4, '.') + a + std::string(4, '.'));
    }
    CHECK(same_short(std::string_view(), std::string_view()));
}
