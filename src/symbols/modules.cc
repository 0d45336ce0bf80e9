#include "gilscan/symbols/modules.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "gilscan/symbols/elf_note.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/py2_gil.h"

namespace gilscan {

namespace fs = std::filesystem;

std::optional<uint64_t> Module::bias_for(const Mapping& m) const {
    if (!elf) return std::nullopt;
    // The PT_LOAD whose file range holds pgoff; `start - pgoff` alone is
    // wrong when a linker lays out p_vaddr != p_offset.
    for (const auto& s : elf->segments()) {
        if (s.type != PT_LOAD) continue;
        uint64_t seg_begin = s.offset & ~uint64_t{0xfff};
        if (m.pgoff >= seg_begin && m.pgoff < s.offset + std::max<uint64_t>(s.filesz, 1))
            return m.start - m.pgoff - (s.vaddr - s.offset);
    }
    return std::nullopt;
}

namespace {

const AddrRange* range_holding(const std::vector<AddrRange>& ranges, uint64_t v) {
    for (const auto& r : ranges)
        if (v >= r.begin && v < r.end) return &r;
    return nullptr;
}

}  // namespace

const AddrRange* Module::in_take(uint64_t v) const { return range_holding(take, v); }
const AddrRange* Module::in_drop(uint64_t v) const { return range_holding(drop, v); }
const AddrRange* Module::in_py2_lock(uint64_t v) const { return range_holding(py2_lock, v); }
const AddrRange* Module::in_py2_gil_caller(uint64_t v) const { return range_holding(py2_gil_callers, v); }

ModuleCache::ModuleCache(ModuleOptions opt) : opt_(std::move(opt)), perf_maps_(opt_.perf_maps) {
    perf_maps_.set_owner(opt_.perf_map_owner);
    if (opt_.home_debug.empty()) {
        const char* home = std::getenv("HOME");
        opt_.home_debug = std::string(home ? home : "/root") + "/.debug";
    }
}

namespace {

// Separate symbols for a stripped binary: /usr/lib/debug/.build-id, the
// .gnu_debuglink name in the usual places, then MiniDebugInfo.
std::unique_ptr<ElfFile> debug_symbols(const ElfFile& elf, const std::string& symfs) {
    std::vector<std::string> c;
    const std::string& id = elf.build_id();
    if (id.size() > 2) {
        c.push_back(build_id_debug_path(id, symfs));
        if (!symfs.empty()) c.push_back(build_id_debug_path(id));
    }
    if (!elf.debuglink().empty()) {
        std::string dir = fs::path(elf.path()).parent_path().string();
        c.push_back(dir + "/" + elf.debuglink());
        c.push_back(dir + "/.debug/" + elf.debuglink());
        c.push_back(symfs + "/usr/lib/debug" + dir + "/" + elf.debuglink());
    }
    for (const auto& p : c) {
        std::error_code ec;
        if (p == elf.path() || !fs::is_regular_file(p, ec)) continue;
        try {
            auto d = std::make_unique<ElfFile>(p);
            if (d->has_symtab() && (id.empty() || d->build_id().empty() || d->build_id() == id)) return d;
        } catch (const Error&) {
        }
    }
    auto mini = elf.mini_debuginfo();
    if (mini && mini->has_symtab()) return mini;
    return nullptr;
}

void add_symbol_ranges(Module& mod, const ElfFile& elf) {
    // Every piece of take_gil / drop_gil, clones and .cold parts included.
    for (const auto& s : elf.symbols()) {
        if (s.dynamic || !s.defined || s.type != STT_FUNC || !s.value || !s.size) continue;
        std::string_view base = symbol_base_name(s.name);
        if (base == "take_gil") mod.take.push_back({s.value, s.value + s.size, std::string(s.name)});
        if (base == "drop_gil") mod.drop.push_back({s.value, s.value + s.size, std::string(s.name)});
    }
}

void add_ranges(Module& mod, const std::string& symfs) {
    ElfFile& elf = *mod.elf;
    add_symbol_ranges(mod, elf);
    if (!mod.take.empty()) return;
    if (auto dbg = debug_symbols(elf, symfs)) {
        add_symbol_ranges(mod, *dbg);
        if (!mod.take.empty()) {
            mod.symbols_from = dbg->path();
            return;
        }
    }
    // Python 2: no take_gil anywhere, so no locator search. The functions
    // are exported, so their extents are in .dynsym even when stripped.
    if (is_python2(elf)) {
        for (const auto& [b, e] : function_parts(elf, "PyThread_acquire_lock"))
            mod.py2_lock.push_back({b, e, "PyThread_acquire_lock"});
        for (std::string_view fn : kPy2GilTakers)
            for (const auto& [b, e] : function_parts(elf, fn)) mod.py2_gil_callers.push_back({b, e, std::string(fn)});
        return;
    }
    // Stripped: the locator's answer, inlined copies included.
    GilLocation loc = locate_gil(elf);
    for (const auto& f : loc.take) mod.take.push_back({f.vaddr, f.vaddr + std::max<uint64_t>(f.size, 1), f.name});
    for (const auto& f : loc.drop) {
        // drop_gil inlined into PyEval_SaveThread: that whole function is the drop.
        mod.drop.push_back({f.vaddr, f.vaddr + std::max<uint64_t>(f.size, 1), f.name});
    }
}

}  // namespace

std::unique_ptr<Module> ModuleCache::load(const Mapping& m, const std::string& want_id) {
    auto mod = std::make_unique<Module>();
    mod->path = m.path;
    std::vector<std::string> candidates;
    // As perf's --symfs: with it, the recorded path is looked for only under it.
    candidates.push_back(opt_.symfs.empty() ? m.path : opt_.symfs + m.path);
    if (!want_id.empty()) {
        if (!opt_.symfs.empty()) candidates.push_back(opt_.symfs + m.path + "/" + want_id + "/elf");
        candidates.push_back(opt_.home_debug + m.path + "/" + want_id + "/elf");
        candidates.push_back(opt_.home_debug + "/.build-id/" + want_id.substr(0, 2) + "/" + want_id.substr(2) + "/elf");
        if (!opt_.symfs.empty())
            candidates.push_back(opt_.symfs + "/.build-id/" + want_id.substr(0, 2) + "/" + want_id.substr(2) + "/elf");
    }
    std::string mismatch;
    for (const auto& c : candidates) {
        std::error_code ec;
        if (!fs::is_regular_file(c, ec)) continue;
        try {
            auto elf = std::make_unique<ElfFile>(c);
            if (!want_id.empty() && elf->build_id() != want_id) {
                if (mismatch.empty()) mismatch = c + " has build-id " + elf->build_id();
                continue;
            }
            mod->file = c;
            mod->build_id = elf->build_id();
            mod->elf = std::move(elf);
            break;
        } catch (const Error&) {
            continue;
        }
    }
    if (!mod->elf) {
        mod->problem = mismatch.empty() ? "not found" : "changed since the recording (" + mismatch + ", recorded " + want_id + ")";
        return mod;
    }
    const ElfSymbol* rt = mod->elf->find_symbol("PyEval_RestoreThread");
    mod->python = rt && rt->dynamic && rt->defined;
    if (mod->python) add_ranges(*mod, opt_.symfs);
    return mod;
}

bool names_a_file(std::string_view p) {
    // A jitdump's marker (jit-PID.dump, mapped executable so that perf
    // records where the dump is) holds no code: loaded as a module it was
    // "cannot unwind through /tmp/jit-PID.dump: not found".
    return !p.empty() && p[0] == '/' && p.rfind("//", 0) != 0 && p.rfind("/memfd:", 0) != 0 && p.rfind("/SYSV", 0) != 0 &&
           p.rfind("/dev/", 0) != 0 && !is_jitdump_path(p);
}

bool ModuleCache::key_of(const Mapping& m, std::string_view& want, std::string_view& key, bool& by_id) const {
    if (!names_a_file(m.path)) return false;
    want = m.build_id;
    if (want.empty()) {
        auto it = opt_.build_ids.find(m.path);
        if (it != opt_.build_ids.end()) want = it->second;
    }
    by_id = !want.empty();
    key = by_id ? want : std::string_view(m.path);
    return true;
}

const Module* ModuleCache::get(const Mapping& m) {
    std::string_view want, key;
    bool by_id;
    if (!key_of(m, want, key, by_id)) return nullptr;
    auto& table = by_id ? by_id_ : by_path_;
    {
        std::shared_lock<std::shared_mutex> l(mu_);
        auto it = table.find(key);
        if (it != table.end()) return it->second->elf ? it->second.get() : nullptr;
    }
    std::unique_lock<std::shared_mutex> l(mu_);
    auto it = table.find(key);  // another thread may have loaded it meanwhile
    if (it == table.end()) {
        auto& ahead = by_id ? ahead_by_id_ : ahead_by_path_;
        std::unique_ptr<Module> mod;
        if (auto a = ahead.find(key); a != ahead.end()) {
            mod = std::move(a->second);
            ahead.erase(a);
        } else {
            mod = load(m, std::string(want));
        }
        if (!mod->problem.empty()) problems_.push_back(m.path + ": " + mod->problem);
        it = table.emplace(std::string(key), std::move(mod)).first;
    }
    return it->second->elf ? it->second.get() : nullptr;
}

bool ModuleCache::preload(const Mapping& m) {
    std::string_view want, key;
    bool by_id;
    if (!key_of(m, want, key, by_id)) return false;
    auto& table = by_id ? by_id_ : by_path_;
    auto& ahead = by_id ? ahead_by_id_ : ahead_by_path_;
    {
        std::shared_lock<std::shared_mutex> l(mu_);
        if (table.count(key) || ahead.count(key)) return false;
    }
    // Loaded without the lock: get() of other modules goes on meanwhile (and
    // one of this module loads it again; the first one in is kept).
    auto mod = load(m, std::string(want));
    std::unique_lock<std::shared_mutex> l(mu_);
    if (table.count(key) || ahead.count(key)) return false;
    ahead.emplace(std::string(key), std::move(mod));
    return true;
}

size_t ModuleCache::preloaded_unused() const {
    std::shared_lock<std::shared_mutex> l(mu_);
    return ahead_by_id_.size() + ahead_by_path_.size();
}

std::vector<std::string> ModuleCache::problems() const {
    std::shared_lock<std::shared_mutex> l(mu_);
    return problems_;
}

}  // namespace gilscan
