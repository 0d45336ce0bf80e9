#include "gilscan/symbols/py2_gil.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <string_view>

#include "gilscan/symbols/gil_locator.h"

namespace gilscan {

namespace {

// ceval.c's functions that drop interpreter_lock and never take it
// (PyEval_EvalFrameEx, a taker, drops it too, before it takes it again).
constexpr std::string_view kDroppersOnly[] = {"PyEval_SaveThread", "PyEval_ReleaseThread", "PyEval_ReleaseLock"};

}  // namespace

std::vector<std::pair<uint64_t, uint64_t>> function_parts(const ElfFile& elf, std::string_view name) {
    std::vector<std::pair<uint64_t, uint64_t>> parts;
    for (const auto& s : elf.symbols()) {
        if (!s.defined || s.type != STT_FUNC || !s.value || symbol_base_name(s.name) != name) continue;
        uint64_t end = s.value + s.size;
        if (!s.size) {
            auto r = fde_range(elf, s.value);
            if (!r || r->first != s.value) continue;
            end = r->second;
        }
        parts.emplace_back(s.value, end);
    }
    std::sort(parts.begin(), parts.end());
    parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
    return parts;
}

std::vector<Py2GilSite> python2_gil_sites(const ElfFile& elf) {
    std::vector<Py2GilSite> out;
    if (!is_python2(elf)) return out;
    const auto plt = plt_stub_names(elf);
    // Direct calls too (a static python2, or a build with -fno-plt or
    // -Bsymbolic): the lock functions' own addresses.
    const uint64_t acquire = exported_address(elf, "PyThread_acquire_lock");
    const uint64_t release = exported_address(elf, "PyThread_release_lock");
    std::set<uint64_t> seen;  // call sites, once
    std::vector<std::string_view> functions(std::begin(kPy2GilTakers), std::end(kPy2GilTakers));
    functions.insert(functions.end(), std::begin(kDroppersOnly), std::end(kDroppersOnly));
    for (std::string_view fn : functions) {
        const uint64_t entry = exported_address(elf, fn);
        if (!entry) continue;
        for (const auto& [begin, end] : function_parts(elf, fn)) {
            const CallScan scan = scan_calls(elf, begin, end, plt);
            for (const CallSite& c : scan.sites) {
                const bool take = c.import == "PyThread_acquire_lock" || (acquire && c.target == acquire);
                const bool drop = c.import == "PyThread_release_lock" || (release && c.target == release);
                if ((!take && !drop) || !seen.insert(c.jmp ? entry : c.at).second) continue;
                // A tail jump returns to the function's caller: the function itself is the take or drop.
                if (c.jmp) {
                    out.push_back({take, std::string(fn), entry, 0, false});
                } else {
                    const bool landed = std::find(scan.branch_targets.begin(), scan.branch_targets.end(), c.next) !=
                                        scan.branch_targets.end();
                    out.push_back({take, std::string(fn), c.at, c.next, landed});
                }
            }
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const Py2GilSite& a, const Py2GilSite& b) {
        return a.take != b.take ? a.take : a.at < b.at;
    });
    return out;
}

}  // namespace gilscan
