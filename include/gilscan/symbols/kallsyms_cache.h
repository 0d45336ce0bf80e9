// Stage helper (unwinding and symbols): this boot's kernel text symbols kept
// on disk, so that only the first run after a boot reads /proc/kallsyms.
//
//   KallsymsKey key{running_build_id, boot_id, modules, kallsyms_first_visible(head)};
//   if (auto hit = load_kallsyms_cache(dir, key)) {
//       const KallsymsTable& t = hit->table();       // symbols by address, names
//   } else {
//       KallsymsTable t = ...;                        // parsed from /proc/kallsyms
//       write_kallsyms_cache(dir, key, t);            // for the next run
//   }
//
// Why: reading /proc/kallsyms is costly (the kernel formats 120k lines, 5 MB, each first touch of the buffer a
// page fault), more than the whole analysis of a small recording; -j 1
// waits for it, -j 2 runs it beside its two threads on two cores. The
// table it yields is fixed for a boot as long as the same modules sit at
// the same bases. The entry is the parsed table itself (the symbols'
// records and a names arena), mapped and checked, not parsed again.
//
// When an entry is used: the same kernel build (GNU build-id), the same
// boot (/proc/sys/kernel/random/boot_id: KASLR lays the image out anew at
// each), the same modules at the same bases and sizes (/proc/modules), and
// the same first line of /proc/kallsyms with an address other than 0 (that
// there is one shows that this process may see kernel addresses:
// kptr_restrict shows them all as 0).
// Symbols that come and go within a boot without /proc/modules changing
// (BPF programs, ftrace and kprobe trampolines) are in neither the cached
// nor the read table (kernel_symbols.cc), so both name frames alike.
//
// One entry per kernel build, "kallsyms-<build-id>", mode 0600 (kernel
// addresses are what kptr_restrict hides from other users); writing one
// removes the entries of other builds. Written aside and renamed into
// place; a malformed or foreign entry is a miss, never an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gilscan {

// One text symbol: its address and its name in the names arena, which
// holds "name" or "name\t[module]" then '\n' (/proc/kallsyms's own form).
struct KallsymsSym {
    uint64_t addr;
    uint32_t name, len;
};

// A view of a symbol table: records by address (memcpy'd out: they may sit
// in a mapping at any alignment), names, this boot's _text and _stext, and
// where the image's text ends (_einittext, else _etext; 0: not listed).
struct KallsymsTable {
    std::string_view names;
    const unsigned char* syms = nullptr;  // nsyms KallsymsSym records
    size_t nsyms = 0;
    uint64_t text_addr = 0, stext_addr = 0, text_end = 0;

    KallsymsSym sym(size_t i) const;
};

struct KallsymsKey {
    std::string build_id;    // the running kernel's, hex
    std::string boot_id;     // /proc/sys/kernel/random/boot_id
    std::string modules;     // "name size base" per loaded module
    std::string first_visible;  // /proc/kallsyms's first line with an address not 0, now
    // Enough to tell this boot's table from any other: a build-id and a
    // boot, and kernel addresses visible (first_visible found).
    bool usable() const;
};

// The first line of a head of /proc/kallsyms whose address is not 0, "" if
// none. Kernels before 6.8 or so list the per-CPU symbols first, at
// offsets from 0 ("0000000000000000 A fixed_percpu_data"); with
// kptr_restrict every address reads 0.
std::string kallsyms_first_visible(std::string_view head);

// A cache entry mapped read-only; its table points into the mapping.
class KallsymsEntry {
public:
    KallsymsEntry(void* map, size_t size, const KallsymsTable& t) : map_(map), size_(size), table_(t) {}
    ~KallsymsEntry();
    KallsymsEntry(const KallsymsEntry&) = delete;
    KallsymsEntry& operator=(const KallsymsEntry&) = delete;
    const KallsymsTable& table() const { return table_; }

private:
    void* map_;
    size_t size_;
    KallsymsTable table_;
};

std::string kallsyms_cache_path(const std::string& dir, const std::string& build_id);

// The entry for `key` in dir, or null: none, another boot or modules, or
// not a whole, well-formed entry (every record's name inside the arena,
// records in address order).
std::unique_ptr<KallsymsEntry> load_kallsyms_cache(const std::string& dir, const KallsymsKey& key);

// Writes `t` (names: any text in which each symbol's line runs from its
// name to the next '\n', such as /proc/kallsyms itself) as the entry for
// `key`, compacting the names. False when nothing was written (key not
// usable, no symbols, the directory not writable).
bool write_kallsyms_cache(const std::string& dir, const KallsymsKey& key, const KallsymsTable& t);

}  // namespace gilscan
