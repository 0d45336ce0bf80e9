#include "gilscan/symbols/elf_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include <fcntl.h>
#include <lzma.h>
#include <unistd.h>

#include "gilscan/symbols/elf_note.h"

namespace gilscan {

namespace {
constexpr uint32_t SHT_SYMTAB = 2;
constexpr uint32_t SHT_NOTE = 7;
constexpr uint32_t SHT_DYNSYM = 11;
constexpr uint32_t SHN_UNDEF = 0;
constexpr uint32_t NT_GNU_BUILD_ID = 3;

}  // namespace

std::string gnu_build_id_hex(Bytes notes) {
    Cursor nc(notes, false, nullptr, 0);
    while (nc.left() >= 12) {
        uint32_t namesz = nc.read<uint32_t>(), descsz = nc.read<uint32_t>(), type = nc.read<uint32_t>();
        uint64_t nsz = (namesz + 3u) & ~3u, dsz = (descsz + 3u) & ~3u;
        if (nsz > nc.left()) break;
        Bytes name = nc.bytes(nsz);
        if (dsz > nc.left()) break;
        Bytes desc = nc.bytes(dsz);
        if (type == NT_GNU_BUILD_ID && namesz == 4 && std::memcmp(name.data(), "GNU", 4) == 0)
            return to_hex(desc.first(descsz));
    }
    return "";
}

namespace {
// One dot-separated part of a compiler's clone suffix: GCC's .constprop.N,
// .isra.N, .part.N, .cold(.N), .lto_priv.N, .localalias, .clone.N, LLVM's
// .llvm.<digits> and .__uniq.<digits>, chained in any order.
bool clone_word(std::string_view c) {
    static constexpr std::string_view kWords[] = {"constprop", "isra",   "part", "cold",   "lto_priv",
                                                  "localalias", "clone", "llvm", "__uniq", "specialized"};
    return std::find(std::begin(kWords), std::end(kWords), c) != std::end(kWords);
}
bool all_digits(std::string_view c) {
    return !c.empty() && std::all_of(c.begin(), c.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}
// rest (after a dot) is a clone suffix: a clone word first, then words and numbers.
bool clone_suffix(std::string_view rest) {
    bool first = true;
    for (;;) {
        const size_t dot = rest.find('.');
        const std::string_view c = rest.substr(0, dot);
        if (!(clone_word(c) || (!first && all_digits(c)))) return false;
        if (dot == std::string_view::npos) return true;
        rest.remove_prefix(dot + 1);
        first = false;
    }
}
}  // namespace

std::string_view symbol_base_name(std::string_view name) {
    // A symbol version (pthread_cond_timedwait@@GLIBC_2.3.2): '@' or "@@"
    // and a version name. An '@' in anything else (a JIT function's path in
    // perf inject --jit's jitted-*.so) stays.
    if (const size_t at = name.find('@'); at != std::string_view::npos) {
        std::string_view v = name.substr(at + 1);
        if (!v.empty() && v.front() == '@') v.remove_prefix(1);
        if (!v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
                return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
            }))
            name = name.substr(0, at);
    }
    // Only a compiler's clone suffix goes: a dot in anything else is the
    // name's own (Python's JIT frames, "py::Condition.wait:/usr/lib/python3.13/threading.py",
    // which perf inject --jit writes as jitted-*.so symbols, were cut at
    // their first dot).
    for (size_t dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', dot + 1))
        if (clone_suffix(name.substr(dot + 1))) return name.substr(0, dot);
    return name;
}

ElfFile::ElfFile(const std::string& path) : file_(path) { parse(); }

ElfFile::ElfFile(const std::string& name, std::vector<uint8_t> image)
    : image_(std::move(image)), file_(name, Bytes(image_.data(), image_.size())) {
    parse();
}

std::unique_ptr<ElfFile> ElfFile::mini_debuginfo() const {
    const ElfSection* s = section(".gnu_debugdata");
    Bytes b = file_.bytes();
    if (!s || s->offset > b.size() || s->size > b.size() - s->offset) return nullptr;
    lzma_stream strm = LZMA_STREAM_INIT;
    if (lzma_stream_decoder(&strm, UINT64_MAX, 0) != LZMA_OK) return nullptr;
    std::vector<uint8_t> out;
    strm.next_in = b.data() + s->offset;
    strm.avail_in = s->size;
    lzma_ret rc = LZMA_OK;
    while (rc == LZMA_OK) {
        size_t old = out.size();
        if (old > (256u << 20)) break;  // a mini symtab is small: refuse a bomb
        out.resize(old + 65536);
        strm.next_out = out.data() + old;
        strm.avail_out = 65536;
        rc = lzma_code(&strm, LZMA_FINISH);
        out.resize(old + 65536 - strm.avail_out);
    }
    lzma_end(&strm);
    if (rc != LZMA_STREAM_END) return nullptr;
    try {
        return std::make_unique<ElfFile>(path() + "[.gnu_debugdata]", std::move(out));
    } catch (const Error&) {
        return nullptr;
    }
}

void ElfFile::parse() {
    Bytes b = file_.bytes();
    const std::string& p = file_.path();
    if (b.size() < 64 || std::memcmp(b.data(), "\x7f" "ELF", 4) != 0) throw Error(p, 0, "not an ELF file");
    if (b[4] != 2) throw Error(p, 4, "not a 64-bit ELF file");
    if (b[5] != 1) throw Error(p, 5, "not a little-endian ELF file");
    Cursor c(b, false, &p, 0);
    c.skip(16);
    e_type_ = c.read<uint16_t>();
    uint16_t machine = c.read<uint16_t>();
    if (machine != 62) throw Error(p, 18, "not an x86-64 ELF file (e_machine " + std::to_string(machine) + ")");
    c.skip(4 + 8);  // e_version, e_entry
    uint64_t phoff = c.read<uint64_t>();
    uint64_t shoff = c.read<uint64_t>();
    c.skip(4 + 2);  // e_flags, e_ehsize
    uint16_t phentsize = c.read<uint16_t>();
    uint16_t phnum = c.read<uint16_t>();
    uint16_t shentsize = c.read<uint16_t>();
    uint16_t shnum = c.read<uint16_t>();
    uint16_t shstrndx = c.read<uint16_t>();

    if (phnum) {
        if (phentsize < 56) throw Error(p, 54, "bad e_phentsize");
        Cursor pc(b, false, &p, 0);
        pc.seek(static_cast<size_t>(std::min<uint64_t>(phoff, b.size())));
        pc.check_count(phnum, phentsize, "program header");
        for (uint16_t i = 0; i < phnum; ++i) {
            size_t at = pc.pos();
            ElfSegment s;
            s.type = pc.read<uint32_t>();
            s.flags = pc.read<uint32_t>();
            s.offset = pc.read<uint64_t>();
            s.vaddr = pc.read<uint64_t>();
            pc.skip(8);  // p_paddr
            s.filesz = pc.read<uint64_t>();
            s.memsz = pc.read<uint64_t>();
            s.align = pc.read<uint64_t>();
            segments_.push_back(s);
            pc.seek(at + phentsize);
        }
    }
    if (shnum && shoff) {
        if (shentsize < 64) throw Error(p, 58, "bad e_shentsize");
        Cursor sc(b, false, &p, 0);
        sc.seek(static_cast<size_t>(std::min<uint64_t>(shoff, b.size())));
        sc.check_count(shnum, shentsize, "section header");
        std::vector<uint32_t> names;
        for (uint16_t i = 0; i < shnum; ++i) {
            size_t at = sc.pos();
            ElfSection s;
            names.push_back(sc.read<uint32_t>());
            s.type = sc.read<uint32_t>();
            s.flags = sc.read<uint64_t>();
            s.addr = sc.read<uint64_t>();
            s.offset = sc.read<uint64_t>();
            s.size = sc.read<uint64_t>();
            s.link = sc.read<uint32_t>();
            sc.skip(4 + 8);  // sh_info, sh_addralign
            s.entsize = sc.read<uint64_t>();
            sections_.push_back(s);
            sc.seek(at + shentsize);
        }
        if (shstrndx < sections_.size()) {
            const ElfSection strtab = sections_[shstrndx];
            for (size_t i = 0; i < sections_.size(); ++i) sections_[i].name = string_at(strtab, names[i]);
        }
    }
    // Sized once for both tables (libpython's hold 17,000 symbols: grown by
    // doubling, the copies touched 1.3 MB of fresh pages more, each page a fault).
    uint64_t nsyms = 0;
    for (const auto& s : sections_)
        if ((s.type == SHT_SYMTAB || s.type == SHT_DYNSYM) && s.offset <= b.size() && s.size <= b.size() - s.offset)
            nsyms += s.size / 24;
    symbols_.reserve(static_cast<size_t>(nsyms));
    for (const auto& s : sections_) {
        if (s.type == SHT_SYMTAB) {
            read_symbols(s, false);
            has_symtab_ = true;
        } else if (s.type == SHT_DYNSYM) {
            read_symbols(s, true);
        }
    }
    // Build id: from the note sections (or PT_NOTE when sections are gone).
    auto scan_notes = [&](uint64_t off, uint64_t size) {
        if (off > b.size() || size > b.size() - off) return;
        if (build_id_.empty()) build_id_ = gnu_build_id_hex(b.subspan(off, size));
    };
    for (const auto& s : sections_)
        if (s.type == SHT_NOTE) scan_notes(s.offset, s.size);
    for (const auto& s : segments_)
        if (s.type == PT_NOTE && build_id_.empty()) scan_notes(s.offset, s.filesz);
    if (const ElfSection* dl = section(".gnu_debuglink"); dl && dl->offset < b.size()) {
        const char* s = reinterpret_cast<const char*>(b.data() + dl->offset);
        debuglink_ = std::string(s, strnlen(s, std::min<uint64_t>(dl->size, b.size() - dl->offset)));
    }
}

std::string_view ElfFile::string_at(const ElfSection& strtab, uint64_t off) const {
    Bytes b = file_.bytes();
    if (strtab.offset > b.size() || off >= strtab.size || strtab.offset + off >= b.size()) return {};
    const char* s = reinterpret_cast<const char*>(b.data() + strtab.offset + off);
    uint64_t max = std::min<uint64_t>(strtab.size - off, b.size() - strtab.offset - off);
    return std::string_view(s, strnlen(s, max));
}

void ElfFile::read_symbols(const ElfSection& tab, bool dynamic) {
    if (tab.link >= sections_.size()) return;
    const ElfSection strtab = sections_[tab.link];
    Bytes b = file_.bytes();
    if (tab.offset > b.size() || tab.size > b.size() - tab.offset) throw Error(path(), tab.offset, "symbol table outside the file");
    Cursor c(b.subspan(tab.offset, tab.size), false, &file_.path(), tab.offset);
    while (c.left() >= 24) {
        ElfSymbol s;
        uint32_t name = c.read<uint32_t>();
        uint8_t info = c.read<uint8_t>();
        c.skip(1);
        uint16_t shndx = c.read<uint16_t>();
        s.value = c.read<uint64_t>();
        s.size = c.read<uint64_t>();
        s.type = info & 0xf;
        s.bind = info >> 4;
        s.dynamic = dynamic;
        s.defined = shndx != SHN_UNDEF;
        s.name = string_at(strtab, name);
        if (!s.name.empty()) symbols_.push_back(s);
    }
}

std::string_view ElfFile::dynsym_name(uint64_t index) const {
    for (const auto& tab : sections_) {
        if (tab.type != SHT_DYNSYM || tab.link >= sections_.size()) continue;
        Bytes b = file_.bytes();
        uint64_t at = tab.offset + index * 24;
        if (index >= tab.size / 24 || at + 24 > b.size()) return {};
        return string_at(sections_[tab.link], load<uint32_t>(b.data() + at, false));
    }
    return {};
}

const ElfSection* ElfFile::section(std::string_view name) const {
    for (const auto& s : sections_)
        if (s.name == name) return &s;
    return nullptr;
}

const ElfSymbol* ElfFile::find_symbol(std::string_view name) const {
    for (const auto& s : symbols_)
        if (s.defined && s.name == name) return &s;
    return nullptr;
}

std::optional<uint64_t> ElfFile::vaddr_to_offset(uint64_t vaddr) const {
    for (const auto& s : segments_)
        if (s.type == PT_LOAD && vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz) return vaddr - s.vaddr + s.offset;
    return std::nullopt;
}

Bytes ElfFile::bytes_at(uint64_t vaddr, uint64_t n) const {
    for (const auto& s : segments_) {
        if (s.type != PT_LOAD || vaddr < s.vaddr || vaddr - s.vaddr >= s.filesz) continue;
        uint64_t off = vaddr - s.vaddr + s.offset;
        uint64_t avail = s.filesz - (vaddr - s.vaddr);
        Bytes b = file_.bytes();
        if (off >= b.size()) return {};
        return b.subspan(off, std::min({n, avail, b.size() - off}));
    }
    return {};
}

std::vector<uint8_t> ElfFile::code_at(uint64_t vaddr, uint64_t n) const {
    const Bytes mapped = bytes_at(vaddr, n);
    std::vector<uint8_t> out(mapped.begin(), mapped.end());
    const auto off = vaddr_to_offset(vaddr);
    if (!image_.empty() || out.empty() || !off) return out;  // an in-memory image has no probes
    // O_NONBLOCK: the name may since be a FIFO's, whose open() would wait.
    const int fd = ::open(path().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return out;
    size_t got = 0;
    while (got < out.size()) {
        const ssize_t r = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(*off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
    }
    ::close(fd);
    if (got < out.size()) out.assign(mapped.begin(), mapped.end());  // the file changed: what is mapped
    return out;
}

}  // namespace gilscan
