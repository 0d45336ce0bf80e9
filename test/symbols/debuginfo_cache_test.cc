// The debuginfo cache (debuginfo_cache.h) on synthetic debug files: the
// inflated copy holds what libelf's own decompression gives, section by
// section; entries are made once, reused, checked, and never left half
// made. That gilscan's output is the same with and without the cache is
// checked on a real recording in golden_test.cc.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <fstream>
#include <map>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <csignal>

#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gilscan/symbols/debuginfo_cache.h"
#include "support/debug_elf.h"
#include "support/perf_writer.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

struct ScratchDir : gilscan::test::TempDir {
    ScratchDir() : gilscan::test::TempDir("gilscan-dicache") {}
};

// Section name -> (type, flags, bytes as libelf reads them, decompressed by libelf when compressed).
struct Seen {
    uint32_t type;
    uint64_t flags;
    std::vector<uint8_t> data;
};
std::map<std::string, Seen> sections_by_libelf(const fs::path& p, size_t* phnum = nullptr) {
    elf_version(EV_CURRENT);
    const int fd = ::open(p.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    Elf* e = elf_begin(fd, ELF_C_READ, nullptr);
    REQUIRE(e);
    size_t shstrndx = 0;
    REQUIRE(elf_getshdrstrndx(e, &shstrndx) == 0);
    if (phnum) REQUIRE(elf_getphdrnum(e, phnum) == 0);
    std::map<std::string, Seen> out;
    for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr h;
        REQUIRE(gelf_getshdr(scn, &h));
        const std::string name = elf_strptr(e, shstrndx, h.sh_name);
        const uint64_t flags = h.sh_flags & ~static_cast<uint64_t>(SHF_COMPRESSED);
        if (h.sh_flags & SHF_COMPRESSED) REQUIRE(elf_compress(scn, 0, 0) == 1);
        Elf_Data* d = elf_getdata(scn, nullptr);
        std::vector<uint8_t> bytes;
        if (d && d->d_buf && h.sh_type != SHT_NOBITS) bytes.assign(static_cast<uint8_t*>(d->d_buf), static_cast<uint8_t*>(d->d_buf) + d->d_size);
        out[name] = {h.sh_type, flags, bytes};
    }
    elf_end(e);
    ::close(fd);
    return out;
}

bool same(const std::map<std::string, Seen>& a, const std::map<std::string, Seen>& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [name, s] : a) {
        auto it = b.find(name);
        if (it == b.end() || it->second.type != s.type || it->second.flags != s.flags || it->second.data != s.data)
            return false;
    }
    return true;
}

}  // namespace

TEST_CASE("debuginfo cache: the inflated copy reads as libelf's own decompression, on one thread or two") {
    ScratchDir dir;
    const fs::path in = dir.path / "in.debug";
    write_file(in, make_elf(debug_sections()));
    const int in_fd = ::open(in.c_str(), O_RDONLY);
    REQUIRE(in_fd >= 0);
    CHECK(elf_build_id_hex(in_fd) == kDebugId);
    std::vector<std::vector<uint8_t>> copies;
    for (unsigned threads : {1u, 2u}) {
        CAPTURE(threads);
        const fs::path out = dir.path / ("out" + std::to_string(threads));
        const int out_fd = ::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
        REQUIRE(out_fd >= 0);
        CHECK(write_inflated_elf(in_fd, out_fd, threads));
        ::close(out_fd);
        size_t phnum = 0;
        const auto got = sections_by_libelf(out, &phnum);
        CHECK(phnum == 1);
        CHECK(same(got, sections_by_libelf(in)));
        CHECK(got.at(".debug_info").data.size() == 300000);  // (the check is not vacuous)
        // (Not a structured binding: clang 14 cannot capture one in doctest's lambda.)
        for (const auto& section : got) CHECK_MESSAGE(!(section.second.flags & SHF_COMPRESSED), section.first);
        const int of = ::open(out.c_str(), O_RDONLY);
        CHECK(elf_build_id_hex(of) == kDebugId);
        ::close(of);
        copies.push_back(read_file(out));
    }
    CHECK(copies[0] == copies[1]);
    // The program headers are where they were, unchanged.
    const auto orig = read_file(in);
    CHECK(std::equal(orig.begin() + 64, orig.begin() + 64 + sizeof(Elf64_Phdr), copies[0].begin() + 64));
    ::close(in_fd);
}

TEST_CASE("debuginfo cache: nothing to gain or not ours to rewrite is left to libdw") {
    ScratchDir dir;
    auto try_one = [&](const std::vector<uint8_t>& bytes) {
        const fs::path in = dir.path / "x.debug";
        write_file(in, bytes);
        const int in_fd = ::open(in.c_str(), O_RDONLY);
        const int out_fd = ::open((dir.path / "x.out").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
        const bool made = write_inflated_elf(in_fd, out_fd, 2);
        ::close(in_fd);
        ::close(out_fd);
        return made;
    };
    CHECK(try_one(make_elf(debug_sections())));                 // (the baseline is made)
    CHECK_FALSE(try_one(make_elf(debug_sections(kDebugId, 1000))));  // under 64 KiB deflated: libdw's inflate is quick
    auto plain = debug_sections();
    for (auto& s : plain) s.compress = false;
    CHECK_FALSE(try_one(make_elf(plain)));                      // nothing compressed
    CHECK_FALSE(try_one(make_elf(debug_sections(), true)));     // a cut zlib stream
    auto elf32 = make_elf(debug_sections());
    elf32[EI_CLASS] = ELFCLASS32;
    CHECK_FALSE(try_one(elf32));
    CHECK_FALSE(try_one(std::vector<uint8_t>(4096, 'x')));      // not an ELF
    auto short_table = make_elf(debug_sections());
    short_table.resize(short_table.size() - 10);                // section headers run off the end
    CHECK_FALSE(try_one(short_table));
}

TEST_CASE("debuginfo cache: an entry per build-id, made once, checked, never half made") {
    ScratchDir dir;
    const fs::path cache = dir.path / "cache";
    const fs::path debug = dir.path / "lib.debug";
    write_file(debug, make_elf(debug_sections()));
    auto count_files = [&] {
        size_t n = 0;
        std::error_code ec;
        for ([[maybe_unused]] const auto& e : fs::directory_iterator(cache, ec)) ++n;
        return n;
    };

    set_debuginfo_cache("", 1);  // off: nothing
    std::string path;
    CHECK(cached_debuginfo_fd(kDebugId, debug, &path) == -1);
    CHECK_FALSE(fs::exists(cache));

    set_debuginfo_cache(cache.string(), 2);
    // A debug file whose own build-id is another: not cached under this one.
    CHECK(cached_debuginfo_fd("ffff" + kDebugId.substr(4), debug, &path) == -1);
    CHECK(count_files() == 0);

    int fd = cached_debuginfo_fd(kDebugId, debug, &path);
    REQUIRE(fd >= 0);
    CHECK(path == (cache / (kDebugId + ".debug")).string());
    CHECK(same(sections_by_libelf(path), sections_by_libelf(debug)));
    struct stat first {};
    ::fstat(fd, &first);
    ::close(fd);
    CHECK(count_files() == 1);  // the entry, no temporary left

    // Made once: with the debug file gone, the entry still answers.
    fs::remove(debug);
    fd = cached_debuginfo_fd(kDebugId, debug, &path);
    REQUIRE(fd >= 0);
    struct stat again {};
    ::fstat(fd, &again);
    CHECK(again.st_ino == first.st_ino);
    ::close(fd);

    // A damaged entry is not used: it is made again from the debug file.
    write_file(path, std::vector<uint8_t>(1000, 0));
    CHECK(cached_debuginfo_fd(kDebugId, debug, &path) == -1);  // (no debug file to remake it from)
    write_file(debug, make_elf(debug_sections()));
    fd = cached_debuginfo_fd(kDebugId, debug, &path);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK(same(sections_by_libelf(path), sections_by_libelf(debug)));

    // A corrupt debug file makes no entry and leaves no temporary behind.
    const std::string other = "aa" + kDebugId.substr(2);
    write_file(debug, make_elf(debug_sections(other), true));
    CHECK(cached_debuginfo_fd(other, debug, &path) == -1);
    CHECK(count_files() == 1);

    // A file size limit under the entry's size (RLIMIT_FSIZE, SIGXFSZ
    // ignored): no entry and no temporary.
    {
        const std::string third = "bb" + kDebugId.substr(2);
        write_file(debug, make_elf(debug_sections(third)));
        struct rlimit old {};
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
        auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = old;
        lim.rlim_cur = 100u << 10;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
        const int refused = cached_debuginfo_fd(third, debug, &path);
        ::setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, old_handler);
        CHECK(refused == -1);
        CHECK(count_files() == 1);
        fd = cached_debuginfo_fd(third, debug, &path);  // and with room, it is made
        CHECK(fd >= 0);
        if (fd >= 0) ::close(fd);
        CHECK(count_files() == 2);
    }

    // A full disk: a 256 KiB tmpfs (as root; the tests run as root in CI).
    // The entry's blocks are allocated before it is written through its
    // mapping, so this is a refusal, not a SIGBUS.
    {
        const fs::path small = dir.path / "small";
        fs::create_directories(small);
        if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=256k") != 0) {
            MESSAGE("not root: the full-disk case is not run");
        } else {
            set_debuginfo_cache(small.string(), 1);
            const std::string fourth = "cc" + kDebugId.substr(2);
            write_file(debug, make_elf(debug_sections(fourth)));
            CHECK(cached_debuginfo_fd(fourth, debug, &path) == -1);
            size_t left = 0;
            for ([[maybe_unused]] const auto& e : fs::directory_iterator(small)) ++left;
            CHECK(left == 0);
            ::umount(small.c_str());
        }
    }

    // An unusable cache directory (a file's path) just means no cache.
    set_debuginfo_cache((dir.path / "lib.debug" / "sub").string(), 1);
    CHECK(cached_debuginfo_fd(other, debug, &path) == -1);
    set_debuginfo_cache("", 1);
}

namespace {

// Sets a file's mtime `age` seconds into the past.
void age_file(const fs::path& p, int64_t age) {
    struct timespec ts[2] {};
    ts[0].tv_sec = ts[1].tv_sec = ::time(nullptr) - age;
    REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, 0) == 0);
}

int64_t mtime_of(const fs::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return static_cast<int64_t>(st.st_mtime);
}

}  // namespace

TEST_CASE("debuginfo cache: pruned to its limit, least recently used first, never the entry just made") {
    ScratchDir dir;
    const fs::path cache = dir.path / "c";
    fs::create_directories(cache);
    const int64_t day = 24 * 3600;
    // Four entries of 100 bytes, a used 4..1 days ago; a file that is not
    // an entry; a temporary left by a crashed run; one being written now.
    const char* names[] = {"a.debug", "b.debug", "c.debug", "d.debug"};
    std::vector<uint8_t> elf(100, 1);
    std::memcpy(elf.data(), "\x7f" "ELF", 4);
    for (int i = 0; i < 4; ++i) {
        write_file(cache / names[i], elf);
        age_file(cache / names[i], (4 - i) * day);
    }
    // Not gilscan's, however named or old: never counted, never removed.
    write_file(cache / "notes.txt", std::vector<uint8_t>(1000, 1));
    write_file(cache / "0123.debug", std::vector<uint8_t>(1000, 1));  // an entry's name, not its header
    write_file(cache / ".bashrc.AbC123", std::vector<uint8_t>(50, 1));
    age_file(cache / "0123.debug", 9 * day);
    age_file(cache / ".bashrc.AbC123", 9 * day);
    write_file(cache / ".dead.debug.AbC123", std::vector<uint8_t>(50, 1));
    age_file(cache / ".dead.debug.AbC123", 2 * 3600);
    write_file(cache / ".beef.debug.XyZ789", std::vector<uint8_t>(70, 1));

    SUBCASE("over the limit: the oldest go, the one to keep stays however old") {
        // 400 bytes of entries, 250 allowed: b and c go (a is kept, d is newest).
        CHECK(prune_debuginfo_cache(cache.string(), 250, "a.debug") == 100 + 100 + 50);
        CHECK(fs::exists(cache / "a.debug"));
        CHECK_FALSE(fs::exists(cache / "b.debug"));
        CHECK_FALSE(fs::exists(cache / "c.debug"));
        CHECK(fs::exists(cache / "d.debug"));
        for (const char* foreign : {"notes.txt", "0123.debug", ".bashrc.AbC123"}) CHECK(fs::exists(cache / foreign));
        CHECK_FALSE(fs::exists(cache / ".dead.debug.AbC123"));
        CHECK(fs::exists(cache / ".beef.debug.XyZ789"));  // may be another run's entry in the making
    }
    SUBCASE("within the limit, or no limit: only the stale temporary goes") {
        CHECK(prune_debuginfo_cache(cache.string(), 400, "") == 50);
        for (const char* n : names) CHECK(fs::exists(cache / n));
        CHECK(prune_debuginfo_cache(cache.string(), 0, "") == 0);
        for (const char* n : names) CHECK(fs::exists(cache / n));
    }
    SUBCASE("a missing directory prunes nothing") {
        CHECK(prune_debuginfo_cache((dir.path / "none").string(), 1, "") == 0);
    }
}

TEST_CASE("debuginfo cache: making an entry applies the limit; using one marks it used") {
    ScratchDir dir;
    const fs::path cache = dir.path / "cache";
    const fs::path debug = dir.path / "lib.debug";
    std::string path;
    const std::string first = "d1" + kDebugId.substr(2), second = "d2" + kDebugId.substr(2);

    // A limit of one byte: every entry made leaves only itself.
    set_debuginfo_cache(cache.string(), 1, 1);
    write_file(debug, make_elf(debug_sections(first)));
    int fd = cached_debuginfo_fd(first, debug, &path);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK(fs::exists(cache / (first + ".debug")));
    write_file(debug, make_elf(debug_sections(second)));
    fd = cached_debuginfo_fd(second, debug, &path);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK_FALSE(fs::exists(cache / (first + ".debug")));
    CHECK(fs::exists(cache / (second + ".debug")));

    // Used: an entry last marked two days ago is marked now; one marked an
    // hour ago is left as it is (no write per run).
    set_debuginfo_cache(cache.string(), 1, 0);
    const fs::path entry = cache / (second + ".debug");
    age_file(entry, 2 * 24 * 3600);
    fd = cached_debuginfo_fd(second, debug, &path);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK(mtime_of(entry) >= ::time(nullptr) - 60);
    age_file(entry, 3600);
    const int64_t marked = mtime_of(entry);
    fd = cached_debuginfo_fd(second, debug, &path);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK(mtime_of(entry) == marked);
    set_debuginfo_cache("", 1);
}

TEST_CASE("debuginfo cache: the limit comes from GILSCAN_CACHE_MAX_MB, else 2 GiB") {
    const char* old = std::getenv("GILSCAN_CACHE_MAX_MB");
    const std::string saved = old ? old : "";
    ::setenv("GILSCAN_CACHE_MAX_MB", "300", 1);
    CHECK(default_debuginfo_cache_limit() == 300ull << 20);
    ::setenv("GILSCAN_CACHE_MAX_MB", "0", 1);
    CHECK(default_debuginfo_cache_limit() == 0);
    ::setenv("GILSCAN_CACHE_MAX_MB", "lots", 1);  // not a number: the default
    CHECK(default_debuginfo_cache_limit() == 2ull << 30);
    ::unsetenv("GILSCAN_CACHE_MAX_MB");
    CHECK(default_debuginfo_cache_limit() == 2ull << 30);
    if (old) ::setenv("GILSCAN_CACHE_MAX_MB", saved.c_str(), 1);
}

TEST_CASE("debuginfo cache: reading the settings never waits for an entry being made") {
    // An entry can take seconds to make (a large debug file inflated) under
    // the cache's lock for making entries; the directory is read meanwhile
    // by each analysis starting (its kernel symbols' cache). Modelled by a
    // debug file that is a FIFO: opening it blocks until a writer comes.
    ScratchDir dir;
    const fs::path cache = dir.path / "cache";
    const fs::path fifo = dir.path / "slow.debug";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    set_debuginfo_cache(cache.string(), 1);
    std::atomic<long> tid{0};
    auto maker = std::async(std::launch::async, [&] {
        tid = ::syscall(SYS_gettid);
        return cached_debuginfo_fd(kDebugId, fifo.string(), nullptr);
    });
    // Until the maker is inside open() (its lock held), as /proc says.
    auto in_open = [&] {
        std::ifstream f("/proc/self/task/" + std::to_string(tid.load()) + "/syscall");
        long nr = -1;
        return tid != 0 && (f >> nr) && nr == SYS_openat;
    };
    for (int i = 0; i < 5000 && !in_open(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(in_open());
    auto reader = std::async(std::launch::async, [] { return debuginfo_cache_dir(); });
    const bool answered = reader.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    // Let the maker go: a FIFO is no ELF file, so no entry.
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    CHECK(w >= 0);
    if (w >= 0) ::close(w);
    CHECK(maker.get() == -1);
    CHECK(answered);
    CHECK(reader.get() == cache.string());
    set_debuginfo_cache("", 1);
}
