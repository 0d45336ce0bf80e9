#include "gilscan/symbols/kallsyms_cache.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gilscan/symbols/aside_file.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/error.h"

namespace gilscan {

namespace {

// An entry: the magic, a byte-order mark (entries are this machine's, in its
// order: another order is a foreign file), the key's four strings (u32 length
// and bytes), _text, _stext, the text's end, the record count and the
// arena's size, then the records and the arena. Nothing follows.
constexpr char kMagic[8] = {'G', 'S', 'K', 'S', 'Y', 'M', '1', '\n'};
constexpr uint64_t kOrder = 0x0102030405060708ull;
constexpr size_t kSymSize = 16;
static_assert(sizeof(KallsymsSym) == kSymSize);

template <class T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_string(std::string& out, std::string_view s) {
    put<uint32_t>(out, static_cast<uint32_t>(s.size()));
    out.append(s);
}

std::string_view get_string(Cursor& c) {
    const uint32_t n = c.read<uint32_t>();
    const Bytes b = c.bytes(n);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// The table in an entry's bytes, or throws Error (caught: a miss).
KallsymsTable parse_entry(Bytes bytes, const std::string& path, const KallsymsKey& key, bool* same_key) {
    Cursor c(bytes, false, &path, 0);
    const Bytes magic = c.bytes(sizeof kMagic);
    if (std::memcmp(magic.data(), kMagic, sizeof kMagic) != 0) c.fail("not a gilscan kallsyms cache entry");
    if (c.read<uint64_t>() != kOrder) c.fail("another byte order");
    const std::string_view build_id = get_string(c), boot_id = get_string(c), modules = get_string(c),
                           first_visible = get_string(c);
    *same_key = build_id == key.build_id && boot_id == key.boot_id && modules == key.modules &&
                first_visible == key.first_visible;
    KallsymsTable t;
    t.text_addr = c.read<uint64_t>();
    t.stext_addr = c.read<uint64_t>();
    t.text_end = c.read<uint64_t>();
    const uint64_t nsyms = c.read<uint64_t>();
    const uint64_t names_len = c.read<uint64_t>();
    c.check_count(nsyms, kSymSize, "symbol");
    t.syms = c.bytes(nsyms * kSymSize).data();
    t.nsyms = static_cast<size_t>(nsyms);
    const Bytes names = c.bytes(names_len);
    if (c.left() != 0) c.fail("bytes after the names");
    t.names = {reinterpret_cast<const char*>(names.data()), names.size()};
    // Every name inside the arena and ended as a line of it; records in
    // address order (KernelSymbols searches them).
    uint64_t last = 0;
    for (size_t i = 0; i < t.nsyms; ++i) {
        const KallsymsSym s = t.sym(i);
        const uint64_t end = uint64_t{s.name} + s.len;
        if (s.len == 0 || end >= t.names.size() || (t.names[end] != '\n' && t.names[end] != '\t'))
            c.fail("symbol " + std::to_string(i) + "'s name is not a line of the arena");
        if (s.addr < last) c.fail("symbols out of address order");
        last = s.addr;
    }
    return t;
}

// "ffffffff81000000 T _text": an address that is not all zeros (zeros are a
// hidden address, or the first per-CPU symbol's offset).
bool visible_line(std::string_view line) {
    const size_t sp = line.find(' ');
    return sp != 0 && sp != std::string_view::npos && line.find_first_not_of('0') < sp;
}

}  // namespace

KallsymsSym KallsymsTable::sym(size_t i) const {
    KallsymsSym s;
    std::memcpy(&s, syms + i * kSymSize, kSymSize);
    return s;
}

std::string kallsyms_first_visible(std::string_view head) {
    for (size_t pos = 0; pos < head.size();) {
        const size_t eol = head.find('\n', pos);
        if (eol == std::string_view::npos) break;  // a line cut by the read: not whole
        const std::string_view line = head.substr(pos, eol - pos);
        pos = eol + 1;
        if (visible_line(line)) return std::string(line);
    }
    return "";
}

bool KallsymsKey::usable() const {
    // first_visible: one line, as kallsyms_first_visible gives it.
    return !build_id.empty() && !boot_id.empty() && first_visible.find('\n') == std::string::npos &&
           visible_line(first_visible);
}

KallsymsEntry::~KallsymsEntry() {
    if (map_) ::munmap(map_, size_);
}

std::string kallsyms_cache_path(const std::string& dir, const std::string& build_id) {
    return dir + "/kallsyms-" + build_id;
}

std::unique_ptr<KallsymsEntry> load_kallsyms_cache(const std::string& dir, const KallsymsKey& key) {
    if (dir.empty() || !key.usable()) return nullptr;
    const std::string path = kallsyms_cache_path(dir, key.build_id);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    void* map = MAP_FAILED;
    size_t size = 0;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        size = static_cast<size_t>(st.st_size);
        // Populated in one call: the records are all read by the checks
        // below, and a fault a page costs more here than the copy.
        map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    }
    ::close(fd);
    if (map == MAP_FAILED) return nullptr;
    auto entry = [&]() -> std::unique_ptr<KallsymsEntry> {
        try {
            bool same = false;
            const KallsymsTable t = parse_entry(Bytes(static_cast<const uint8_t*>(map), size), path, key, &same);
            if (same) return std::make_unique<KallsymsEntry>(map, size, t);
        } catch (const Error&) {
        }
        return nullptr;
    }();
    if (!entry) ::munmap(map, size);
    return entry;
}

bool write_kallsyms_cache(const std::string& dir, const KallsymsKey& key, const KallsymsTable& t) {
    if (dir.empty() || !key.usable() || t.nsyms == 0) return false;
    // Each symbol's line, from its name to the next '\n' (or the end).
    auto line_of = [&](const KallsymsSym& s) {
        size_t eol = t.names.find('\n', s.name + s.len);
        if (eol == std::string_view::npos) eol = t.names.size();
        return t.names.substr(s.name, eol - s.name);
    };
    uint64_t names_len = 0;
    for (size_t i = 0; i < t.nsyms; ++i) {
        const KallsymsSym s = t.sym(i);
        if (uint64_t{s.name} + s.len > t.names.size() || s.len == 0) return false;
        names_len += line_of(s).size() + 1;
    }
    if (names_len > UINT32_MAX) return false;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    AsideFile file(dir, "kallsyms-" + key.build_id);  // kallsyms_cache_path's name, mode 0600
    if (!file.ok()) return false;
    // Streamed through one small buffer: the header, the records with their
    // names' offsets in the compacted arena, then the arena. Built whole in
    // memory, the entry and its pieces would touch thousands of fresh pages.
    std::string out;
    out.reserve(256u << 10);
    bool ok = true;
    auto flush = [&](bool force) {
        if (!force && out.size() < (240u << 10)) return;
        ok = ok && file.write(out);
        out.clear();
    };
    out.append(kMagic, sizeof kMagic);
    put<uint64_t>(out, kOrder);
    for (const std::string* s : {&key.build_id, &key.boot_id, &key.modules, &key.first_visible}) put_string(out, *s);
    put<uint64_t>(out, t.text_addr);
    put<uint64_t>(out, t.stext_addr);
    put<uint64_t>(out, t.text_end);
    put<uint64_t>(out, t.nsyms);
    put<uint64_t>(out, names_len);
    uint32_t at = 0;
    for (size_t i = 0; i < t.nsyms && ok; ++i) {
        const KallsymsSym s = t.sym(i);
        const KallsymsSym c{s.addr, at, s.len};
        out.append(reinterpret_cast<const char*>(&c), kSymSize);
        at += static_cast<uint32_t>(line_of(s).size() + 1);
        flush(false);
    }
    for (size_t i = 0; i < t.nsyms && ok; ++i) {
        out.append(line_of(t.sym(i)));
        out += '\n';
        flush(false);
    }
    flush(true);
    if (!ok || !file.commit()) return false;
    // Other kernels' entries: only this one is of use until the next boot into them.
    const std::string mine = "kallsyms-" + key.build_id;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind("kallsyms-", 0) == 0 && name != mine && is_gilscan_cache_file(dir, name))
            ::unlink(it->path().c_str());
    }
    return true;
}

}  // namespace gilscan
