#include "gilscan/cli/probe.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gilscan/error.h"
#include "gilscan/gil/probe_plan.h"

namespace gilscan {

int probe_main(int argc, char** argv) {
    bool print = false, remove = false;
    std::string group;
    std::vector<std::string> targets;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--print") print = true;
        else if (a == "--remove") remove = true;
        else if (a == "--group" && i + 1 < argc) group = argv[++i];
        else if (a == "-h" || a == "--help") {
            std::puts("usage: gilscan probe [--print] [--remove] [--group NAME] [PYTHON_OR_LIBPYTHON...]\n\n"
                      "Finds take_gil/drop_gil (by symbol, or by disassembling the exported GIL callers of a\n"
                      "stripped Python) and installs entry and return uprobes via tracefs uprobe_events.\n"
                      "Default target: the python3 on PATH (shims resolved to the real interpreter and the\n"
                      "libpython it loads).\n\n"
                      "  --print    only print the addresses and the uprobe_events / perf probe lines\n"
                      "  --remove   delete the probes (of --group, else of gilscan's own gilscan_* groups;\n"
                      "             probes in use by a running perf stay, as the kernel keeps them)\n"
                      "  --group    probe group name (default: gilscan_<binary name>)");
            return 0;
        } else if (!a.empty() && a[0] == '-') {
            std::fprintf(stderr, "gilscan: error: unknown option %s\n", a.c_str());
            return 2;
        } else {
            targets.push_back(a);
        }
    }
    if (remove && targets.empty()) {
        size_t n = remove_probes(group, tracefs_dir(false));
        std::printf("removed %zu uprobe(s)\n", n);
        return 0;
    }
    if (targets.empty()) targets.push_back("python3");
    if (!group.empty() && targets.size() > 1) {
        std::fprintf(stderr, "gilscan: error: --group names one target's probes; give one target\n");
        return 2;
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
                        std::string base = symbol_base_name(fns[i].name) == "take_gil" ? "take_gil" : "drop_gil";
                        std::string ev = i == 0 ? base : base + "_" + std::to_string(i);
                        // The entry probe's fetch argument, as uprobe_events has it (perf probe
                        // passes a raw one through).
                        std::string args;
                        for (const auto& p : plan.probes)
                            if (!p.ret && p.event == ev && !p.args.empty()) args = " " + p.args;
                        std::printf("# or: perf probe -x %s -a '%s:%s=%s%s' -a '%s:%s=%s%%return'\n", bin.c_str(),
                                    plan.group.c_str(), ev.c_str(), fns[i].name.c_str(), args.c_str(),
                                    plan.group.c_str(), ev.c_str(), fns[i].name.c_str());
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
