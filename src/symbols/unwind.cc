#include "gilscan/symbols/unwind.h"

#include "gilscan/symbols/cfi_rules.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/symbols/elf_note.h"
#include "gilscan/symbols/mapping_memo.h"

#include <bit>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>

#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <elfutils/libdw.h>

namespace gilscan {

namespace {
// enum perf_event_x86_regs
constexpr unsigned PERF_REG_X86_SP = 7;
constexpr unsigned PERF_REG_X86_IP = 8;
}  // namespace

int perf_reg_to_dwarf(unsigned r) {
    // AX BX CX DX SI DI BP SP IP FLAGS CS SS DS ES FS GS R8..R15
    static const int map[24] = {0, 3, 2, 1, 4, 5, 6, 7, 16, -1, -1, -1, -1, -1, -1, -1, 8, 9, 10, 11, 12, 13, 14, 15};
    return r < 24 ? map[r] : -1;
}

struct DwarfUnwinder::Current {
    const Sample* sample = nullptr;
    const AddressSpace* as = nullptr;
    uint64_t sp = 0;
    Dwarf_Word regs[17] = {};
    bool have[17] = {};
    // libdw restarted at a caller frame: its pc is the return address - 1,
    // passed as an exact pc (see unwind_fast).
    bool pc_override = false;
    uint64_t pc = 0;
    // The mappings met lately, with their modules and biases.
    MappingMemo maps;
};

struct DwarfUnwinder::Space {
    Dwfl* dwfl = nullptr;
    CfiRuleCache rules;  // for unwind_fast; emptied when modules are added
    bool attached = false;
    uint64_t reported_version = ~uint64_t{0};
    std::set<std::string> reported;
    Current cur;
    ~Space() {
        if (dwfl) dwfl_end(dwfl);
    }
};

namespace {

// A module's separate debug file from the build-id tree, as its inflated
// copy in the cache (debuginfo_cache.h), before libdwfl's own search. Not
// after it: dwfl_standard_find_debuginfo opens the file it finds as the
// module's debug Elf itself, and that Elf is the one libdw then inflates.
// A debuglink name with a '/' is a dwz alternate file's (.gnu_debugaltlink):
// libdwfl's business.
int find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base, const char* file_name,
                   const char* debuglink_file, GElf_Word debuglink_crc, char** debuginfo_file_name) {
    const unsigned char* bits = nullptr;
    GElf_Addr vaddr = 0;
    const int n = (debuglink_file && std::strchr(debuglink_file, '/')) ? 0 : dwfl_module_build_id(mod, &bits, &vaddr);
    if (n > 1) {
        const std::string id = to_hex(Bytes(bits, static_cast<size_t>(n)));
        std::string path;
        const int fd = cached_debuginfo_fd(id, build_id_debug_path(id), &path);
        if (fd >= 0) {
            *debuginfo_file_name = ::strdup(path.c_str());
            return fd;
        }
    }
    return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc,
                                        debuginfo_file_name);
}

char* g_debuginfo_path = nullptr;
const Dwfl_Callbacks kCallbacks = {
    dwfl_build_id_find_elf,
    find_debuginfo,
    dwfl_offline_section_address,
    &g_debuginfo_path,
};

pid_t next_thread(Dwfl*, void* arg, void** thread_argp) {
    auto* cur = static_cast<DwarfUnwinder::Current*>(arg);
    if (*thread_argp) return 0;
    *thread_argp = arg;
    return cur->sample ? cur->sample->tid : 0;
}

bool get_thread(Dwfl*, pid_t tid, void* arg, void** thread_argp) {
    auto* cur = static_cast<DwarfUnwinder::Current*>(arg);
    *thread_argp = arg;
    return cur->sample && cur->sample->tid == tid;
}

bool read_file_word(DwarfUnwinder::Current* cur, Dwarf_Addr addr, Dwarf_Word* out) {
    const Mapping* m = cur->maps.find(addr);
    if (!m) return false;
    const Module* mod = cur->maps.module(*m);
    if (!mod) return false;
    Bytes file = mod->elf->bytes();
    uint64_t off = addr - m->start + m->pgoff;
    if (off > file.size() || file.size() - off < 8) return false;
    std::memcpy(out, file.data() + off, 8);
    return true;
}

// A word of the sampled thread's memory: from the stack copy, else from the
// file mapped there. Inlined into the fast unwinder's loop (a call per
// saved register was 4% of a DWARF capture's instructions).
[[gnu::always_inline]] inline bool read_word(DwarfUnwinder::Current* cur, Dwarf_Addr addr, Dwarf_Word* result) {
    const Bytes& st = cur->sample->stack_user;
    // The stack copy starts at the user SP; only dyn_size bytes are valid.
    if (addr >= cur->sp && addr - cur->sp <= st.size() && st.size() - (addr - cur->sp) >= 8) {
        std::memcpy(result, st.data() + (addr - cur->sp), 8);
        return true;
    }
    return read_file_word(cur, addr, result);
}

bool memory_read(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
    return read_word(static_cast<DwarfUnwinder::Current*>(arg), addr, result);
}

bool set_initial_registers(Dwfl_Thread* thread, void* arg) {
    auto* cur = static_cast<DwarfUnwinder::Current*>(arg);
    // Registers 0..16 are contiguous in DWARF numbering on x86-64; pass the
    // runs we have.
    int first = -1;
    for (int r = 0; r <= 17; ++r) {
        bool have = r < 17 && cur->have[r];
        if (have && first < 0) first = r;
        if (!have && first >= 0) {
            if (!dwfl_thread_state_registers(thread, first, static_cast<unsigned>(r - first), &cur->regs[first]))
                return false;
            first = -1;
        }
    }
    if (cur->have[16]) dwfl_thread_state_register_pc(thread, cur->pc_override ? cur->pc : cur->regs[16]);
    return true;
}

const Dwfl_Thread_Callbacks kThreadCallbacks = {next_thread, get_thread, memory_read, set_initial_registers,
                                                nullptr, nullptr};

struct FrameCtx {
    DwarfUnwinder::Current* cur;
    const std::function<FrameAction(const Frame&)>* cb;
    unsigned depth = 0;
    unsigned max;
    bool stopped = false;
    unsigned skip = 0;  // frames the fast path delivered already
    uint64_t* libdw_frames;
};

// pc: the frame's own address (a return address already moved back into the call).
Frame make_frame(DwarfUnwinder::Current* cur, uint64_t pc, unsigned depth, void* dwfl) {
    Frame f;
    f.pc = pc;
    f.depth = depth;
    f.mapping = cur->maps.find(f.pc);
    f.dwfl = dwfl;
    if (f.mapping) {
        const MappingMemo::Entry& e = cur->maps.entry(*f.mapping);
        f.module = e.mod;
        if (f.module) {
            if (e.bias) f.vaddr = f.pc - *e.bias;
            else f.module = nullptr;
        }
    }
    return f;
}

int frame_cb(Dwfl_Frame* state, void* arg) {
    auto* ctx = static_cast<FrameCtx*>(arg);
    if (ctx->depth < ctx->skip) {  // libdw walks again what the fast path already delivered
        ++ctx->depth;
        return DWARF_CB_OK;
    }
    Dwarf_Addr pc = 0;
    bool activation = false;
    if (!dwfl_frame_pc(state, &pc, &activation)) return DWARF_CB_ABORT;
    // A return address points after the call: look up the call itself.
    Frame f = make_frame(ctx->cur, activation ? pc : pc - 1, ctx->depth++, dwfl_thread_dwfl(dwfl_frame_thread(state)));
    ++*ctx->libdw_frames;
    if ((*ctx->cb)(f) == FrameAction::Stop) {
        ctx->stopped = true;
        return DWARF_CB_ABORT;
    }
    return ctx->depth >= ctx->max ? DWARF_CB_ABORT : DWARF_CB_OK;
}

}  // namespace

DwarfUnwinder::DwarfUnwinder(ModuleCache& modules) : modules_(modules) { names_.set_store(modules.name_store()); }
DwarfUnwinder::~DwarfUnwinder() = default;

// Address spaces with the same executable mappings at the same addresses (a
// multiprocessing pool forked from one parent, processes of one binary
// without ASLR) share one Dwfl: loading a module's CFI and DWARF is the
// expensive part of unwinding, and nothing in a Dwfl is per process — memory
// reads go through the sample being unwound.
DwarfUnwinder::Space* DwarfUnwinder::space_for(const AddressSpace& as) {
    auto& sp = spaces_[layout_of(as)];
    if (!sp) {
        sp = std::make_unique<Space>();
        sp->dwfl = dwfl_begin(&kCallbacks);
        if (!sp->dwfl) return nullptr;
    }
    if (sp->reported.empty() || sp->reported_version != as.version) {
        // Add the modules mapped since the last report; keep the ones there.
        dwfl_report_begin_add(sp->dwfl);
        for (const auto& [start, m] : as.maps) {
            if (!m.exec || sp->reported.count(m.path)) continue;
            const Module* mod = modules_.get(m);
            if (!mod) continue;
            auto bias = mod->bias_for(m);
            if (!bias) continue;
            if (dwfl_report_elf(sp->dwfl, m.path.c_str(), mod->file.c_str(), -1, *bias, true))
                sp->reported.insert(m.path);
        }
        dwfl_report_end(sp->dwfl, nullptr, nullptr);
        sp->reported_version = as.version;
        sp->rules.clear();  // a pc that had no module may have one now
    }
    if (!sp->attached) {
        if (sp->reported.empty()) return nullptr;
        sp->cur.maps.bind(as, modules_);
        if (!dwfl_attach_state(sp->dwfl, nullptr, as.pid > 0 ? as.pid : 1, &kThreadCallbacks, &sp->cur))
            return nullptr;
        sp->attached = true;
    }
    return sp.get();
}

namespace {

// The frame-pointer step of elfutils' x86_64_unwind (0.188,
// backends/x86_64_unwind.c): the caller's fp and return address saved at fp,
// its sp above them. false: no caller (libdw's walk ends in an error there).
[[gnu::always_inline]] inline bool step_by_frame_pointer(DwarfUnwinder::Current* cur, uint64_t* regs, uint32_t& have) {
    constexpr int kFp = 6, kSp = 7;
    if (!((have >> kFp) & 1) || regs[kFp] == 0) return false;
    uint64_t fp = regs[kFp];
    const uint64_t old_sp = ((have >> kSp) & 1) ? regs[kSp] : 0;
    Dwarf_Word prev_fp = 0, ret = 0;
    if (!read_word(cur, fp, &prev_fp)) prev_fp = 0;
    if (!read_word(cur, fp + 8, &ret)) return false;
    fp += 16;
    if (old_sp >= fp) return false;  // the stack pointer did not move up: no frame
    // The caller knows only these (libdw's unwound frame starts with none set).
    regs[kFp] = prev_fp;
    regs[kSp] = fp;
    regs[CfiRule::kRa] = ret;
    have = 1u << kFp | 1u << kSp | 1u << CfiRule::kRa;
    return true;
}

// One step by a cached rule: the caller's registers, in place. Each is
// computed from the CFA (worked out from this frame's registers) or from
// memory, or is this frame's unchanged (`same`, which stay where they are).
// A register whose value becomes unknown keeps a stale value that nothing
// reads (its bit is clear). Memory is read in register order, as libdw does.
// false: the outermost frame (the return address undefined, unset,
// unreadable, or zero).
[[gnu::always_inline]] inline bool step_by_rule(DwarfUnwinder::Current* cur, const CfiRule& rule, uint64_t* regs,
                                                uint32_t& have) {
    // Without the CFA's register every CFA-relative register is unknown in
    // the caller (libdw's expression evaluation fails for each).
    const bool cfa_known = (have >> rule.cfa_reg) & 1;
    const uint64_t cfa = regs[rule.cfa_reg] + static_cast<uint64_t>(rule.cfa_offset);
    uint32_t next_have = have & rule.same;
    if (cfa_known) {
        for (uint32_t m = rule.at_cfa | rule.val_cfa; m; m &= m - 1) {
            const int r = __builtin_ctz(m);
            const uint64_t at = cfa + static_cast<uint64_t>(rule.reg_offset[r]);
            if ((rule.val_cfa >> r) & 1) {
                regs[r] = at;
                next_have |= 1u << r;
                continue;
            }
            Dwarf_Word w = 0;
            if (read_word(cur, at, &w)) {
                regs[r] = w;
                next_have |= 1u << r;
            }
        }
    }
    if (!((next_have >> CfiRule::kRa) & 1) || regs[CfiRule::kRa] == 0) return false;
    have = next_have;
    return true;
}

}  // namespace

// Frames by cached CFI rules, exactly as libdw's handle_cfi would compute
// them from the same rules (registers 0..16; CFA = register + offset; each
// caller register undefined, same, at CFA + n or CFA + n). On the first frame
// whose rule is not of that kind it stops and says how many frames it
// delivered: libdw then takes over
// with its whole machinery (for a pc without a module, its frame-pointer
// fallback). It takes over at that frame when it can start there exactly as
// it would have arrived there (`restart`), else it walks the stack again from
// the start, skipping the frames delivered.
//
// A return address that cannot be read (the stack copy ends) ends the stack
// as libdw's handle_cfi does: the caller's pc is "undefined", the walk
// complete.
std::optional<UnwindStatus> DwarfUnwinder::unwind_fast(Space& sp, const std::function<FrameAction(const Frame&)>& cb,
                                                        unsigned max_frames, unsigned& delivered, bool& restart) {
    Current& cur = sp.cur;
    // Registers by DWARF number, and which are known (bit r).
    uint64_t regs[CfiRule::kRegs];
    uint32_t have = 0;
    for (int r = 0; r < CfiRule::kRegs; ++r) {
        regs[r] = cur.regs[r];
        if (cur.have[r]) have |= 1u << r;
    }
    delivered = 0;
    restart = false;
    for (bool initial = true;; initial = false) {
        // The initial frame's pc is exact; a caller's is a return address.
        const uint64_t pc = initial ? regs[CfiRule::kRa] : regs[CfiRule::kRa] - 1;
        const CfiRule* found = &sp.rules.at(sp.dwfl, pc);
        // JIT code whose jitdump recorded its CFI (CPython's -X perf_jit
        // trampolines): a module's rule in all but name.
        if (found->no_module) {
            if (const CfiRule* jit = jit_rule(*cur.as, pc)) {
                found = jit;
                ++jit_frames_;
            }
        }
        const CfiRule& rule = *found;
        if (rule.no_module) {
            // No module here: JIT code (Python's -X perf trampolines), or a
            // return address that is no code of the process's files (the
            // kernel's uretprobe trampoline in [uprobes], where a take_gil
            // return uprobe was active: most sleep stacks recorded beside
            // the ground-truth uprobes of testdata/ end in one). libdw
            // has no CFI and takes elfutils' x86_64_unwind step by the frame
            // pointer (0.188, backends/x86_64_unwind.c), which is this. libdw's own path
            // would restart its whole unwind for it.
            ++fast_frames_;
            ++fp_frames_;
            if (cb(make_frame(&cur, pc, delivered, sp.dwfl)) == FrameAction::Stop) return UnwindStatus::Stopped;
            if (++delivered >= max_frames) return UnwindStatus::Complete;
            // Where the step fails libdw's walk ends in an error.
            if (!step_by_frame_pointer(&cur, regs, have))
                return delivered >= 2 ? UnwindStatus::StoppedEarly : UnwindStatus::Failed;
            continue;
        }
        if (rule.kind != CfiRule::Simple) {
            // A caller frame libdw would reach with exactly these registers;
            // started there with pc = return address - 1 as the exact pc, it
            // looks up and reports the same pc. Not after a signal frame
            // (there the caller's pc is exact) — the rules never pass one.
            if (!initial && !rule.signal) {
                restart = true;
                for (int r = 0; r < CfiRule::kRegs; ++r) {
                    cur.regs[r] = regs[r];
                    cur.have[r] = (have >> r) & 1;
                }
                cur.pc_override = true;
                cur.pc = pc;
            }
            return std::nullopt;
        }
        ++fast_frames_;
        if (cb(make_frame(&cur, pc, delivered, sp.dwfl)) == FrameAction::Stop) return UnwindStatus::Stopped;
        if (++delivered >= max_frames) return UnwindStatus::Complete;
        if (!step_by_rule(&cur, rule, regs, have)) return UnwindStatus::Complete;
    }
}

const CfiRule* DwarfUnwinder::jit_rule(const AddressSpace& as, uint64_t pc) {
    // Only where a perf map or jitdump would name the pc (perf_map.h): the
    // process's map is read here no sooner than its frames' names would read it.
    const Mapping* m = as.find(pc);
    if (!m || !m->exec || !is_jit_mapping(m->path)) return nullptr;
    if (!jit_map_ || jit_pid_ != as.pid) {
        jit_map_ = modules_.perf_maps().of(as);
        jit_pid_ = as.pid;
    }
    return jit_map_->cfi_at(pc);
}

void* DwarfUnwinder::dwfl_for(const AddressSpace& as) {
    Space* sp = space_for(as);
    return sp ? sp->dwfl : nullptr;
}

UnwindStatus DwarfUnwinder::unwind(const AddressSpace& as, const Sample& s,
                                   const std::function<FrameAction(const Frame&)>& cb, unsigned max_frames) {
    if (s.regs_user_abi == 0 || s.regs_user.size() == 0 || s.stack_user.empty() || s.tid <= 0)
        return UnwindStatus::Failed;
    Space* sp = space_for(as);
    if (!sp) return UnwindStatus::Failed;
    Current& cur = sp->cur;
    // Per sample: the registers and where libdw restarts; the module memo
    // stays while the address space is unchanged.
    cur.maps.bind(as, modules_);
    cur.sample = &s;
    cur.as = &as;
    cur.sp = 0;
    for (int r = 0; r < 17; ++r) {
        cur.regs[r] = 0;
        cur.have[r] = false;
    }
    cur.pc_override = false;
    cur.pc = 0;
    size_t i = 0;
    for (unsigned bit = 0; bit < 64; ++bit) {
        if (!((s.regs_user_mask >> bit) & 1)) continue;
        if (i >= s.regs_user.size()) break;
        uint64_t v = s.regs_user[i++];
        if (bit == PERF_REG_X86_SP) cur.sp = v;
        int d = perf_reg_to_dwarf(bit);
        if (d >= 0) {
            cur.regs[d] = v;
            cur.have[d] = true;
        }
    }
    if (!cur.have[16] || !cur.have[7]) return UnwindStatus::Failed;
    (void)PERF_REG_X86_IP;
    FrameCtx ctx{&cur, &cb, 0, max_frames, false, 0, &libdw_frames_};
    if (fast_) {
        bool restart = false;
        std::optional<UnwindStatus> done = unwind_fast(*sp, cb, max_frames, ctx.skip, restart);
        if (done) {
            cur.sample = nullptr;
            return *done;
        }
        ++fallbacks_;
        if (restart) {  // libdw starts at the first frame not delivered
            ctx.depth = ctx.skip;
            ctx.skip = 0;
        }
    }
    int rc = dwfl_getthread_frames(sp->dwfl, s.tid, frame_cb, &ctx);
    cur.sample = nullptr;
    if (ctx.stopped) return UnwindStatus::Stopped;
    if (rc == 0 || ctx.depth >= max_frames) return UnwindStatus::Complete;
    return ctx.depth >= 2 ? UnwindStatus::StoppedEarly : UnwindStatus::Failed;
}

}  // namespace gilscan
