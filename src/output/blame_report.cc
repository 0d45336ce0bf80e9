#include "gilscan/output/blame_report.h"

#include <algorithm>

#include "gilscan/output/output_file.h"
#include "gilscan/output/utf8.h"

namespace gilscan {

namespace {
double ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }
double us(uint64_t ns) { return static_cast<double>(ns) / 1e3; }
double pct(uint64_t part, uint64_t whole) {
    return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}
// The table's function: a Python function's file by its name alone
// ("hog (/app/prog.py)" -> "hog (prog.py)"); the JSON keeps the path.
std::string short_function(const BlameRow& r) {
    std::string f = valid_utf8(r.function);
    const size_t open = f.rfind(" (");
    const size_t slash = f.rfind('/');
    if (r.python && open != std::string::npos && slash != std::string::npos && slash > open)
        f = f.substr(0, open + 2) + f.substr(slash + 1);
    return f;
}
// Held while blocked: most of its contended hold was off CPU.
bool blocked(const BlameRow& r) { return r.off_cpu_ns * 2 > r.contended_ns(); }
}  // namespace

void print_blame_table(std::FILE* out, const FileSummary& fs) {
    std::fprintf(out, "\nGIL blame: who held the GIL while other threads waited (%s):\n",
                 fs.blame_inferred ? "holders inferred from the scheduler: no GIL uprobes"
                                   : "holders from the GIL uprobes");
    if (fs.gil_blame.empty()) {
        std::fprintf(out, "  (no contended hold was charged)\n");
        return;
    }
    std::fprintf(out, "%9s %12s %8s %8s %8s %7s  %-28s %s\n", "PID", "contended ms", "%wait", "on CPU%", "off CPU%",
                 "threads", "function", "native culprit");
    size_t shown = 0;
    for (const BlameRow& r : fs.gil_blame) {
        if (shown++ == fs.blame_top) break;
        const auto w = fs.blame_waiting_ns.find(r.pid);
        const uint64_t waiting = w == fs.blame_waiting_ns.end() ? 0 : w->second;
        std::string native = valid_utf8(r.native);
        if (!r.module.empty()) native += " (" + valid_utf8(r.module) + ")";
        if (blocked(r)) native += "  held while blocked";
        std::fprintf(out, "%9d %12.1f %8.1f %8.1f %8.1f %7u  %-28s %s\n", r.pid, ms(r.contended_ns()),
                     pct(r.contended_ns(), waiting), pct(r.on_cpu_ns, r.contended_ns()),
                     pct(r.off_cpu_ns, r.contended_ns()), r.threads, short_function(r).c_str(), native.c_str());
    }
    if (fs.gil_blame.size() > fs.blame_top)
        std::fprintf(out, "(%zu more rows in --summary-json; --top N shows more)\n", fs.gil_blame.size() - fs.blame_top);
}

nlohmann::json blame_json(const FileSummary& fs) {
    using nlohmann::json;
    json rows = json::array();
    for (const BlameRow& r : fs.gil_blame) {
        const auto w = fs.blame_waiting_ns.find(r.pid);
        rows.push_back({{"pid", r.pid},
                        {"function", r.function},
                        {"python", r.python},
                        {"native", r.native},
                        {"module", r.module.empty() ? json(nullptr) : json(r.module)},
                        {"contended_us", us(r.contended_ns())},
                        {"on_cpu_us", us(r.on_cpu_ns)},
                        {"off_cpu_us", us(r.off_cpu_ns)},
                        {"hold_us", r.hold_ns ? json(us(*r.hold_ns)) : json(nullptr)},
                        {"waiting_us", w == fs.blame_waiting_ns.end() ? json(nullptr) : json(us(w->second))},
                        {"threads", r.threads},
                        {"held_while_blocked", blocked(r)},
                        {"inferred", r.inferred}});
    }
    return rows;
}

std::vector<std::string> folded_lines(const std::map<std::pair<int32_t, uint32_t>, uint64_t>& ns_by_stack,
                                      const BlameStacks& stacks, const std::map<int32_t, std::string>& comm) {
    // A ';' or newline in a name (a perf map's names are free text) would
    // split the line: they become '_'. Spaces are fine: the weight is what
    // follows the last one.
    auto frame = [](std::string s) {
        for (char& c : s)
            if (c == ';' || c == '\n') c = '_';
        return valid_utf8(s);
    };
    std::map<std::string, uint64_t> merged;
    for (const auto& [key, ns] : ns_by_stack) {
        const auto c = comm.find(key.first);
        std::string line = frame((c == comm.end() || c->second.empty() ? "pid" : c->second) + " (" +
                                 std::to_string(key.first) + ")");
        for (const std::string& f : stacks.stack(key.second).frames) line += ";" + frame(f);
        merged[line] += ns;
    }
    std::vector<std::string> out;
    for (const auto& [stack, ns] : merged)
        if (ns >= 1000) out.push_back(stack + " " + std::to_string(ns / 1000));
    return out;
}

void write_folded(const std::string& path, const std::vector<std::string>& lines) {
    OutputFile f(path, false);
    for (const std::string& l : lines) {
        f.write(l);
        f.write("\n", 1);
    }
    f.commit();
}

std::pair<std::vector<std::string>, std::vector<std::string>> folded_stacks(
    const GilBlame* blame, const BlameStacks* stacks, const FileSummary& summary, const std::unordered_set<int32_t>& pids) {
    if (!blame || !stacks) return {};
    std::map<int32_t, std::string> comm;
    for (const auto& t : summary.threads)
        if (t.main_thread || !comm.count(t.st.tgid)) comm[t.st.tgid] = t.st.comm;
    auto keep = [&](std::map<std::pair<int32_t, uint32_t>, uint64_t> m) {
        if (!pids.empty()) std::erase_if(m, [&](const auto& kv) { return !pids.count(kv.first.first); });
        return m;
    };
    std::map<std::pair<int32_t, uint32_t>, uint64_t> held;
    for (const BlameCharge& c : blame->charges())
        if (c.contended_ns()) held[{c.pid, c.stack}] += c.contended_ns();
    return {folded_lines(keep(std::move(held)), *stacks, comm), folded_lines(keep(blame->wait_charges()), *stacks, comm)};
}

}  // namespace gilscan
