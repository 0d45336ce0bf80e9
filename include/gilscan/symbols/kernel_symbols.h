// Stage helper (unwinding and symbols): names for the kernel frames of a
// sleep's stack, from this machine's /proc/kallsyms, only when the recording
// was made on this kernel, and moved from the recording's addresses to this
// boot's.
//
//   RecordedKernel rec = recorded_kernel(session.features());  // release, build-id
//   maps.set_kernel_log(rec.maps);        // ProcessMaps keeps the pid -1 MMAPs there
//   KernelSymbols ks(rec, cache_dir);     // reads /proc/kallsyms (or its cache) if it is this kernel
//   ... session.run(...) ...
//   std::string n = ks.name(ip, rec.maps->layout());  // "__schedule+0x2f3 ([kernel])"
//
// Why both checks: two machines (or two builds) can report the same release
// with different symbols, so the kernel's build-id (HEADER_BUILD_ID's
// "[kernel.kallsyms]" entry against /sys/kernel/notes) decides when the
// recording has one; and the same kernel lays itself out anew at every boot
// (KASLR), and loads its modules wherever there is room, so an archived
// recording's addresses are not this boot's. perf writes, before any sample,
// a pid -1 MMAP "[kernel.kallsyms]_text" whose pgoff is the address _text had
// then (the reference relocation symbol, tools/perf/util/synthetic-events.c)
// and one per module at its base: the differences to this boot's _text and
// /proc/modules bases move each address, as perf's own report does.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/features.h"
#include "gilscan/symbols/kallsyms_cache.h"
#include "gilscan/perfdata/kernel_records.h"

namespace gilscan {

// The recording's kernel maps (pid -1 MMAP records).
struct KernelLayout {
    std::string reloc_symbol;  // "_text" of "[kernel.kallsyms]_text" (older perf: "_stext")
    uint64_t reloc_addr = 0;   // its address in the recording (the map's pgoff)
    uint64_t text_start = 0, text_end = 0;  // the kernel image's map; end 0: none recorded
    struct Module {
        std::string name;  // as /proc/modules names it: "nf_tables" for .../nf-tables.ko.xz or "[nf_tables]"
        uint64_t start = 0, end = 0;
    };
    std::vector<Module> modules;  // by start
    bool recorded() const { return text_end != 0; }
};

// Filled by the decoding threads' ProcessMaps (two at -j 2: the same records
// with the same values, so adding twice changes nothing) and read when the
// first kernel frame is named, after the synthesized maps at the recording's
// start.
class KernelMapsLog {
public:
    void add(const MmapEvent& e);
    KernelLayout layout() const;

private:
    mutable std::mutex mu_;
    KernelLayout layout_;
};

// The module name of a kernel map's file name ("" when it is not a module).
std::string kernel_module_name(std::string_view filename);

struct RecordedKernel {
    RecordedKernel() = default;
    // Known by its release only (tests; recordings without build-ids).
    RecordedKernel(std::string release_) : release(std::move(release_)) {}  // NOLINT: implicit on purpose
    RecordedKernel(const char* release_) : release(release_) {}             // NOLINT
    std::string release;
    std::string build_id;  // hex; "" when the recording has none for the kernel
    std::shared_ptr<KernelMapsLog> maps = std::make_shared<KernelMapsLog>();
};
RecordedKernel recorded_kernel(const Features& f);

// This machine's kernel build-id (the GNU build-id note of /sys/kernel/notes),
// hex; "" when unreadable.
std::string running_kernel_build_id();
// The build-id note in an ELF notes blob (the format of /sys/kernel/notes).
std::string build_id_of_notes(std::string_view notes);

// What of /proc/modules places the modules' symbols, for the cache's key:
// "name size refs deps state 0xbase [flags]" lines -> "name size 0xbase\n"
// (the users and the state change as modules are used).
std::string kallsyms_modules_key(std::string_view proc_modules);

class KernelSymbols {
public:
    // This machine's /proc/kallsyms and /proc/modules, read only when the
    // recording's kernel is this one: the same build-id when the recording
    // has the kernel's, else the same release. Otherwise empty (addresses).
    // cache_dir: where this boot's table is kept between runs
    // (kallsyms_cache.h), "" for none. Text symbols of BPF programs and of
    // ftrace and kprobe trampolines are left out (they come and go within a
    // boot): such frames are named by their address.
    explicit KernelSymbols(const RecordedKernel& rec, const std::string& cache_dir = "");
    // From their texts as read (tests): KernelSymbols(KernelSymbols::texts, kallsyms, modules).
    struct Texts {};
    static constexpr Texts texts{};
    KernelSymbols(Texts, std::string kallsyms, std::string_view proc_modules);

    // A recorded kernel address's name, "schedule+0x2a ([kernel])", or
    // "0xffffffffc0a01234 ([kernel])" / "... ([nf_tables])" when it cannot be
    // named on this boot. Addresses in the image's map move by the
    // difference of the reference symbol; in a module's, by the difference
    // of the module's base; others (no maps recorded) are named as they are
    // only when the image did not move.
    std::string name(uint64_t addr, const KernelLayout& recorded) const;
    // An address of this boot's kernel.
    std::string name(uint64_t addr) const;

    // Where the table came from (tests): not this kernel, /proc/kallsyms
    // (and then written to the cache, or not), or the cache.
    enum class Source { none, proc, proc_cached, cache };
    Source source() const { return source_; }
    size_t size() const { return table_.nsyms; }

private:
    void read_kallsyms();
    void parse_kallsyms();
    void parse_modules(std::string_view text);
    KallsymsTable table_;  // a view of syms_ and text_, or of the cache entry
    // Both a few MB, filled once: on huge pages, unfilled (fewer page faults than
    // 4 KiB pages, each zeroed first).
    std::vector<KallsymsSym, HugeUninitAllocator<KallsymsSym>> syms_;
    std::vector<char, HugeUninitAllocator<char>> text_;  // /proc/kallsyms as read
    std::unique_ptr<KallsymsEntry> entry_;
    std::vector<std::pair<std::string, uint64_t>> module_bases_;  // /proc/modules, by name
    Source source_ = Source::none;
};

}  // namespace gilscan
