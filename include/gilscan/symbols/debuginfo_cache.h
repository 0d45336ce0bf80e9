// Separate debug files with compressed DWARF, kept inflated in a cache
// directory keyed by build-id (like perf's ~/.debug and debuginfod's cache).
//
//   set_debuginfo_cache(default_debuginfo_cache_dir(), 2);   // main: once
//   // libdwfl's find_debuginfo callback (unwind.cc), before its standard search:
//   std::string path;
//   int fd = cached_debuginfo_fd(id, "/usr/lib/debug/.build-id/93/ac61...debug", &path);  // -1: search as usual
//
// Why: the first time a module's DWARF is used (inline names of a frame),
// libdw's dwarf_begin_elf inflates every compressed .debug_* section of its
// debug file. Debian ships them zlib-compressed: glibc's is 3.8 MB inflating
// to 10 MB, on the thread that first names a frame, while
// at -j 2 the other thread waits for the names too. From the cache, libdw
// maps the inflated file and has nothing to inflate.
//
// A cache entry is the same ELF with each compressed section inflated: the
// ELF and program headers where they were, every section with contents in
// file order (inflated or as is), then the section header table. Only
// ELF64 little-endian files with ELFCOMPRESS_ZLIB sections and a GNU
// build-id are cached; anything else goes to libdw unchanged. Entries are
// written to a temporary file and renamed into place, and are checked
// against the debug file's build-id and expected size before use.
#pragma once

#include <cstdint>
#include <string>

namespace gilscan {

// $GILSCAN_CACHE_MAX_MB in MiB (0: no limit), else 2 GiB: some hundred
// inflated debug files (glibc's is 10 MB, libpython's 20-40 MB).
uint64_t default_debuginfo_cache_limit();

// Bounded: an entry used is marked used (its mtime, at most once a day),
// and whenever an entry is made the least recently used ones are removed
// until the directory holds at most the limit (the one just made stays),
// with temporaries a crashed run left behind (older than an hour).
//
// "" turns the cache off (the default). threads: sections inflated in
// parallel when an entry is made (-j 1: 1). max_bytes: the limit
// (default_debuginfo_cache_limit()), 0: none.
void set_debuginfo_cache(std::string dir, unsigned threads, uint64_t max_bytes = default_debuginfo_cache_limit());
// The directory set_debuginfo_cache last set ("": none). The kernel's
// symbol table is kept there too (kallsyms_cache.h).
std::string debuginfo_cache_dir();
// $GILSCAN_CACHE_DIR, else $XDG_CACHE_HOME/gilscan, else $HOME/.cache/gilscan
// ("" when none is set), plus "/debuginfo".
std::string default_debuginfo_cache_dir();
// The directory of gilscan's entries under a cache root (--cache-dir ROOT,
// $GILSCAN_CACHE_DIR, $XDG_CACHE_HOME, ~/.cache): ROOT/gilscan-cache, a
// directory of gilscan's own, so that pruning never looks at the root's
// other files (--cache-dir ~ leaves a home directory alone).
std::string cache_entries_dir(const std::string& root);
// Whether a file in that directory is one of gilscan's: an entry's name
// ("<hex>.debug", "names-<hex>", "kallsyms-<hex>") whose first bytes are
// that kind's header (ELF, name_store's or kallsyms_cache's magic), or a
// temporary's name (".<entry name>.XXXXXX"). Nothing else is ever removed.
bool is_gilscan_cache_file(const std::string& dir, const std::string& name);

// The cache entry for a build-id (lowercase hex): made from `debug_file`
// (the separate debug file of that build-id) when missing. Returns its fd
// (the caller's to close) and path, or -1: no cache, no such debug file, a
// different build-id, or nothing worth inflating.
int cached_debuginfo_fd(const std::string& build_id_hex, const std::string& debug_file, std::string* entry_path);

// The pieces, for tests. The GNU build-id (hex) of an ELF file, "" if none.
std::string elf_build_id_hex(int fd);
// Writes the inflated copy of `in` to the file `out` (truncated first):
// false when `in` has nothing to inflate or is not an ELF this handles.
bool write_inflated_elf(int in, int out, unsigned threads);
// The limit applied to `dir` now: least recently used entries (by mtime)
// removed until at most max_bytes are left, never `keep` (a file name);
// stale temporaries removed. Returns the bytes removed. Entries are the
// inflated debug files ("<build-id>.debug") and the frame names kept per
// binary ("names-<build-id>", name_store.h); the kernel's symbol table
// (kallsyms_cache.h, one per boot, replaced by the next) and anything else
// are neither counted nor removed.
uint64_t prune_debuginfo_cache(const std::string& dir, uint64_t max_bytes, const std::string& keep);
// Marks the entry at `path` used (its mtime set to now) when it was last
// marked more than a day ago: at most one write a day per entry, and none
// where the cache is read-only.
void mark_cache_entry_used(const std::string& path);

}  // namespace gilscan
