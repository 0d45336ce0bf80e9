#include "gilscan/symbols/gil_locator.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <set>

#include <dlfcn.h>

#include <capstone/capstone.h>

#include "gilscan/symbols/release_sites.h"

namespace gilscan {

namespace {

// libcapstone is loaded when first needed (a stripped Python's GIL is being
// located), not linked: its 1.3 MB of relocated tables would cost every gilscan
// process hundreds of page faults at start-up, for a library most runs never
// call. The soname is the major version of the headers built
// against, so the structures (cs_insn, cs_detail) match.
#define GILSCAN_STR2(x) #x
#define GILSCAN_STR(x) GILSCAN_STR2(x)
constexpr const char* kCapstoneSoname = "libcapstone.so." GILSCAN_STR(CS_API_MAJOR);

struct CapstoneLib {
    decltype(&::cs_open) open = nullptr;
    decltype(&::cs_option) option = nullptr;
    decltype(&::cs_close) close = nullptr;
    decltype(&::cs_disasm) disasm = nullptr;
    decltype(&::cs_free) free = nullptr;
    std::string error;  // why it is not loaded (dlerror), for the locator's notes
    CapstoneLib() {
        void* so = ::dlopen(kCapstoneSoname, RTLD_NOW | RTLD_LOCAL);
        if (!so) {
            const char* e = ::dlerror();
            error = e ? e : "dlopen failed";
            return;
        }
        open = reinterpret_cast<decltype(open)>(::dlsym(so, "cs_open"));
        option = reinterpret_cast<decltype(option)>(::dlsym(so, "cs_option"));
        close = reinterpret_cast<decltype(close)>(::dlsym(so, "cs_close"));
        disasm = reinterpret_cast<decltype(disasm)>(::dlsym(so, "cs_disasm"));
        free = reinterpret_cast<decltype(free)>(::dlsym(so, "cs_free"));
        if (!open || !option || !close || !disasm || !free) {
            open = nullptr;
            error = std::string(kCapstoneSoname) + " lacks a cs_* function";
        }
    }
};

// Loaded once per process (thread-safe: a function-local static); never unloaded.
const CapstoneLib& capstone_lib() {
    static const CapstoneLib lib;
    return lib;
}

struct Capstone {
    const CapstoneLib& lib = capstone_lib();
    csh h = 0;
    Capstone() {
        if (!lib.open) return;
        if (lib.open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) h = 0;
        if (h) lib.option(h, CS_OPT_DETAIL, CS_OPT_ON);
    }
    ~Capstone() {
        if (h) lib.close(&h);
    }
    size_t disasm(Bytes code, uint64_t address, cs_insn** insn) const {
        return lib.disasm(h, code.data(), code.size(), address, 0, insn);
    }
    void free(cs_insn* insn, size_t n) const { lib.free(insn, n); }
};

bool exported_function(const ElfFile& elf, uint64_t addr) {
    for (const auto& s : elf.symbols())
        if (s.dynamic && s.defined && s.value == addr && (s.type == STT_FUNC || s.type == STT_GNU_IFUNC)) return true;
    return false;
}

std::string exported_name(const ElfFile& elf, uint64_t addr) {
    for (const auto& s : elf.symbols())
        if (s.dynamic && s.defined && s.value == addr) return std::string(s.name);
    return {};
}

struct Extent {
    uint64_t start, end;
};

Extent extent_of(const ElfFile& elf, uint64_t start) {
    if (auto r = fde_range(elf, start); r && r->first <= start && start < r->second) return {start, r->second};
    for (const auto& s : elf.symbols())
        if (s.defined && s.value == start && s.size) return {start, start + s.size};
    return {start, start + 2048};
}

bool has_any(const std::vector<std::string>& imports, std::initializer_list<const char*> names) {
    for (const auto& i : imports)
        for (const char* n : names)
            if (i == n) return true;
    return false;
}

struct Found {
    uint64_t addr = 0;
    std::set<std::string> roots;
    int depth = 99;
};

// Breadth-first over direct calls from the roots; returns every function
// whose body matches `signature`, with the roots that reach it.
std::vector<Found> search(const ElfFile& elf, const std::vector<std::pair<std::string, uint64_t>>& roots, int max_depth,
                          const std::map<uint64_t, std::string>& plt,
                          const std::function<bool(const CallScan&)>& signature) {
    std::map<uint64_t, Found> found;
    std::map<uint64_t, CallScan> scans;
    for (const auto& [root_name, root] : roots) {
        std::set<uint64_t> seen{root};
        std::deque<std::pair<uint64_t, int>> q{{root, 0}};
        while (!q.empty()) {
            auto [f, depth] = q.front();
            q.pop_front();
            auto it = scans.find(f);
            if (it == scans.end()) {
                Extent e = extent_of(elf, f);
                it = scans.emplace(f, scan_calls(elf, e.start, e.end, plt)).first;
            }
            if (signature(it->second)) {
                Found& fd = found[f];
                fd.addr = f;
                fd.roots.insert(root_name);
                fd.depth = std::min(fd.depth, depth);
                continue;  // do not look past the function that waits
            }
            if (depth == max_depth) continue;
            for (uint64_t t : it->second.targets)
                if (!plt.count(t) && seen.insert(t).second) q.emplace_back(t, depth + 1);
        }
    }
    std::vector<Found> out;
    for (auto& [a, f] : found) out.push_back(f);
    std::sort(out.begin(), out.end(), [](const Found& a, const Found& b) {
        if (a.roots.size() != b.roots.size()) return a.roots.size() > b.roots.size();
        if (a.depth != b.depth) return a.depth > b.depth;  // deeper = the helper, not a caller that inlined less
        return a.addr < b.addr;
    });
    return out;
}

std::vector<std::pair<std::string, uint64_t>> roots_of(const ElfFile& elf, std::initializer_list<const char*> names) {
    std::vector<std::pair<std::string, uint64_t>> r;
    for (const char* n : names)
        if (const uint64_t a = exported_address(elf, n)) r.emplace_back(n, a);
    return r;
}

std::string join(const std::set<std::string>& s) {
    std::string out;
    for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
    return out;
}

}  // namespace

std::map<uint64_t, std::string> plt_stub_names(const ElfFile& elf) {
    std::map<uint64_t, std::string> out;
    // GOT slot -> imported name, from .rela.plt (R_X86_64_JUMP_SLOT).
    std::map<uint64_t, std::string> slot_names;
    if (const ElfSection* rela = elf.section(".rela.plt")) {
        Bytes b = elf.bytes();
        if (rela->offset <= b.size() && rela->size <= b.size() - rela->offset) {
            Cursor c(b.subspan(rela->offset, rela->size), false, &elf.path(), rela->offset);
            while (c.left() >= 24) {
                uint64_t off = c.read<uint64_t>();
                uint64_t info = c.read<uint64_t>();
                c.skip(8);
                std::string_view n = elf.dynsym_name(info >> 32);
                if (!n.empty()) slot_names[off] = std::string(n);
            }
        }
    }
    Capstone cs;
    if (!cs.h) return out;
    for (const char* name : {".plt", ".plt.sec", ".plt.got"}) {
        const ElfSection* sec = elf.section(name);
        if (!sec || !sec->addr) continue;
        const std::vector<uint8_t> code = elf.code_at(sec->addr, sec->size);
        cs_insn* insn = nullptr;
        size_t n = cs.disasm(Bytes(code.data(), code.size()), sec->addr, &insn);
        for (size_t i = 0; i < n; ++i) {
            if (insn[i].id != X86_INS_JMP || !insn[i].detail || insn[i].detail->x86.op_count != 1) continue;
            const cs_x86_op& op = insn[i].detail->x86.operands[0];
            if (op.type != X86_OP_MEM || op.mem.base != X86_REG_RIP) continue;
            uint64_t slot = insn[i].address + insn[i].size + static_cast<uint64_t>(op.mem.disp);
            auto it = slot_names.find(slot);
            if (it != slot_names.end()) out[insn[i].address & ~uint64_t{15}] = it->second;
        }
        if (n) cs.free(insn, n);
    }
    return out;
}

CallScan scan_calls(const ElfFile& elf, uint64_t start, uint64_t end, const std::map<uint64_t, std::string>& plt) {
    CallScan out;
    Capstone cs;
    if (!cs.h || end <= start) return out;
    const std::vector<uint8_t> code = elf.code_at(start, end - start);
    cs_insn* insn = nullptr;
    size_t n = cs.disasm(Bytes(code.data(), code.size()), start, &insn);
    for (size_t i = 0; i < n; ++i) {
        const bool call = insn[i].id == X86_INS_CALL, jmp = insn[i].id == X86_INS_JMP;
        if (insn[i].id == X86_INS_RET) out.rets.push_back(insn[i].address);
        if (!call && !jmp && insn[i].detail) {  // a conditional jump: only where it may land
            const cs_detail& d = *insn[i].detail;
            if (std::find(d.groups, d.groups + d.groups_count, CS_GRP_JUMP) != d.groups + d.groups_count &&
                d.x86.op_count == 1 && d.x86.operands[0].type == X86_OP_IMM) {
                const auto target = static_cast<uint64_t>(d.x86.operands[0].imm);
                out.branch_targets.push_back(target);
                if (target < start || target >= end) out.far_branches.emplace_back(insn[i].address, target);
            }
            continue;
        }
        if ((!call && !jmp) || !insn[i].detail || insn[i].detail->x86.op_count != 1) {
            if (jmp) out.indirect_jumps.push_back(insn[i].address);
            continue;
        }
        const cs_x86_op& op = insn[i].detail->x86.operands[0];
        uint64_t target = 0;
        if (op.type == X86_OP_IMM) {
            target = static_cast<uint64_t>(op.imm);
        } else {
            if (jmp) out.indirect_jumps.push_back(insn[i].address);
            continue;  // indirect: not followed
        }
        if (jmp && target >= start && target < end) {  // a branch inside the function
            out.branch_targets.push_back(target);
            continue;
        }
        auto p = plt.find(target);
        if (p != plt.end()) {
            out.imports.push_back(p->second);
        } else {
            out.targets.push_back(target);
        }
        out.sites.push_back({insn[i].address, insn[i].address + insn[i].size, jmp, target,
                             p != plt.end() ? p->second : std::string()});
    }
    if (n) cs.free(insn, n);
    return out;
}

std::vector<Insn> disassemble(const ElfFile& elf, uint64_t start, uint64_t end) {
    std::vector<Insn> out;
    Capstone cs;
    if (!cs.h || end <= start) return out;
    const std::vector<uint8_t> code = elf.code_at(start, end - start);
    cs_insn* insn = nullptr;
    const size_t n = cs.disasm(Bytes(code.data(), code.size()), start, &insn);
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        Insn x{insn[i].address, Insn::Other, 0};
        const cs_detail* d = insn[i].detail;
        if (d && d->x86.op_count >= 1) {
            const cs_x86_op& a = d->x86.operands[0];
            const cs_x86_op* b = d->x86.op_count == 2 ? &d->x86.operands[1] : nullptr;
            const bool rdi = a.type == X86_OP_REG && (a.reg == X86_REG_RDI || a.reg == X86_REG_EDI);
            if (insn[i].id == X86_INS_CALL) {
                x.kind = Insn::Call;
                x.value = a.type == X86_OP_IMM ? static_cast<uint64_t>(a.imm) : 0;
            } else if (rdi && b && insn[i].id == X86_INS_MOV && b->type == X86_OP_IMM) {
                x.kind = Insn::SetsRdi;
                x.value = static_cast<uint64_t>(b->imm);
            } else if (rdi && b && insn[i].id == X86_INS_LEA && b->type == X86_OP_MEM && b->mem.base == X86_REG_RIP &&
                       b->mem.index == X86_REG_INVALID) {
                x.kind = Insn::SetsRdi;
                x.value = insn[i].address + insn[i].size + static_cast<uint64_t>(b->mem.disp);
            }
        }
        out.push_back(x);
    }
    if (n) cs.free(insn, n);
    return out;
}

bool capstone_available() { return capstone_lib().open != nullptr; }

uint64_t exported_address(const ElfFile& elf, std::string_view name) {
    for (const auto& s : elf.symbols())
        if (s.dynamic && s.defined && s.value && s.name == name) return s.value;
    return 0;
}

bool is_python2(const ElfFile& elf) { return exported_address(elf, "PyString_FromString") != 0; }

namespace {

// 1. By symbol (local functions, clones included, never a .cold part).
// true: take_gil was found.
bool locate_by_symbols(const ElfFile& elf, GilLocation& loc) {
    std::set<uint64_t> seen;
    for (const auto& s : elf.symbols()) {
        if (s.dynamic || !s.defined || s.type != STT_FUNC || !s.value) continue;
        std::string_view base = symbol_base_name(s.name);
        if (base != "take_gil" && base != "drop_gil") continue;
        if (s.name.find(".cold") != std::string_view::npos) continue;
        if (!seen.insert(s.value).second) continue;
        GilFunction f{std::string(s.name), s.value, s.size, "symbol", false};
        (base == "take_gil" ? loc.take : loc.drop).push_back(f);
    }
    auto by_name = [](const GilFunction& a, const GilFunction& b) {
        return a.name.size() != b.name.size() ? a.name.size() < b.name.size() : a.vaddr < b.vaddr;
    };
    std::sort(loc.take.begin(), loc.take.end(), by_name);
    std::sort(loc.drop.begin(), loc.drop.end(), by_name);
    if (loc.take.empty()) return false;
    loc.from_symbols = true;
    if (loc.drop.empty()) loc.notes.push_back("no drop_gil symbol: it is inlined into its callers");
    return true;
}

// 2a. take_gil: the function reached from the exported GIL takers whose own
// body waits on a condition variable with a timeout. Returns its address
// (0: not found, said in the notes).
uint64_t locate_take(const ElfFile& elf, const std::map<uint64_t, std::string>& plt, GilLocation& loc) {
    auto take_roots = roots_of(elf, {"PyEval_RestoreThread", "PyEval_AcquireThread", "PyEval_AcquireLock"});
    if (take_roots.empty()) {
        loc.notes.push_back("not a CPython binary: none of PyEval_RestoreThread, PyEval_AcquireThread, "
                            "PyEval_AcquireLock is exported here (try the libpython it loads)");
        return 0;
    }
    auto waits = [](const CallScan& s) {
        return has_any(s.imports, {"pthread_cond_timedwait", "pthread_cond_clockwait"}) &&
               has_any(s.imports, {"pthread_mutex_lock"});
    };
    auto takes = search(elf, take_roots, 3, plt, waits);
    std::erase_if(takes, [&](const Found& f) {
        // An exported function that waits (PyThread_acquire_lock_timed, ...) is not take_gil,
        // unless it is one of the roots (take_gil inlined into it).
        if (!exported_function(elf, f.addr)) return false;
        for (auto& [n, a] : take_roots)
            if (a == f.addr) return false;
        return true;
    });
    if (takes.empty()) {
        // Python 2's GIL is a plain lock (ceval.c's interpreter_lock, a
        // semaphore taken by PyThread_acquire_lock, as every threading.Lock
        // is): there is no take_gil to find, and "not found" would read as
        // a failure to look.
        if (is_python2(elf))
            loc.notes.push_back("Python 2: its GIL is a plain lock (interpreter_lock, taken by PyThread_acquire_lock "
                                "like any threading.Lock), with no take_gil; its takes and drops are the calls of "
                                "the lock functions in ceval.c (py2_gil.h)");
        else
            loc.notes.push_back("take_gil not found: no function reached from the exported GIL callers waits on a "
                                "condition variable with a timeout");
        return 0;
    }
    const Found& t = takes.front();
    Extent te = extent_of(elf, t.addr);
    GilFunction tf;
    tf.vaddr = t.addr;
    tf.size = te.end - te.start;
    std::string en = exported_name(elf, t.addr);
    if (!en.empty()) {
        tf.name = en;
        tf.inlined = true;
        tf.how = "take_gil inlined into " + en;
        loc.notes.push_back("take_gil is inlined into " + en + ": its entry and return bracket the GIL wait");
    } else {
        tf.name = "take_gil";
        tf.how = "called from " + join(t.roots);
    }
    loc.take.push_back(tf);
    // A root that does not reach it but waits itself has its own inlined copy.
    for (const auto& f : takes)
        for (auto& [rn, ra] : take_roots)
            if (f.addr == ra && !t.roots.count(rn) && f.addr != t.addr) {
                Extent e = extent_of(elf, ra);
                loc.take.push_back(GilFunction{rn, ra, e.end - e.start, "take_gil inlined into " + rn, true});
                loc.notes.push_back("take_gil is also inlined into " + rn + ": probing its entry and return too");
            }
    return t.addr;
}

// 2b. drop_gil: the function reached from the exported GIL droppers that
// signals a condition variable and never waits with a timeout.
void locate_drop(const ElfFile& elf, const std::map<uint64_t, std::string>& plt, uint64_t take, GilLocation& loc) {
    auto drop_roots = roots_of(elf, {"PyEval_SaveThread", "PyEval_ReleaseThread", "PyEval_ReleaseLock"});
    auto signals = [](const CallScan& s) {
        return has_any(s.imports, {"pthread_cond_signal", "pthread_cond_broadcast"}) &&
               has_any(s.imports, {"pthread_mutex_unlock"}) &&
               !has_any(s.imports, {"pthread_cond_timedwait", "pthread_cond_clockwait"});
    };
    auto drops = search(elf, drop_roots, 4, plt, signals);
    std::erase_if(drops, [&](const Found& f) { return f.addr == take; });
    if (drops.empty()) {
        loc.notes.push_back("drop_gil not found as a function (inlined into its callers): GIL hold ends are not "
                            "probed; GIL wait still is");
        return;
    }
    const Found& d = drops.front();
    std::string dn = exported_name(elf, d.addr);
    if (!dn.empty()) {
        loc.notes.push_back("drop_gil is inlined into " + dn + ": no drop_gil probe placed; GIL wait is still measured");
        return;
    }
    Extent de = extent_of(elf, d.addr);
    loc.drop.push_back(GilFunction{"drop_gil", d.addr, de.end - de.start, "called from " + join(d.roots), false});
    // Callers with their own inlined drop_gil (Debian's PyEval_SaveThread):
    // their entry is where the GIL is released on that path.
    for (const auto& f : drops)
        for (auto& [rn, ra] : drop_roots)
            if (f.addr == ra && !d.roots.count(rn)) {
                Extent e = extent_of(elf, ra);
                loc.drop.push_back(GilFunction{rn, ra, e.end - e.start, "drop_gil inlined into " + rn, true});
                loc.notes.push_back("drop_gil is inlined into " + rn + ": probing " + rn +
                                    " entry and return as drop_gil on that path");
            }
}

// 3. The releases inlined where no located function is (release_sites.h).
void add_release_sites(const ElfFile& elf, const std::map<uint64_t, std::string>& plt, GilLocation& loc) {
    if (loc.drop.empty()) return;
    std::set<std::string> where;
    size_t unnamed = 0, n = 0;
    for (GilFunction& f : inlined_release_sites(elf, loc, plt)) {
        if (f.name == "drop_gil") ++unnamed;
        else where.insert(f.name);
        loc.drop.push_back(std::move(f));
        ++n;
    }
    if (unnamed) where.insert(std::to_string(unnamed) + " function(s) without a symbol");
    if (n)
        loc.notes.push_back("drop_gil is also inlined into " + join(where) + ": probed where each of its " +
                            std::to_string(n) + " copies signals the GIL's condition variable, as a drop_gil entry");
}

}  // namespace

GilLocation locate_gil(const ElfFile& elf, LocateOptions opt) {
    GilLocation loc;
    loc.binary = elf.path();
    loc.build_id = elf.build_id();
    loc.non_pie = elf.type() == 2;
    if (opt.use_symtab && elf.has_symtab() && locate_by_symbols(elf, loc)) {
        if (capstone_lib().open) add_release_sites(elf, plt_stub_names(elf), loc);
        return loc;
    }
    // 2. Without symbols: follow the exported callers.
    if (!capstone_lib().open) {
        loc.notes.push_back("cannot disassemble: " + capstone_lib().error + " (install the capstone library)");
        return loc;
    }
    auto plt = plt_stub_names(elf);
    if (plt.empty()) loc.notes.push_back("no PLT imports resolved: cannot recognise pthread calls");
    if (const uint64_t take = locate_take(elf, plt, loc)) locate_drop(elf, plt, take, loc);
    add_release_sites(elf, plt, loc);
    return loc;
}

}  // namespace gilscan
