#include "gilscan/gil/blame_stacks.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/perf_map.h"

namespace gilscan {

void SampleCopy::assign(std::shared_ptr<const AddressSpace> as, const Sample& s) {
    space = std::move(as);
    sample = s;
    const size_t nr = s.regs_user.bytes.size(), ns = s.stack_user.size();
    bytes.resize(nr + ns);
    if (nr) std::memcpy(bytes.data(), s.regs_user.bytes.data(), nr);
    if (ns) std::memcpy(bytes.data() + nr, s.stack_user.data(), ns);
    sample.regs_user = U64Array{Bytes(bytes.data(), nr), s.regs_user.swap};
    sample.stack_user = Bytes(bytes.data() + nr, ns);
    sample.callchain = {};
    sample.raw = {};
    sample.aux = {};
    sample.regs_intr = {};
    sample.note = nullptr;
}

namespace {

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The interpreter's machinery by symbol prefix, CPython 2.7 to 3.13: a
// frame named so is not what the program asked for, the frame it called is.
constexpr std::string_view kInterpreterPrefixes[] = {
    "_PyEval_", "PyEval_", "_PyFunction_", "PyFunction_", "function_code_fastcall", "fast_function",
    "call_function", "do_call_core", "_PyObject_Call", "PyObject_Call", "_PyObject_Vectorcall",
    "PyObject_Vectorcall", "_PyObject_MakeTpCall", "_PyObject_FastCall", "PyVectorcall_", "_PyVectorcall_",
    "method_vectorcall", "cfunction_vectorcall", "cfunction_call", "_PyCFunction_", "PyCFunction_",
    "_PyMethodDef_", "method_call", "slot_tp_call", "vectorcall_", "_Py_call_", "call_trampoline",
    "builtin_call", "ext_do_call", "PyCFuncPtr_call", "_ctypes_callproc", "ffi_call", "_call_function_pointer",
    "_TAIL_CALL_", "partial_vectorcall", "partial_call", "thread_run",
    "pythread_wrapper", "_Py_trampoline"};

}  // namespace

bool is_interpreter_frame(std::string_view f) {
    for (std::string_view p : kInterpreterPrefixes)
        if (starts(f, p)) return true;
    return false;
}

std::string python_function_name(std::string_view sym) {
    if (!starts(sym, "py::")) return "";
    sym.remove_prefix(4);
    const size_t colon = sym.find(':');
    if (colon == std::string_view::npos) return std::string(sym);
    return std::string(sym.substr(0, colon)) + " (" + std::string(sym.substr(colon + 1)) + ")";
}

BlameStacks::BlameStacks(ModuleCache& modules) : modules_(modules), unwinder_(modules) {
    stacks_.resize(kFirstStack);
    stacks_[kNoSample] = {{"[on CPU, no sample]"}, "", "[on CPU, no sample]", ""};
    stacks_[kNoStack] = {{"[off CPU, no stack]"}, "", "[off CPU, no stack]", ""};
    stacks_[kUnknown] = {{"[state unknown]"}, "", "[state unknown]", ""};
    stacks_[kSampleNoStack] = {{"[on CPU, sample without stack]"}, "", "[on CPU, sample without stack]", ""};
}

namespace {
// "take_gil+0xbe (libpython3.11.so.1.0)", "[inlined] X (m)", "0x7f12 (m)" -> the function's name.
std::string function_of(std::string_view text, std::string_view module) {
    if (starts(text, "[inlined] ")) text.remove_prefix(10);
    if (starts(text, "0x")) return "[" + std::string(module) + "]";
    size_t end = text.find("+0x");
    if (end == std::string_view::npos) end = text.rfind(" (");
    return std::string(text.substr(0, end));
}
}  // namespace

// A JIT frame's name from its process's perf map or jitdump; live, read
// again where the map has grown since.
void BlameStacks::name_jit(const AddressSpace& as, const Frame& f, FrameName& n) {
    auto& map = jit_maps_[as.pid];
    if (!map || (live_ && !map->find(f.pc) && modules_.perf_maps().forget_if_grown(as.pid)))
        map = modules_.perf_maps().of(as);
    n.names.clear();
    if (const PerfMapSymbol* sym = map->find(f.pc)) n.names.push_back(sym->name);
    else n.names.push_back("[JIT code]");
    n.jit_unnamed = n.names.back() == "[JIT code]";
}

const BlameStacks::FrameName& BlameStacks::name(const AddressSpace& as, const Frame& f) {
    const bool jit = in_jit_code(f);
    auto& cache = jit ? jit_names_[static_cast<uint64_t>(as.pid)] : names_[layout_of(as)];
    auto it = cache.find(f.pc);
    if (it != cache.end() && !(live_ && it->second.jit_unnamed)) return it->second;
    FrameName n;
    n.module = f.mapping ? std::filesystem::path(f.mapping->path).filename().string() : std::string("?");
    if (jit) {
        name_jit(as, f, n);
    } else {
        for (const std::string& text : unwinder_.describe(f)) n.names.push_back(function_of(text, n.module));
    }
    n.jit_python = !n.names.empty() && starts(n.names.back(), "py::");
    // libffi's call glue is often stripped (its frames unnamed): its file says it.
    n.glue = is_interpreter_frame(n.names.back()) || starts(n.module, "libffi.") || starts(n.module, "_ctypes.");
    if (it != cache.end()) return it->second = std::move(n);
    return cache.emplace(f.pc, std::move(n)).first->second;
}

uint32_t BlameStacks::resolve(const AddressSpace& as, const Sample& s, bool on_cpu) {
    const uint32_t none = on_cpu ? kSampleNoStack : kNoStack;
    if (s.regs_user_abi == 0 || s.stack_user.empty()) return none;
    frames_.clear();
    // Without full stacks, the walk ends once both names are found (or the
    // native culprit, in a process without JIT code to name a Python
    // function): a busy holder's samples are most of the unwinding.
    const bool may_name_python = full_ || has_jit_code(as);
    bool native = false, python = false;
    unwinder_.unwind(as, s, [&](const Frame& f) {
        frames_.push_back(f);
        if (full_) return FrameAction::Continue;
        const FrameName& n = name(as, f);
        native |= n.glue || n.jit_python;
        python |= n.jit_python;
        return native && (python || !may_name_python) ? FrameAction::Stop : FrameAction::Continue;
    }, kMaxFrames);
    ++unwound_;
    if (frames_.empty()) return none;
    // The same pcs in the same process and layout name the same stack: most
    // samples of a busy holder repeat an earlier stack, named once.
    pc_key_.clear();
    const uint64_t head[2] = {static_cast<uint64_t>(as.pid), layout_of(as)};
    pc_key_.append(reinterpret_cast<const char*>(head), sizeof head);
    for (const Frame& f : frames_) pc_key_.append(reinterpret_cast<const char*>(&f.pc), sizeof f.pc);
    if (auto it = by_pcs_.find(pc_key_); it != by_pcs_.end()) return it->second;
    const uint32_t id = name_stack(as);
    if (live_ && std::any_of(frames_.begin(), frames_.end(), [&](const Frame& f) { return name(as, f).jit_unnamed; }))
        return id;  // named again next time: its map may name that frame by then
    // Distinct pc sequences keep coming as long as a program runs (leaf pcs
    // times callers): live, the shortcut is a cache of bounded size, whose
    // misses name the stack again (to the same id).
    if (live_ && by_pcs_.size() >= kLivePcStacks) by_pcs_.clear();
    by_pcs_.emplace(pc_key_, id);
    return id;
}

bool BlameStacks::has_jit_code(const AddressSpace& as) {
    auto [it, added] = jit_spaces_.try_emplace(as.id, std::make_pair(as.version, false));
    if (added || it->second.first != as.version) {
        bool any = false;
        for (const auto& [start, m] : as.maps) any |= m.exec && (is_jit_mapping(m.path) || is_injected_jit_path(m.path));
        it->second = {as.version, any};
    }
    return it->second.second;
}

uint32_t BlameStacks::name_stack(const AddressSpace& as) {
    BlameStack b;
    // Innermost first while choosing the names, then reversed: root first.
    std::vector<const FrameName*> named;
    named.reserve(frames_.size());
    for (const Frame& f : frames_) named.push_back(&name(as, f));
    std::string inner;     // the innermost frame's function
    bool found_native = false;
    for (size_t i = 0; i < named.size(); ++i) {
        const FrameName& n = *named[i];
        const std::string& fn = n.names.back();
        if (i == 0) inner = fn;
        if (n.jit_python && b.python.empty()) b.python = python_function_name(fn);
        if (!found_native && (n.glue || n.jit_python)) {
            found_native = true;
            if (i == 0) {
                b.native = fn;
                b.module = n.module;
            } else {
                b.native = named[i - 1]->names.back();
                b.module = named[i - 1]->module;
            }
        }
        if (!b.python.empty() && found_native) break;
    }
    if (!found_native) {  // no interpreter frame reached: the leaf
        b.native = inner;
        b.module = named[0]->module;
    }
    for (size_t i = named.size(); i-- > 0;)
        for (size_t k = named[i]->names.size(); k-- > 0;) b.frames.push_back(named[i]->names[k]);
    named_python_ |= !b.python.empty();
    return intern(std::move(b));
}

uint32_t BlameStacks::intern(BlameStack&& b) {
    std::string key;
    for (const auto& f : b.frames) {
        key += f;
        key += ';';
    }
    auto [it, added] = ids_.try_emplace(std::move(key), static_cast<uint32_t>(stacks_.size()));
    if (added) stacks_.push_back(std::move(b));
    return it->second;
}

}  // namespace gilscan
