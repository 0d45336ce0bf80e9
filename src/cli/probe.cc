#include "gilscan/cli/probe.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gilscan/cli/options.h"
#include "gilscan/error.h"
#include "gilscan/gil/probe_plan.h"

namespace gilscan {

namespace {

// probes of `ev` are named ev__return, ev__return_1, ...: another function's
// (take_gil_1__return for take_gil) has more after the prefix than an index.
bool tp_suffix_is_other(const std::string& event, const std::string& ev) {
    const std::string rest = event.substr(ev.size() + 8);
    return !rest.empty() && (rest[0] != '_' || rest.find_first_not_of("0123456789", 1) != std::string::npos);
}

}  // namespace

int probe_main(int argc, char** argv) {
    bool print = false, remove = false;
    std::string group;
    std::vector<std::string> targets;
    OptionTable table("gilscan probe", "[options] [PYTHON_OR_LIBPYTHON...]",
                  "Finds take_gil/drop_gil (by symbol, or by disassembling a stripped Python) and places\n"
                  "entry and return uprobes through tracefs, for a perf record of your own. Default\n"
                  "target: the python3 on PATH (a pyenv shim resolved to the interpreter and its libpython).");
    table.flag("--print", "only print the addresses and the uprobe_events / perf probe lines", [&] { print = true; });
    table.flag("--remove", "delete the probes (of --group, else gilscan's own gilscan_* groups)", [&] { remove = true; });
    table.value("--group", "NAME", "probe group name (default: gilscan_<binary name>)",
            [&](const std::string& v) { group = non_empty("--group", v, "a name"); });
    table.operands("PYTHON", [&](const std::string& v) { targets.push_back(v); });
    table.epilogue("Probes a running perf uses stay until it ends, as the kernel keeps them. Details: docs/usage.md.");
    if (!table.parse(argc, argv, 2)) return 0;
    if (remove && targets.empty()) {
        size_t n = remove_probes(group, tracefs_dir(false));
        std::printf("removed %zu uprobe(s)\n", n);
        return 0;
    }
    if (targets.empty()) targets.push_back("python3");
    if (!group.empty() && targets.size() > 1) {
        throw UsageError("--group names one target's probes; give one target");
    }
    for (const auto& t : targets) {
        std::string bin = resolve_python_binary(t);
        ProbePlan plan = plan_probes(bin, group);
        if (remove) {
            size_t n = remove_probes(plan.group, tracefs_dir(false));
            std::printf("%s: removed %zu uprobe(s) of group %s\n", bin.c_str(), n, plan.group.c_str());
            continue;
        }
        std::printf("# %s%s%s (%s)\n", bin.c_str(), plan.loc.build_id.empty() ? "" : " build-id ",
                    plan.loc.build_id.c_str(), plan.loc.non_pie ? "non-PIE executable" : "position-independent");
        for (const auto& fns : {plan.loc.take, plan.loc.drop})
            for (const auto& f : fns)
                std::printf("#   %-22s vaddr 0x%llx size %llu: %s\n", f.name.c_str(),
                            static_cast<unsigned long long>(f.vaddr), static_cast<unsigned long long>(f.size),
                            f.how.c_str());
        for (const auto& n : plan.loc.notes) std::printf("#   note: %s\n", n.c_str());
        if (print) {
            for (const auto& p : plan.probes) std::printf("echo '%s' >> /sys/kernel/tracing/uprobe_events\n", p.line().c_str());
            if (plan.loc.from_symbols) {
                // perf probe can name symbol-found functions itself (not stripped ones).
                for (const auto& fns : {plan.loc.take, plan.loc.drop})
                    for (size_t i = 0; i < fns.size(); ++i) {
                        if (fns[i].site) continue;  // a point inside a function: the uprobe_events line above
                        std::string base = symbol_base_name(fns[i].name) == "take_gil" ? "take_gil" : "drop_gil";
                        std::string ev = i == 0 ? base : base + "_" + std::to_string(i);
                        // The entry probe's fetch argument, as uprobe_events has it (perf probe
                        // passes a raw one through); each exit as name+offset, or %return.
                        std::string args, entry, exits;
                        uint64_t at = 0;
                        for (const auto& p : plan.probes)
                            if (!p.ret && p.event == ev) {
                                at = p.offset;
                                if (!p.args.empty()) args = " " + p.args;
                            }
                        for (const auto& p : plan.probes) {
                            if (p.event.rfind(ev + "__return", 0) != 0 || tp_suffix_is_other(p.event, ev)) continue;
                            char site[64];
                            std::snprintf(site, sizeof site, "+0x%llx", static_cast<unsigned long long>(p.offset - at));
                            exits += " -a '" + plan.group + ":" + p.event + "=" + fns[i].name +
                                     (p.ret ? std::string("%return") : site) + "'";
                        }
                        std::printf("# or: perf probe -x %s -a '%s:%s=%s%s'%s\n", bin.c_str(), plan.group.c_str(),
                                    ev.c_str(), fns[i].name.c_str(), args.c_str(), exits.c_str());
                    }
            }
            continue;
        }
        auto written = install_probes(plan, tracefs_dir(true));
        std::printf("%zu uprobe(s) in group %s (%zu added, %zu already there)\n", plan.probes.size(),
                    plan.group.c_str(), written.size(), plan.probes.size() - written.size());
        std::printf("record with: perf record -k CLOCK_MONOTONIC -e '%s:*' ... (or gilscan record --gil)\n",
                    plan.group.c_str());
    }
    return 0;
}

}  // namespace gilscan
