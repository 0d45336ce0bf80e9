// Synthetic ELF debug files for tests: sections laid out as a -dbg
// package's, compressed (SHF_COMPRESSED, zlib) or not, with a build-id note.
//
//   write_file(dir / "x.debug", make_elf(debug_sections(kDebugId)));
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <elf.h>
#include <zlib.h>

namespace gilscan::test {

inline const std::string kDebugId = "0123456789abcdef0123456789abcdef01234567";

struct Sec {
    std::string name;
    uint32_t type = SHT_PROGBITS;
    uint64_t flags = 0;
    std::vector<uint8_t> data;  // as it should read once inflated
    bool compress = false;
    uint64_t nobits_size = 0;
    uint64_t align = 1;
};

template <class T>
inline void put(std::vector<uint8_t>& out, const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
}

inline std::vector<uint8_t> deflate(const std::vector<uint8_t>& in) {
    uLongf n = compressBound(in.size());
    std::vector<uint8_t> out(n);
    REQUIRE(compress2(out.data(), &n, in.data(), in.size(), 6) == Z_OK);
    out.resize(n);
    return out;
}

// An ELF64 debug file: headers, one PT_LOAD, the sections in order, then
// the section header table. `corrupt`: a compressed section's stream is cut.
inline std::vector<uint8_t> make_elf(const std::vector<Sec>& secs, bool corrupt = false) {
    std::vector<uint8_t> f(sizeof(Elf64_Ehdr));
    Elf64_Phdr ph{};
    ph.p_type = PT_LOAD;
    ph.p_vaddr = 0x1000;
    ph.p_memsz = 0x2000;
    ph.p_align = 0x1000;
    put(f, ph);
    std::string shstr(1, '\0');
    std::vector<Elf64_Shdr> sh(1);
    for (const Sec& s : secs) {
        Elf64_Shdr h{};
        h.sh_name = static_cast<uint32_t>(shstr.size());
        shstr += s.name + '\0';
        h.sh_type = s.type;
        h.sh_flags = s.flags | (s.compress ? SHF_COMPRESSED : 0);
        h.sh_addralign = s.compress ? 8 : s.align;
        while (f.size() % h.sh_addralign) f.push_back(0);
        h.sh_offset = f.size();
        if (s.type == SHT_NOBITS) {
            h.sh_size = s.nobits_size;
        } else if (s.compress) {
            Elf64_Chdr ch{};
            ch.ch_type = ELFCOMPRESS_ZLIB;
            ch.ch_size = s.data.size();
            ch.ch_addralign = s.align;
            put(f, ch);
            std::vector<uint8_t> z = deflate(s.data);
            if (corrupt) z.resize(z.size() / 2);
            f.insert(f.end(), z.begin(), z.end());
            h.sh_size = f.size() - h.sh_offset;
        } else {
            f.insert(f.end(), s.data.begin(), s.data.end());
            h.sh_size = s.data.size();
        }
        sh.push_back(h);
    }
    Elf64_Shdr strh{};
    strh.sh_name = static_cast<uint32_t>(shstr.size());
    shstr += ".shstrtab";
    shstr += '\0';
    strh.sh_type = SHT_STRTAB;
    strh.sh_offset = f.size();
    strh.sh_size = shstr.size();
    strh.sh_addralign = 1;
    f.insert(f.end(), shstr.begin(), shstr.end());
    sh.push_back(strh);
    while (f.size() % 8) f.push_back(0);
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_type = ET_DYN;
    eh.e_machine = EM_X86_64;
    eh.e_version = EV_CURRENT;
    eh.e_phoff = sizeof(Elf64_Ehdr);
    eh.e_phentsize = sizeof(Elf64_Phdr);
    eh.e_phnum = 1;
    eh.e_shoff = f.size();
    eh.e_ehsize = sizeof(Elf64_Ehdr);
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_shnum = static_cast<uint16_t>(sh.size());
    eh.e_shstrndx = static_cast<uint16_t>(sh.size() - 1);
    for (const auto& h : sh) put(f, h);
    std::memcpy(f.data(), &eh, sizeof eh);
    return f;
}

inline std::vector<uint8_t> build_id_note(const std::string& hex) {
    std::vector<uint8_t> n;
    Elf64_Nhdr h{4, static_cast<uint32_t>(hex.size() / 2), NT_GNU_BUILD_ID};
    put(n, h);
    n.insert(n.end(), {'G', 'N', 'U', 0});
    for (size_t i = 0; i < hex.size(); i += 2) n.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return n;
}

// A debug file like a -dbg package's: a build-id note, two compressed DWARF
// sections (one large, barely compressible, so over the worth-it mark), a
// plain one and a NOBITS one.
inline std::vector<Sec> debug_sections(const std::string& id = kDebugId, size_t info_bytes = 300000) {
    std::mt19937 rng(7);
    std::vector<uint8_t> info(info_bytes);
    for (auto& b : info) b = static_cast<uint8_t>(rng() % 200);
    std::vector<uint8_t> str;
    for (int i = 0; i < 2000; ++i) {
        std::string s = "name_" + std::to_string(i);
        str.insert(str.end(), s.begin(), s.end());
        str.push_back(0);
    }
    return {
        {".note.gnu.build-id", SHT_NOTE, SHF_ALLOC, build_id_note(id), false, 0, 4},
        {".text", SHT_NOBITS, SHF_ALLOC | SHF_EXECINSTR, {}, false, 0x1000, 16},
        {".debug_info", SHT_PROGBITS, 0, info, true, 0, 1},
        {".symtab_like", SHT_PROGBITS, 0, {1, 2, 3, 4, 5, 6, 7, 8, 9}, false, 0, 8},
        {".debug_str", SHT_PROGBITS, SHF_MERGE | SHF_STRINGS, str, true, 0, 1},
    };
}

inline void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
    std::ofstream o(p, std::ios::binary);
    o.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline std::vector<uint8_t> read_file(const std::filesystem::path& p) {
    std::ifstream i(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(i), {});
}

}  // namespace gilscan::test
