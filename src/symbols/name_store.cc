#include "gilscan/symbols/name_store.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "gilscan/symbols/aside_file.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/error.h"
#include "gilscan/perfdata/mapped_file.h"

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gilscan {

struct NameStore::Module {
    std::string build_id, key;
    std::unordered_map<uint64_t, StoredName> known;  // from the file; not changed after loading
    std::unordered_map<uint64_t, StoredName> added;  // this run's (under mu_)
    size_t saved = 0;  // of added, written by the last save()
};

namespace {

// A file's first line; bumped whenever what FrameNamer answers changes.
constexpr std::string_view kMagic = "gilscan frame names 1";
// No more answers per module than this (a file grows only by what runs name).
constexpr size_t kMaxNames = 100000;

bool plain(std::string_view s) { return s.find_first_of("\t\n") == std::string_view::npos; }

// FNV-1a over a file's lines before its last, which is "end\t<hash>": a
// file cut, or changed by anything but a store, is not used (a changed
// answer would name frames wrongly without a trace of it).
uint64_t fnv1a(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

}  // namespace

// "path size mtime.ns inode device": a file replaced or rewritten is another
// file. The debuginfo cache's own entry for this build-id ("<id>.debug",
// debuginfo_cache.h) is "path size - inode device": the cache marks an entry
// used by its mtime (once a day), and its content is fixed by the build-id
// (an entry is only ever replaced, by a rename: another inode). With the
// mtime in it, the names of a module whose debug file was inflated there
// were keyed anew, and named by libdw again, at each day's first run.
bool NameStore::append_file_id(std::string& out, const char* path, std::string_view build_id) {
    struct stat st {};
    if (!path || !plain(path) || ::stat(path, &st) != 0) return false;
    const std::string_view p(path);
    const size_t slash = p.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? p : p.substr(slash + 1);
    const bool cache_entry = !build_id.empty() && base.size() == build_id.size() + 6 &&
                             base.substr(0, build_id.size()) == build_id && base.substr(build_id.size()) == ".debug";
    out += path;
    out += ' ';
    out += std::to_string(st.st_size);
    if (cache_entry) {
        out += " -";
    } else {
        out += ' ';
        out += std::to_string(st.st_mtim.tv_sec);
        out += ' ';
        out += std::to_string(st.st_mtim.tv_nsec);
    }
    for (const uint64_t v : {static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)}) {
        out += ' ';
        out += std::to_string(v);
    }
    return true;
}

namespace {

bool parse_hex(std::string_view s, uint64_t& v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v, 16);
    return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Fields of one line, split at tabs.
std::vector<std::string_view> fields(std::string_view line) {
    std::vector<std::string_view> out;
    for (size_t pos = 0;;) {
        const size_t tab = line.find('\t', pos);
        out.push_back(line.substr(pos, tab == std::string_view::npos ? std::string_view::npos : tab - pos));
        if (tab == std::string_view::npos) return out;
        pos = tab + 1;
    }
}

// The answers in a file's text for `key`; false (and nothing kept) when
// the text is not such a file, or another key's.
bool parse(std::string_view text, const std::string& key, std::unordered_map<uint64_t, StoredName>& out) {
    size_t pos = 0;
    auto next_line = [&](std::string_view& line) {
        const size_t eol = text.find('\n', pos);
        if (eol == std::string_view::npos) return false;  // every line ends with '\n': a cut file is not whole
        line = text.substr(pos, eol - pos);
        pos = eol + 1;
        return true;
    };
    // The last line: the hash of all before it.
    if (text.size() < 2 || text.back() != '\n') return false;
    const size_t last = text.rfind('\n', text.size() - 2) + 1;  // npos + 1 = 0: one line only
    uint64_t hash = 0;
    if (text.substr(last, 4) != "end\t" || !parse_hex(text.substr(last + 4, text.size() - 1 - last - 4), hash) ||
        hash != fnv1a(text.substr(0, last)))
        return false;
    text = text.substr(0, last);
    std::string_view line;
    if (!next_line(line) || line != kMagic || !next_line(line) || line != key) return false;
    while (pos < text.size()) {
        if (!next_line(line)) return false;
        // vaddr, 'S' (a symbol) or '-' (none), offset, symbol, inlined names...
        const auto f = fields(line);
        uint64_t vaddr = 0, offset = 0;
        if (f.size() < 4 || !parse_hex(f[0], vaddr) || (f[1] != "S" && f[1] != "-") || !parse_hex(f[2], offset) ||
            out.size() >= kMaxNames)
            return false;
        StoredName n;
        n.has_symbol = f[1] == "S";
        if (n.has_symbol) {
            n.symbol = f[3];
            n.offset = offset;
        } else if (!f[3].empty() || offset != 0) {
            return false;
        }
        for (size_t i = 4; i < f.size(); ++i) n.inlined.emplace_back(f[i]);
        if (!out.emplace(vaddr, std::move(n)).second) return false;  // each address once
    }
    return true;
}

}  // namespace

NameStore::NameStore(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
NameStore::~NameStore() = default;

std::string NameStore::key_of(Dwfl_Module* m) {
    const unsigned char* bits = nullptr;
    GElf_Addr id_vaddr = 0;
    const int n = dwfl_module_build_id(m, &bits, &id_vaddr);
    if (n <= 0) return "";
    Dwarf_Addr bias = 0;
    Dwarf* dw = dwfl_module_getdwarf(m, &bias);  // finds the debug file, as naming would
    if (dw && dwarf_getalt(dw)) return "";  // names partly from a dwz file: not keyed here
    const char *mainfile = nullptr, *debugfile = nullptr;
    dwfl_module_info(m, nullptr, nullptr, nullptr, nullptr, nullptr, &mainfile, &debugfile);
    const std::string id = to_hex(Bytes(bits, static_cast<size_t>(n)));
    std::string key = id + "\t";
    if (!append_file_id(key, mainfile, "")) return "";
    key += '\t';
    if (debugfile && std::string_view(debugfile) != mainfile) {
        if (!append_file_id(key, debugfile, id)) return "";
    } else {
        key += '-';
    }
    key += dw ? "\tdwarf" : "\tno-dwarf";
    return key;
}

NameStore::Module* NameStore::module(Dwfl_Module* m) {
    if (dir_.empty()) return nullptr;
    const std::string key = key_of(m);
    if (key.empty()) return nullptr;
    Dwarf_Addr bias = 0;
    if (!dwfl_module_getelf(m, &bias)) return nullptr;  // find() and add() need it
    std::lock_guard<std::mutex> l(mu_);
    auto& slot = modules_[key];
    if (!slot) {
        slot = std::make_unique<Module>();
        slot->key = key;
        slot->build_id = key.substr(0, key.find('\t'));
        try {
            const std::string path = dir_ + "/names-" + slot->build_id;
            const MappedFile file(path);
            const Bytes b = file.bytes();
            if (parse({reinterpret_cast<const char*>(b.data()), b.size()}, key, slot->known))
                mark_cache_entry_used(path);
            else
                slot->known.clear();
        } catch (const Error&) {
            // none yet, or unreadable: a miss
        }
    }
    return slot.get();
}

const StoredName* NameStore::find(Module& mod, Dwfl_Module* m, uint64_t pc) {
    Dwarf_Addr bias = 0;
    if (!dwfl_module_getelf(m, &bias)) return nullptr;
    const uint64_t vaddr = pc - bias;
    auto it = mod.known.find(vaddr);
    if (it != mod.known.end()) {
        ++hits_;
        return &it->second;
    }
    std::lock_guard<std::mutex> l(mu_);
    auto at = mod.added.find(vaddr);  // named by another thread this run
    if (at == mod.added.end()) {
        ++misses_;
        return nullptr;
    }
    ++hits_;
    return &at->second;  // never changed once added; an unordered_map keeps its elements in place
}

void NameStore::add(Module& mod, Dwfl_Module* m, uint64_t pc, StoredName name) {
    if (!plain(name.symbol)) return;
    for (const auto& s : name.inlined)
        if (!plain(s)) return;
    Dwarf_Addr bias = 0;
    if (!dwfl_module_getelf(m, &bias)) return;
    std::lock_guard<std::mutex> l(mu_);
    if (mod.known.size() + mod.added.size() >= kMaxNames) return;
    mod.added.emplace(pc - bias, std::move(name));
}

bool NameStore::save() {
    std::lock_guard<std::mutex> l(mu_);
    bool ok = true;
    std::error_code ec;
    std::string written;  // the last file written (kept by the pruning)
    for (auto& [key, mod] : modules_) {
        if (mod->added.size() == mod->saved) continue;
        std::vector<std::pair<uint64_t, const StoredName*>> all;
        for (const auto* names : {&mod->known, &mod->added})
            for (const auto& [vaddr, n] : *names) all.emplace_back(vaddr, &n);
        std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::string text(kMagic);
        text += '\n';
        text += key;
        text += '\n';
        char buf[17];
        for (const auto& [vaddr, n] : all) {
            text.append(buf, std::to_chars(buf, buf + sizeof buf, vaddr, 16).ptr);
            text += n->has_symbol ? "\tS\t" : "\t-\t";
            text.append(buf, std::to_chars(buf, buf + sizeof buf, n->has_symbol ? n->offset : 0, 16).ptr);
            text += '\t';
            if (n->has_symbol) text += n->symbol;
            for (const auto& s : n->inlined) {
                text += '\t';
                text += s;
            }
            text += '\n';
        }
        std::filesystem::create_directories(dir_, ec);
        const uint64_t hash = fnv1a(text);
        text += "end\t";
        text.append(buf, std::to_chars(buf, buf + sizeof buf, hash, 16).ptr);
        text += '\n';
        // (known is read without the lock: it stays as loaded.)
        AsideFile file(dir_, "names-" + mod->build_id);
        if (file.write(text) && file.commit()) {
            mod->saved = mod->added.size();
            written = "names-" + mod->build_id;
        } else {
            ok = false;
        }
    }
    // Entries of the cache directory like its debug files: kept under its limit.
    if (!written.empty()) prune_debuginfo_cache(dir_, max_bytes_, written);
    return ok;
}

}  // namespace gilscan
