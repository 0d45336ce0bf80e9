#include "gilscan/cli/record_access.h"

#include <fstream>
#include <sstream>

#include <unistd.h>

namespace gilscan {

namespace {

constexpr int kCapSysAdmin = 21, kCapSysPtrace = 19, kCapPerfmon = 38;

int paranoid_level() {
    std::ifstream f("/proc/sys/kernel/perf_event_paranoid");
    int v = 2;
    f >> v;
    return v;
}

// The "Name:\tvalue" line of /proc/PID/status ("" when absent).
std::string status_field(const std::string& pid, const std::string& name) {
    std::ifstream f("/proc/" + pid + "/status");
    for (std::string line; std::getline(f, line);)
        if (line.rfind(name + ":", 0) == 0) return line.substr(name.size() + 1);
    return "";
}

}  // namespace

bool has_capability(int cap) {
    const std::string eff = status_field("self", "CapEff");
    unsigned long long mask = 0;
    std::istringstream(eff) >> std::hex >> mask;
    return cap >= 0 && cap < 64 && (mask >> cap) & 1;
}

std::vector<std::string> missing_permissions(const AccessNeeds& n) {
    std::vector<std::string> missing;
    const bool perfmon = has_capability(kCapPerfmon) || has_capability(kCapSysAdmin);
    if (!perfmon && paranoid_level() > -1)
        missing.push_back("kernel.perf_event_paranoid is " + std::to_string(paranoid_level()) +
                          ", and recording tracepoints and uprobes needs -1 (or CAP_PERFMON): "
                          "sudo sysctl -w kernel.perf_event_paranoid=-1");
    const std::string format = n.tracefs + "/events/sched/sched_switch/format";
    if (::access(format.c_str(), R_OK) != 0)
        missing.push_back("tracefs (" + n.tracefs + ") is not readable by you, and perf reads the events' formats "
                          "there: sudo chmod -R go+rX " + n.tracefs);
    const std::string events = n.tracefs + "/uprobe_events";
    if (n.place_uprobes && ::access(events.c_str(), W_OK) != 0)
        missing.push_back("placing the GIL uprobes writes " + events +
                          ", which needs root: place them once with sudo gilscan probe " +
                          (n.python.empty() ? std::string("PYTHON") : n.python) +
                          " (record then uses them), or record without them (--state)");
    if (n.attach_pid > 0 && !has_capability(kCapSysPtrace)) {
        const std::string pid = std::to_string(n.attach_pid);
        std::istringstream uids(status_field(pid, "Uid"));
        long real = -1, effective = -1;
        uids >> real >> effective;
        if (real >= 0 && (real != static_cast<long>(::geteuid()) || effective != static_cast<long>(::geteuid())))
            missing.push_back("process " + pid + " runs as user " + std::to_string(effective) +
                              ", and attaching to another user's process needs CAP_SYS_PTRACE: run as root "
                              "or as that user");
    }
    return missing;
}

}  // namespace gilscan
