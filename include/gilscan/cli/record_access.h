// What `gilscan record` checks before it starts perf, so that a user who
// lacks a permission gets one line per missing permission, each with its
// fix, instead of perf's first error.
//
//   AccessNeeds n; n.tracefs = tracefs; n.place_uprobes = true;
//   for (const std::string& line : missing_permissions(n)) ...
//
// Recording tracepoints (the scheduler's, and uprobes, which perf opens as
// tracepoints) samples raw data, which needs kernel.perf_event_paranoid -1
// or CAP_PERFMON (CAP_SYS_ADMIN before Linux 5.8); perf reads the events'
// formats in tracefs, which is root's alone unless opened up; placing
// uprobes writes tracefs's uprobe_events; attaching to another user's
// process needs CAP_SYS_PTRACE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gilscan {

struct AccessNeeds {
    std::string tracefs;         // where tracefs is mounted
    bool place_uprobes = false;  // record writes uprobe_events itself
    std::string python;          // the binary probed (named in the fix)
    int32_t attach_pid = 0;      // -p
};

// Empty when perf can record what is asked.
std::vector<std::string> missing_permissions(const AccessNeeds& needs);

// The effective capability `cap` (CAP_PERFMON is 38) of this process.
bool has_capability(int cap);

}  // namespace gilscan
