// ElfFile — the parts of an ELF64 x86-64 object gilscan needs: segments,
// sections, symbols (.symtab and .dynsym), the GNU build-id and
// .gnu_debuglink, and file bytes by virtual address.
//
//   ElfFile elf("/usr/bin/python3.11");
//   for (const ElfSymbol& s : elf.symbols()) ...            // both tables
//   std::optional<uint64_t> off = elf.vaddr_to_offset(addr); // for uprobe_events
//   Bytes code = elf.bytes_at(addr, 64);                    // to disassemble
//
// Every field is read through the checked Cursor; a malformed ELF throws
// gilscan::Error naming the file and offset.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/mapped_file.h"

namespace gilscan {

struct ElfSegment {
    uint32_t type = 0, flags = 0;
    uint64_t offset = 0, vaddr = 0, filesz = 0, memsz = 0, align = 0;
};

struct ElfSection {
    std::string_view name;
    uint32_t type = 0, link = 0;
    uint64_t flags = 0, addr = 0, offset = 0, size = 0, entsize = 0;
};

struct ElfSymbol {
    std::string_view name;
    uint64_t value = 0, size = 0;
    uint8_t type = 0;  // STT_FUNC = 2
    uint8_t bind = 0;
    bool dynamic = false;  // from .dynsym (exported)
    bool defined = false;
};

class ElfFile {
public:
    explicit ElfFile(const std::string& path);
    // An ELF image in memory (e.g. decompressed .gnu_debugdata), owned.
    ElfFile(const std::string& name, std::vector<uint8_t> image);

    const std::string& path() const { return file_.path(); }
    uint16_t type() const { return e_type_; }  // 2 = EXEC (non-PIE), 3 = DYN
    const std::vector<ElfSegment>& segments() const { return segments_; }
    const std::vector<ElfSection>& sections() const { return sections_; }
    const ElfSection* section(std::string_view name) const;
    const std::vector<ElfSymbol, PrefaultAllocator<ElfSymbol>>& symbols() const { return symbols_; }
    bool has_symtab() const { return has_symtab_; }
    const ElfSymbol* find_symbol(std::string_view name) const;  // defined, exact name
    // Name of .dynsym entry `index` (relocations refer to symbols by index).
    std::string_view dynsym_name(uint64_t index) const;
    const std::string& build_id() const { return build_id_; }   // hex, empty if none
    const std::string& debuglink() const { return debuglink_; }

    // File offset of a virtual address, through the PT_LOAD that maps it.
    std::optional<uint64_t> vaddr_to_offset(uint64_t vaddr) const;
    // Up to n file bytes starting at vaddr (fewer at the end of the segment).
    Bytes bytes_at(uint64_t vaddr, uint64_t n) const;
    Bytes bytes() const { return file_.bytes(); }
    // The same bytes read from the file (pread), not through the mapping:
    // code to disassemble. While a uprobe on this file is active for every
    // process (perf record -a), the kernel writes its breakpoint (int3)
    // into each mapping of the file that may execute, and a read-only
    // private mapping may (VM_MAYEXEC): through it a probed `ret` reads 0xcc.
    std::vector<uint8_t> code_at(uint64_t vaddr, uint64_t n) const;

    // MiniDebugInfo: the xz-compressed ELF in .gnu_debugdata (Fedora and
    // others keep a small .symtab there), decompressed; nullptr if none.
    std::unique_ptr<ElfFile> mini_debuginfo() const;

private:
    void parse();
    void read_symbols(const ElfSection& tab, bool dynamic);
    std::string_view string_at(const ElfSection& strtab, uint64_t off) const;

    std::vector<uint8_t> image_;  // owned bytes for the in-memory form (before file_)
    MappedFile file_;
    uint16_t e_type_ = 0;
    std::vector<ElfSegment> segments_;
    std::vector<ElfSection> sections_;
    // Sized once (libpython's 16,697 symbols: 650 KB), then filled: its
    // pages prefaulted in one call, not 160 page faults (byte_buffer.h).
    std::vector<ElfSymbol, PrefaultAllocator<ElfSymbol>> symbols_;
    bool has_symtab_ = false;
    std::string build_id_, debuglink_;
};

inline constexpr uint32_t PT_LOAD = 1;
inline constexpr uint32_t PT_NOTE = 4;
inline constexpr uint32_t PF_X = 1;
inline constexpr uint8_t STT_FUNC = 2;
inline constexpr uint8_t STT_GNU_IFUNC = 10;

// "take_gil.lto_priv.0" -> "take_gil"; also .constprop.N, .isra.N, .part.N,
// .cold, .llvm.<hash>.
std::string_view symbol_base_name(std::string_view name);

}  // namespace gilscan
