#include "gilscan/symbols/debuginfo_cache.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ctime>
#include <unistd.h>
#include <zlib.h>

#include "gilscan/symbols/elf_note.h"

namespace gilscan {

namespace {

// Below this much deflated DWARF, libdw's own inflate is quick enough.
constexpr uint64_t kWorthFrom = 64u << 10;
// No debug section of a real binary comes near these.
constexpr uint64_t kMaxSection = 1ull << 30;
constexpr uint64_t kMaxTotal = 4ull << 30;

// The settings have a lock of their own: an entry can take seconds to make
// (a large debug file inflated), and only another entry need wait for that,
// not a reader of the settings (KernelSymbols' cache directory).
std::mutex g_mu;  // the settings
std::mutex g_make_mu;  // one entry looked up or made at a time per process
std::string g_dir;
unsigned g_threads = 1;
uint64_t g_max_bytes = 0;

// An entry's mtime says when it was last used, to the day: marking it on
// every run would be a write per run for nothing.
constexpr int64_t kMarkUsedAfter = 24 * 3600;
// A temporary this old belongs to no running gilscan (an entry takes seconds).
constexpr int64_t kStaleTemporary = 3600;

// A read-only mapping of a whole file, with its ELF and section headers
// copied out (memcpy: never cast in place) after bounds checks.
struct MappedElf {
    const uint8_t* p = nullptr;
    uint64_t size = 0;
    Elf64_Ehdr eh{};
    std::vector<Elf64_Shdr> sh;
    bool ok = false;

    explicit MappedElf(int fd) {
        struct stat st {};
        if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr)))
            return;
        size = static_cast<uint64_t>(st.st_size);
        void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) return;
        p = static_cast<const uint8_t*>(m);
        std::memcpy(&eh, p, sizeof eh);
        if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
            eh.e_ident[EI_DATA] != ELFDATA2LSB || std::endian::native != std::endian::little ||
            eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||  // 0: extended numbering, or none
            eh.e_shoff > size || (size - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
            return;
        sh.resize(eh.e_shnum);
        std::memcpy(sh.data(), p + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
        ok = true;
    }
    ~MappedElf() {
        if (p) ::munmap(const_cast<uint8_t*>(p), size);
    }
    MappedElf(const MappedElf&) = delete;
    MappedElf& operator=(const MappedElf&) = delete;
    bool in_file(uint64_t off, uint64_t n) const { return off <= size && n <= size - off; }
};

uint64_t align_up(uint64_t v, uint64_t a) { return a > 1 ? (v + a - 1) / a * a : v; }

// Where each section goes in the copy.
struct Layout {
    struct Piece {
        size_t index;                   // section
        uint64_t in_off, in_size;       // in the debug file (deflated bytes after the Elf64_Chdr)
        uint64_t out_off, out_size;
        uint64_t align;                 // ch_addralign of an inflated section
        bool inflate;
    };
    std::vector<Piece> pieces;
    uint64_t head = 0;       // ELF and program headers, copied as they are
    uint64_t shoff = 0, out_size = 0;
};

bool plan(const MappedElf& in, Layout& lay) {
    const Elf64_Ehdr& eh = in.eh;
    lay.head = sizeof(Elf64_Ehdr);
    if (eh.e_phnum) {
        if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff > in.size ||
            (in.size - eh.e_phoff) / sizeof(Elf64_Phdr) < eh.e_phnum)
            return false;
        lay.head = std::max<uint64_t>(lay.head, eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr));
    }
    std::vector<size_t> order;
    for (size_t i = 1; i < in.sh.size(); ++i)
        if (in.sh[i].sh_type != SHT_NOBITS && in.sh[i].sh_size) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return in.sh[a].sh_offset < in.sh[b].sh_offset; });
    uint64_t at = lay.head, deflated = 0;
    for (size_t i : order) {
        const Elf64_Shdr& s = in.sh[i];
        if (!in.in_file(s.sh_offset, s.sh_size)) return false;
        Layout::Piece piece{i, s.sh_offset, s.sh_size, 0, s.sh_size, s.sh_addralign, false};
        if (s.sh_flags & SHF_COMPRESSED) {
            Elf64_Chdr ch;
            if (s.sh_size < sizeof ch) return false;
            std::memcpy(&ch, in.p + s.sh_offset, sizeof ch);
            if (ch.ch_type != ELFCOMPRESS_ZLIB || ch.ch_size > kMaxSection) return false;  // zstd etc.: libdw's business
            piece = {i, s.sh_offset + sizeof ch, s.sh_size - sizeof ch, 0, ch.ch_size, ch.ch_addralign, true};
            deflated += s.sh_size;
        }
        piece.out_off = align_up(at, std::clamp<uint64_t>(piece.align, 1, 4096));
        at = piece.out_off + piece.out_size;
        lay.pieces.push_back(piece);
    }
    if (deflated < kWorthFrom) return false;
    lay.shoff = align_up(at, 8);
    lay.out_size = lay.shoff + in.sh.size() * sizeof(Elf64_Shdr);
    return lay.out_size <= kMaxTotal;
}

bool inflate_one(const uint8_t* in, uint64_t in_size, uint8_t* out, uint64_t out_size) {
    // zlib counts in uInt; sections are below kMaxSection (1 GiB), one piece each.
    if (in_size > kMaxSection || out_size > kMaxSection) return false;
    z_stream z{};
    if (inflateInit(&z) != Z_OK) return false;
    z.next_in = const_cast<Bytef*>(in);
    z.avail_in = static_cast<uInt>(in_size);
    z.next_out = out;
    z.avail_out = static_cast<uInt>(out_size);
    const bool ok = inflate(&z, Z_FINISH) == Z_STREAM_END && z.total_out == out_size;
    inflateEnd(&z);
    return ok;
}

// Fills `out` (a file of lay.out_size bytes, mapped shared) from `in`.
bool fill(const MappedElf& in, const Layout& lay, int out_fd, unsigned threads) {
    // The blocks are allocated up front: a write through the mapping to a
    // disk that turns out to be full would be a SIGBUS, not an error.
    if (::ftruncate(out_fd, 0) != 0 || ::posix_fallocate(out_fd, 0, static_cast<off_t>(lay.out_size)) != 0)
        return false;
    void* m = ::mmap(nullptr, lay.out_size, PROT_READ | PROT_WRITE, MAP_SHARED, out_fd, 0);
    if (m == MAP_FAILED) return false;
    auto* out = static_cast<uint8_t*>(m);
    std::memcpy(out, in.p, lay.head);
    // Inflated sections, largest first, each to the less loaded thread;
    // the others are copied here.
    std::vector<const Layout::Piece*> big;
    for (const auto& pc : lay.pieces) {
        if (pc.inflate) big.push_back(&pc);
        else std::memcpy(out + pc.out_off, in.p + pc.in_off, pc.out_size);
    }
    std::sort(big.begin(), big.end(), [](auto* a, auto* b) { return a->out_size > b->out_size; });
    const size_t n = std::clamp<size_t>(threads, 1, big.size());
    std::vector<std::vector<const Layout::Piece*>> share(n);
    std::vector<uint64_t> load(n, 0);
    for (const auto* pc : big) {
        const size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        share[t].push_back(pc);
        load[t] += pc->out_size;
    }
    std::vector<char> ok(n, 1);
    auto run = [&](size_t t) {
        for (const auto* pc : share[t])
            if (!inflate_one(in.p + pc->in_off, pc->in_size, out + pc->out_off, pc->out_size)) ok[t] = 0;
    };
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < n; ++t) helpers.emplace_back(run, t);
    run(0);
    for (auto& h : helpers) h.join();
    std::vector<Elf64_Shdr> sh = in.sh;
    for (const auto& pc : lay.pieces) {
        Elf64_Shdr& h = sh[pc.index];
        h.sh_offset = pc.out_off;
        if (!pc.inflate) continue;
        h.sh_size = pc.out_size;
        h.sh_flags &= ~static_cast<uint64_t>(SHF_COMPRESSED);
        h.sh_addralign = pc.align;
    }
    std::memcpy(out + lay.shoff, sh.data(), sh.size() * sizeof(Elf64_Shdr));
    Elf64_Ehdr eh = in.eh;
    eh.e_shoff = lay.shoff;
    std::memcpy(out, &eh, sizeof eh);
    ::munmap(m, lay.out_size);
    return std::find(ok.begin(), ok.end(), 0) == ok.end();  // a corrupt stream: libdw reports it its own way
}

std::string build_id(const MappedElf& in) {
    for (const Elf64_Shdr& s : in.sh) {
        if (s.sh_type != SHT_NOTE || (s.sh_flags & SHF_COMPRESSED) || !in.in_file(s.sh_offset, s.sh_size)) continue;
        std::string id = gnu_build_id_hex(Bytes(in.p + s.sh_offset, s.sh_size));
        if (!id.empty()) return id;
    }
    return "";
}

// The entry at `path` when it is whole: its own build-id note says `id`,
// its section headers and every section's contents lie inside the file,
// and nothing is left compressed. (Entries are renamed into place only once
// written, so a partial one is not expected; this catches foreign files.)
int open_entry(const std::string& path, const std::string& id) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    MappedElf e(fd);
    bool ok = e.ok && build_id(e) == id;
    for (size_t i = 1; ok && i < e.sh.size(); ++i) {
        const Elf64_Shdr& s = e.sh[i];
        ok = !(s.sh_flags & SHF_COMPRESSED) && (s.sh_type == SHT_NOBITS || e.in_file(s.sh_offset, s.sh_size));
    }
    if (ok) return fd;
    ::close(fd);
    return -1;
}

int make_entry(const MappedElf& in, const Layout& lay, const std::string& dir, const std::string& path,
               const std::string& id, unsigned threads) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::string tmp = dir + "/." + id + ".XXXXXX";
    const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (fd < 0) return -1;
    if (!fill(in, lay, fd, threads) || ::fchmod(fd, 0644) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
        ::unlink(tmp.c_str());
        ::close(fd);
        return -1;
    }
    return fd;  // still the entry's file after the rename
}

}  // namespace

void set_debuginfo_cache(std::string dir, unsigned threads, uint64_t max_bytes) {
    std::lock_guard<std::mutex> l(g_mu);
    g_dir = std::move(dir);
    g_threads = std::max(1u, threads);
    g_max_bytes = max_bytes;
}

std::string debuginfo_cache_dir() {
    std::lock_guard<std::mutex> l(g_mu);
    return g_dir;
}

uint64_t default_debuginfo_cache_limit() {
    const char* v = std::getenv("GILSCAN_CACHE_MAX_MB");
    if (v && *v) {
        char* end = nullptr;
        const unsigned long long mb = std::strtoull(v, &end, 10);
        if (end && *end == '\0' && mb < (1ull << 40)) return mb << 20;
    }
    return 2ull << 30;
}

namespace {
bool all_hex(std::string_view id) {
    return !id.empty() && id.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// The header each kind of entry starts with ("" for an unknown name).
std::string_view entry_header(std::string_view name) {
    constexpr std::string_view kDebug = ".debug";
    if (name.size() > kDebug.size() && name.ends_with(kDebug) && all_hex(name.substr(0, name.size() - kDebug.size())))
        return "\x7f" "ELF";
    if (name.starts_with("names-") && all_hex(name.substr(6))) return "gilscan frame names 1\n";  // name_store.cc's kMagic
    if (name.starts_with("kallsyms-") && all_hex(name.substr(9))) return "GSKSYM1\n";  // kallsyms_cache.cc's kMagic
    return {};
}

bool starts_with_bytes(const std::string& path, std::string_view head) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return false;
    std::string got(head.size(), '\0');
    const ssize_t n = ::pread(fd, got.data(), got.size(), 0);
    ::close(fd);
    return n == static_cast<ssize_t>(head.size()) && got == head;
}
}  // namespace

bool is_gilscan_cache_file(const std::string& dir, const std::string& name) {
    std::string_view n = name;
    if (n.size() > 8 && n.front() == '.' && n[n.size() - 7] == '.') {  // ".<entry>.XXXXXX" (mkostemp)
        return !entry_header(n.substr(1, n.size() - 8)).empty();
    }
    const std::string_view head = entry_header(n);
    return !head.empty() && starts_with_bytes(dir + "/" + name, head);
}

std::string cache_entries_dir(const std::string& root) { return root.empty() ? "" : root + "/gilscan-cache"; }

void mark_cache_entry_used(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && static_cast<int64_t>(::time(nullptr)) - st.st_mtime > kMarkUsedAfter)
        ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // fails on a read-only cache: left as it is
}

uint64_t prune_debuginfo_cache(const std::string& dir, uint64_t max_bytes, const std::string& keep) {
    namespace fs = std::filesystem;
    struct Entry {
        fs::path path;
        uint64_t size;
        int64_t mtime;
    };
    std::vector<Entry> entries;
    uint64_t total = 0, removed = 0;
    const int64_t now = static_cast<int64_t>(::time(nullptr));
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        struct stat st {};
        if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (!is_gilscan_cache_file(dir, name)) continue;  // not ours: never counted, never removed
        const auto size = static_cast<uint64_t>(st.st_size);
        if (name.front() == '.') {
            // A temporary; only a stale one (a run killed meanwhile) is removed.
            if (now - static_cast<int64_t>(st.st_mtime) > kStaleTemporary && ::unlink(it->path().c_str()) == 0)
                removed += size;
            continue;
        }
        total += size;
        if (name != keep) entries.push_back({it->path(), size, static_cast<int64_t>(st.st_mtime)});
    }
    if (max_bytes == 0 || total <= max_bytes) return removed;
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.mtime < b.mtime; });
    for (const Entry& e : entries) {
        if (total <= max_bytes) break;
        // Another gilscan may have this entry open: unlinking is safe for it
        // (its fd stays valid), and the next run makes the entry again.
        if (::unlink(e.path.c_str()) == 0) {
            total -= e.size;
            removed += e.size;
        }
    }
    return removed;
}

std::string default_debuginfo_cache_dir() {
    auto env = [](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v ? v : "");
    };
    std::string root = env("GILSCAN_CACHE_DIR");
    if (root.empty()) root = env("XDG_CACHE_HOME");
    if (root.empty() && !env("HOME").empty()) root = env("HOME") + "/.cache";
    return cache_entries_dir(root);
}

std::string elf_build_id_hex(int fd) {
    MappedElf in(fd);
    return in.ok ? build_id(in) : "";
}

bool write_inflated_elf(int in_fd, int out_fd, unsigned threads) {
    MappedElf in(in_fd);
    Layout lay;
    return in.ok && plan(in, lay) && fill(in, lay, out_fd, threads);
}

int cached_debuginfo_fd(const std::string& id, const std::string& debug_file, std::string* entry_path) {
    std::lock_guard<std::mutex> make(g_make_mu);  // a second Dwfl asking waits for the first's entry
    std::string dir;
    unsigned threads;
    uint64_t max_bytes;
    {
        std::lock_guard<std::mutex> l(g_mu);
        dir = g_dir;
        threads = g_threads;
        max_bytes = g_max_bytes;
    }
    if (dir.empty() || id.empty() || id.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
    const std::string path = dir + "/" + id + ".debug";
    int entry = open_entry(path, id);
    if (entry >= 0) {
        mark_cache_entry_used(path);
    } else {
        const int fd = ::open(debug_file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        MappedElf in(fd);
        Layout lay;
        // Only the debug file of this build-id, and only one worth inflating.
        if (in.ok && build_id(in) == id && plan(in, lay)) entry = make_entry(in, lay, dir, path, id, threads);
        ::close(fd);
        if (entry < 0) return -1;  // no cache (read-only disk, ...): libdw inflates as before
        prune_debuginfo_cache(dir, max_bytes, id + ".debug");
    }
    if (entry_path) *entry_path = path;
    return entry;
}

}  // namespace gilscan
