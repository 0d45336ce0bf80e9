#include "gilscan/symbols/live_process.h"

#include <charconv>
#include <cstring>
#include <string_view>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/mapped_file.h"

namespace gilscan {

int32_t ns_pid_of_status(std::string_view status) {
    constexpr std::string_view key = "NSpid:";
    size_t at = status.rfind("\nNSpid:");
    if (at != std::string_view::npos) ++at;
    else if (status.substr(0, key.size()) == key) at = 0;
    else return 0;
    std::string_view line = status.substr(at + key.size());
    line = line.substr(0, line.find('\n'));
    // One pid per namespace, outermost first, separated by tabs.
    int32_t last = 0;
    while (!line.empty()) {
        const size_t skip = line.find_first_not_of(" \t");
        if (skip == std::string_view::npos) break;
        line.remove_prefix(skip);
        int32_t v = 0;
        const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
        if (ec != std::errc() || v <= 0) return 0;
        last = v;
        line.remove_prefix(static_cast<size_t>(end - line.data()));
        if (!line.empty() && line[0] != ' ' && line[0] != '\t') return 0;
    }
    return last;
}

bool in_executable_mapping(std::string_view maps, uint64_t addr) {
    while (!maps.empty()) {
        const size_t nl = maps.find('\n');
        std::string_view line = maps.substr(0, nl);
        maps.remove_prefix(nl == std::string_view::npos ? maps.size() : nl + 1);
        uint64_t start = 0, end = 0;
        if (!take_hex(line, start) || line.empty() || line[0] != '-') continue;
        line.remove_prefix(1);
        // "rwxp": the third letter.
        if (!take_hex(line, end) || line.size() < 4 || line[0] != ' ' || line[3] != 'x') continue;
        if (addr >= start && addr < end) return true;
    }
    return false;
}

LiveProcess live_process(const std::string& proc, int32_t pid, std::span<const uint64_t> jit_starts) {
    LiveProcess p;
    const std::string dir = proc + "/" + std::to_string(pid);
    std::string status, maps;
    bool failed = false;
    int err = 0;
    if (pid <= 0 || !read_small_file(dir + "/status", status, failed, err)) {
        p.why = "no " + dir + ": it has exited";
        return p;
    }
    if (!read_small_file(dir + "/maps", maps, failed, err)) {
        p.why = "cannot read " + dir + "/maps (" + std::strerror(err) + ")";
        return p;
    }
    bool same = false;
    for (uint64_t a : jit_starts)
        if ((same = in_executable_mapping(maps, a))) break;
    if (!same) {
        p.why = "pid " + std::to_string(pid) + " is another process now (none of the recorded JIT code's memory in " +
                dir + "/maps)";
        return p;
    }
    p.running = true;
    p.ns_pid = ns_pid_of_status(status);
    if (p.ns_pid == 0) p.ns_pid = pid;  // no pid namespaces in the kernel's view
    p.root = dir + "/root";
    return p;
}

}  // namespace gilscan
