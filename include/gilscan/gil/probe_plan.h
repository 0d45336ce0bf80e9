// Probe placement: find take_gil/drop_gil in the Python a user runs and place
// entry and return uprobes on them through tracefs (`gilscan probe`,
// `gilscan record --gil`).
//
//   std::string bin = resolve_python_binary("python3");   // shim -> interpreter -> libpython
//   ProbePlan plan = plan_probes(bin);                    // locate_gil + file offsets
//   install_probes(plan, tracefs_dir(true));              // idempotent
//   // perf record -e 'gil_libpython3_11:*' ...
//
// uprobe_events takes a FILE OFFSET: vaddr - p_vaddr + p_offset of the
// PT_LOAD that holds it. (`perf probe -x BIN 0xADDR` passes a raw address
// through, which is wrong for non-PIE executables such as Debian's python3.)
#pragma once

#include <string>
#include <vector>

#include "gilscan/symbols/gil_locator.h"

namespace gilscan {

// The prefix of the probe groups gilscan makes (gilscan_<binary name>):
// probe --remove without --group removes only those, never a group made by
// hand (perf probe's, the python: probes of the GIL post's recipe).
inline constexpr const char* kProbeGroupPrefix = "gilscan_";

struct UprobeSpec {
    std::string group, event, path;
    uint64_t offset = 0;
    bool ret = false;
    std::string args;  // fetch arguments of an entry probe: "gil=+16(+16(%di)):x64" (gil_arg.h), or empty
    std::string line() const;  // "p:group/event /path:0xOFF [args]" or "r:..."
};

struct ProbePlan {
    std::string binary;
    std::string group;
    bool python2 = false;  // the lock calls of ceval.c probed (py2_gil.h), not take_gil
    GilLocation loc;
    std::vector<UprobeSpec> probes;
};

// The ELF that holds the GIL for `what` (a command on PATH, an interpreter,
// a pyenv shim, or a libpython/python ELF). Throws gilscan::Error with a
// sentence the user can act on.
std::string resolve_python_binary(const std::string& what);

// "gil_" + the binary's name reduced to [a-z0-9_] ("gil_libpython3_11").
std::string default_probe_group(const std::string& binary);

ProbePlan plan_probes(const std::string& binary, const std::string& group = "");

// tracefs mount point; mounts it when asked and possible. Throws if absent.
std::string tracefs_dir(bool mount_if_needed);

// Adds the plan's probes to uprobe_events (removing stale ones of the same
// names first). Returns the lines written.
std::vector<std::string> install_probes(const ProbePlan& plan, const std::string& tracefs);

// Removes every probe of `group` (all gil_* groups when empty). Returns the
// number removed.
size_t remove_probes(const std::string& group, const std::string& tracefs);

}  // namespace gilscan
