#include "gilscan/symbols/exit_sites.h"

#include <algorithm>
#include <cstdio>

#include "gilscan/symbols/eh_frame.h"
#include "gilscan/symbols/gil_locator.h"

namespace gilscan {

namespace {

std::string hex(uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}

bool inside(const std::vector<std::pair<uint64_t, uint64_t>>& parts, uint64_t a) {
    return std::any_of(parts.begin(), parts.end(), [a](const auto& p) { return a >= p.first && a < p.second; });
}

// What a jump leaving the code scanned so far lands in.
enum class Landing { Function, ColdPart, Unknown };

Landing landing(const ElfFile& elf, uint64_t target, const std::map<uint64_t, std::string>& plt,
                std::pair<uint64_t, uint64_t>& part) {
    if (plt.count(target)) return Landing::Function;
    const auto f = fde_at(elf, target);
    if (!f || f->at_start == Fde::Unknown) return Landing::Unknown;
    if (f->at_start == Fde::Inside) {
        part = {f->start, f->end};
        return Landing::ColdPart;
    }
    return f->start == target ? Landing::Function : Landing::Unknown;  // mid-function: not a call's landing
}

}  // namespace

FunctionExits function_exits(const ElfFile& elf, uint64_t entry, uint64_t end,
                             const std::map<uint64_t, std::string>& plt) {
    FunctionExits out;
    if (!capstone_available()) {
        out.unsure = "cannot disassemble (install the capstone library)";
        return out;
    }
    out.parts.emplace_back(entry, end);
    for (size_t i = 0; i < out.parts.size() && out.unsure.empty(); ++i) {
        const auto [start, stop] = out.parts[i];
        const CallScan scan = scan_calls(elf, start, stop, plt);
        out.at.insert(out.at.end(), scan.rets.begin(), scan.rets.end());
        if (!scan.indirect_jumps.empty()) {
            out.unsure = "an indirect jump at " + hex(scan.indirect_jumps[0]);
            break;
        }
        // Leaving jumps: unconditional ones are sites (call sites too; only jumps matter here).
        std::vector<std::pair<uint64_t, uint64_t>> leaving = scan.far_branches;
        for (const CallSite& s : scan.sites)
            if (s.jmp) leaving.emplace_back(s.at, s.target);
        for (const auto& [at, target] : leaving) {
            if (inside(out.parts, target)) continue;
            const bool conditional = std::none_of(scan.sites.begin(), scan.sites.end(),
                                                  [at = at](const CallSite& s) { return s.jmp && s.at == at; });
            std::pair<uint64_t, uint64_t> part;
            switch (landing(elf, target, plt, part)) {
            case Landing::ColdPart: out.parts.push_back(part); break;
            case Landing::Function:
                if (conditional) out.unsure = "a conditional tail jump at " + hex(at);
                else out.at.push_back(at);
                break;
            case Landing::Unknown:
                out.unsure = "a jump at " + hex(at) + " to " + hex(target) + ", in no function or cold part it knows";
                break;
            }
            if (!out.unsure.empty()) break;
        }
    }
    std::sort(out.at.begin(), out.at.end());
    out.at.erase(std::unique(out.at.begin(), out.at.end()), out.at.end());
    if (out.unsure.empty() && out.at.empty()) out.unsure = "no ret or tail jump found";
    return out;
}

}  // namespace gilscan
