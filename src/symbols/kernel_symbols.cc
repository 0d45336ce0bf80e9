#include "gilscan/symbols/kernel_symbols.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/symbols/frame_names.h"

namespace gilscan {

namespace {

// A /proc or /sys file read whole (their sizes read as 0 or 4096: read until
// EOF) into any resizable byte buffer, starting with `first` bytes of room
// and doubling whenever less than `room` is left; or its first read only
// (once: the kernel formats as much of /proc/kallsyms as is asked for).
template <class Buffer>
void read_proc_into(const char* path, Buffer& text, size_t first, size_t room, bool once = false) {
    text.clear();
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    text.resize(first);
    size_t have = 0;
    for (;;) {
        if (text.size() - have < room) text.resize(std::max(text.size() * 2, have + room));
        const ssize_t n = ::read(fd, text.data() + have, once ? first : text.size() - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += static_cast<size_t>(n);
        if (once) break;
    }
    ::close(fd);
    text.resize(have);
}

std::string read_proc(const char* path, size_t size, bool once = false) {
    std::string text;
    read_proc_into(path, text, size, size, once);
    return text;
}

}  // namespace

std::string kernel_module_name(std::string_view f) {
    // "[nf_tables]" (perf without the module's path), or the path of its
    // file, "/lib/modules/6.1.0-13-amd64/kernel/net/netfilter/nf_tables.ko"
    // (also .ko.xz, .ko.zst, .ko.gz). The kernel names modules with '_'
    // where file names may have '-'.
    const size_t slash = f.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? f : f.substr(slash + 1);
    std::string name;
    if (base.size() > 2 && base.front() == '[' && base.back() == ']') {
        name = base.substr(1, base.size() - 2);
        if (name.rfind("kernel.kallsyms", 0) == 0 || name.rfind("guest.kernel", 0) == 0 || name == "vdso" ||
            name == "vsyscall")
            return "";
    } else {
        const size_t ko = base.find(".ko");
        if (ko == std::string_view::npos || ko == 0 ||
            (ko + 3 != base.size() && base[ko + 3] != '.'))  // "x.ko" or "x.ko.xz", not "x.kobj"
            return "";
        name = base.substr(0, ko);
    }
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
}

void KernelMapsLog::add(const MmapEvent& e) {
    if (e.pid != -1 || e.len == 0) return;  // -1: the host kernel's maps (0 would be a guest's)
    std::lock_guard<std::mutex> l(mu_);
    constexpr std::string_view kImage = "[kernel.kallsyms]";
    if (e.filename.substr(0, kImage.size()) == kImage) {
        if (layout_.recorded()) return;  // the first: x86's extra maps for PTI trampolines come later
        layout_.reloc_symbol = std::string(e.filename.substr(kImage.size()));
        layout_.reloc_addr = e.pgoff;
        layout_.text_start = e.start;
        layout_.text_end = e.start + e.len;
        return;
    }
    std::string name = kernel_module_name(e.filename);
    if (name.empty()) return;
    auto& mods = layout_.modules;
    auto at = std::lower_bound(mods.begin(), mods.end(), e.start,
                               [](const KernelLayout::Module& m, uint64_t s) { return m.start < s; });
    if (at != mods.end() && at->start == e.start) return;  // the same map from the other decoding thread
    mods.insert(at, KernelLayout::Module{std::move(name), e.start, e.start + e.len});
}

KernelLayout KernelMapsLog::layout() const {
    std::lock_guard<std::mutex> l(mu_);
    return layout_;
}

RecordedKernel recorded_kernel(const Features& f) {
    RecordedKernel rec(f.os_release);
    for (const auto& b : f.build_ids)
        if (b.filename == "[kernel.kallsyms]" && b.pid == -1) rec.build_id = to_hex(b.build_id);
    return rec;
}

std::string build_id_of_notes(std::string_view notes) {
    // Elf_Nhdr records: namesz, descsz, type (host order), then the name
    // and the descriptor, each padded to 4 bytes.
    constexpr uint32_t NT_GNU_BUILD_ID = 3;
    size_t at = 0;
    while (notes.size() - at >= 12) {
        uint32_t namesz, descsz, type;
        std::memcpy(&namesz, notes.data() + at, 4);
        std::memcpy(&descsz, notes.data() + at + 4, 4);
        std::memcpy(&type, notes.data() + at + 8, 4);
        at += 12;
        const size_t name_pad = (static_cast<size_t>(namesz) + 3) & ~size_t{3};
        const size_t desc_pad = (static_cast<size_t>(descsz) + 3) & ~size_t{3};
        if (name_pad > notes.size() - at || desc_pad > notes.size() - at - name_pad) break;
        const std::string_view name = notes.substr(at, namesz);
        if (type == NT_GNU_BUILD_ID && name == std::string_view("GNU\0", 4) && descsz > 0)
            return to_hex(Bytes(reinterpret_cast<const uint8_t*>(notes.data() + at + name_pad), descsz));
        at += name_pad + desc_pad;
    }
    return "";
}

std::string running_kernel_build_id() { return build_id_of_notes(read_proc("/sys/kernel/notes", 4096)); }

std::string kallsyms_modules_key(std::string_view text) {
    std::string key;
    for (size_t pos = 0; pos < text.size();) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string_view::npos) eol = text.size();
        const std::string_view line = text.substr(pos, eol - pos);
        pos = eol + 1;
        const size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
        const size_t addr_at = line.rfind(" 0x");
        if (sp2 == std::string_view::npos || addr_at == std::string_view::npos) continue;
        std::string_view addr = line.substr(addr_at + 1);
        addr = addr.substr(0, addr.find(' '));
        key.append(line.substr(0, sp2)).append(" ").append(addr).append("\n");
    }
    return key;
}

KernelSymbols::KernelSymbols(const RecordedKernel& rec, const std::string& cache_dir) {
    const std::string running = running_kernel_build_id();
    if (!rec.build_id.empty()) {
        // A build-id says more than a release: two builds can share one.
        if (rec.build_id != running) return;
    } else {
        struct utsname u {};
        if (rec.release.empty() || ::uname(&u) != 0 || rec.release != u.release) return;
    }
    const std::string modules = read_proc("/proc/modules", 64u << 10);
    parse_modules(modules);
    KallsymsKey key;
    if (!cache_dir.empty() && !running.empty()) {
        key.build_id = running;
        key.boot_id = read_proc("/proc/sys/kernel/random/boot_id", 64);
        key.modules = kallsyms_modules_key(modules);
        // A head only (the kernel formats as much as is asked for): before
        // the image's symbols older kernels list some hundred per-CPU ones.
        key.first_visible = kallsyms_first_visible(read_proc("/proc/kallsyms", 4096, /*once=*/true));
        entry_ = load_kallsyms_cache(cache_dir, key);
        if (entry_) {
            table_ = entry_->table();
            source_ = Source::cache;
            return;
        }
    }
    // About 120k lines, 5 MB: read in large blocks and indexed in place (the
    // text is the name arena). A string per symbol and a sort by name made
    // this take 100+ ms; the kernel's own formatting takes about 30.
    read_kallsyms();
    parse_kallsyms();
    source_ = write_kallsyms_cache(cache_dir, key, table_) ? Source::proc_cached : Source::proc;
}

void KernelSymbols::read_kallsyms() {
    // One buffer sized for it up front (a few MB), on huge pages
    // and not zeroed: faulting it in page by page costs more than reading it.
    read_proc_into("/proc/kallsyms", text_, 8u << 20, 256u << 10);
}

KernelSymbols::KernelSymbols(Texts, std::string kallsyms, std::string_view proc_modules)
    : text_(kallsyms.begin(), kallsyms.end()) {
    parse_kallsyms();
    parse_modules(proc_modules);
    source_ = Source::proc;
}

void KernelSymbols::parse_kallsyms() {
    syms_.reserve(text_.size() / 40);
    uint64_t text_addr = 0, stext_addr = 0, etext = 0, einittext = 0;
    const char* base = text_.data();
    const char* p = base;
    const char* end = p + text_.size();
    while (p < end) {
        const char* eol = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
        if (!eol) eol = end;
        // "ffffffff81000000 T _stext" (optionally "\t[module]")
        const char* sp = static_cast<const char*>(std::memchr(p, ' ', static_cast<size_t>(eol - p)));
        if (sp && eol - sp > 3) {
            const char type = sp[1];
            uint64_t addr = 0;
            for (const char* h = p; h < sp; ++h) {
                const char c = *h;
                addr = addr << 4 | static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            }
            // addr 0: kptr_restrict hides them
            if (addr != 0 && (type == 't' || type == 'T' || type == 'w' || type == 'W')) {
                const char* name = sp + 3;
                const char* name_end = static_cast<const char*>(std::memchr(name, '\t', static_cast<size_t>(eol - name)));
                if (!name_end) name_end = eol;
                // BPF programs ("\t[bpf]") and ftrace or kprobe trampolines
                // ("\t[__builtin__ftrace]", "\t[__builtin__kprobes]") are
                // listed after the modules (kernel/kallsyms.c) and come and go
                // without /proc/modules changing: left out, so that a cached
                // table names what a fresh one does.
                const std::string_view tag(name_end, static_cast<size_t>(eol - name_end));
                const bool dynamic = tag == "\t[bpf]" || tag.rfind("\t[__builtin__", 0) == 0;
                if (!dynamic && name_end > name)
                    syms_.push_back({addr, static_cast<uint32_t>(name - base), static_cast<uint32_t>(name_end - name)});
                const std::string_view n(name, static_cast<size_t>(name_end - name));
                if (n == "_text" && !text_addr) text_addr = addr;
                if (n == "_stext" && !stext_addr) stext_addr = addr;
                if (n == "_etext" && !etext) etext = addr;
                if (n == "_einittext" && !einittext) einittext = addr;
            }
        }
        p = eol + 1;
    }
    // The kernel's own symbols come in address order, modules' after them.
    auto by_addr = [](const KallsymsSym& a, const KallsymsSym& b) { return a.addr < b.addr; };
    if (!std::is_sorted(syms_.begin(), syms_.end(), by_addr)) std::stable_sort(syms_.begin(), syms_.end(), by_addr);
    table_.names = std::string_view(text_.data(), text_.size());
    table_.syms = reinterpret_cast<const unsigned char*>(syms_.data());
    table_.nsyms = syms_.size();
    table_.text_addr = text_addr;
    table_.stext_addr = stext_addr;
    table_.text_end = std::max(etext, einittext);
}

void KernelSymbols::parse_modules(std::string_view text) {
    // "nf_tables 352256 583 nft_chain_nat, Live 0xffffffffc0a5b000" (the
    // address 0 when kptr_restrict hides it, and then unusable).
    for (size_t pos = 0; pos < text.size();) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string_view::npos) eol = text.size();
        const std::string_view line = text.substr(pos, eol - pos);
        pos = eol + 1;
        const size_t sp = line.find(' ');
        const size_t addr_at = line.rfind(" 0x");
        if (sp == std::string_view::npos || addr_at == std::string_view::npos) continue;
        std::string_view addr = line.substr(addr_at + 3);  // after " 0x"
        addr = addr.substr(0, addr.find(' '));
        uint64_t a = 0;
        const auto r = std::from_chars(addr.data(), addr.data() + addr.size(), a, 16);
        if (r.ec == std::errc() && r.ptr == addr.data() + addr.size() && a != 0)
            module_bases_.emplace_back(std::string(line.substr(0, sp)), a);
    }
    std::sort(module_bases_.begin(), module_bases_.end());
}

std::string KernelSymbols::name(uint64_t addr) const {
    // The last symbol at or below addr; of several at that address, the
    // greatest name (an order that does not depend on how they are listed).
    const KallsymsTable& t = table_;
    size_t lo = 0, hi = t.nsyms;  // the first symbol above addr, by bisection
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (t.sym(mid).addr <= addr) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return unnamed_frame_text(addr, "[kernel]");
    const KallsymsSym at = t.sym(lo - 1);
    const std::string_view text = t.names;
    // Past the image's text, in no module's symbols (a BPF program, a
    // trampoline, memory since freed): its last symbol would name it with
    // an offset of megabytes.
    const bool in_module = at.name + at.len < text.size() && text[at.name + at.len] == '\t';
    if (!in_module && t.text_end && addr >= t.text_end) return unnamed_frame_text(addr, "[kernel]");
    std::string_view best = text.substr(at.name, at.len);
    for (size_t e = lo - 1; e > 0 && t.sym(e - 1).addr == at.addr; --e) {
        const KallsymsSym s = t.sym(e - 1);
        best = std::max(best, text.substr(s.name, s.len));
    }
    // A module's symbol is listed as "name\t[module]": named after its
    // module, as perf does, the kernel's own after "[kernel]".
    std::string_view where = "[kernel]";
    const size_t after = static_cast<size_t>(best.data() - text.data()) + best.size();
    if (after + 2 < text.size() && text[after] == '\t' && text[after + 1] == '[') {
        const size_t close = text.find(']', after + 2);
        if (close != std::string_view::npos && close < text.find('\n', after)) where = text.substr(after + 1, close - after);
    }
    return frame_text(best, addr - at.addr, where);
}

std::string KernelSymbols::name(uint64_t addr, const KernelLayout& rec) const {
    if (table_.nsyms == 0) return name(addr);  // not this kernel: the address alone
    if (!rec.recorded()) return name(addr);  // nothing to move by (perf does the same)
    // The image's own shift: where the reference symbol is on this boot
    // (perf's are _text, or _stext before it; 0: none to move by).
    const uint64_t here = rec.reloc_symbol == "_text" ? table_.text_addr : rec.reloc_symbol == "_stext" ? table_.stext_addr : 0;
    if (addr >= rec.text_start && addr < rec.text_end) {
        if (!here) return unnamed_frame_text(addr, "[kernel]");
        return name(addr - rec.reloc_addr + here);
    }
    auto m = std::upper_bound(rec.modules.begin(), rec.modules.end(), addr,
                              [](uint64_t a, const KernelLayout::Module& x) { return a < x.start; });
    if (m != rec.modules.begin() && addr < std::prev(m)->end) {
        const KernelLayout::Module& mod = *std::prev(m);
        auto b = std::lower_bound(module_bases_.begin(), module_bases_.end(), mod.name,
                                  [](const std::pair<std::string, uint64_t>& x, const std::string& n) { return x.first < n; });
        if (b == module_bases_.end() || b->first != mod.name) return unnamed_frame_text(addr, "[" + mod.name + "]");
        return name(addr - mod.start + b->second);
    }
    // Outside every recorded map (BPF programs, a module loaded during the
    // recording): as it is, if the image did not move.
    if (here && here == rec.reloc_addr) return name(addr);
    return unnamed_frame_text(addr, "[kernel]");
}

}  // namespace gilscan
