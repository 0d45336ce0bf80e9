// Stage helper (part of symbols): what /proc says of a recorded process that
// still runs, for the files its JIT left where only it can see them.
//
//   LiveProcess p = live_process("/proc", 1234, {0x7f3a00001000});
//   if (p.running) ... p.ns_pid (7 inside its container), p.root ("/proc/1234/root")
//   else ... p.why ("no /proc/1234: it has exited", ...)
//
// Why: a Python in a container (its own pid and mount namespaces) writes
// /tmp/perf-7.map, named by the pid it sees, into the container's /tmp; a
// service with systemd's PrivateTmp= writes /tmp/perf-1234.map into a /tmp
// of its own. The host's /tmp has neither. perf reads such a map while the
// process runs, through the process's namespaces (util/map.c map__new names
// it by nsinfo__pid(); dso__load_perf_map enters its mount namespace):
// /proc/PID/root/tmp/perf-NSPID.map is the same file from outside.
//
// A pid seen in a recording may belong to another process by the time it is
// analysed (reused, or the recording is from another machine). The process
// counts as the recorded one only when one of the recorded process's JIT
// mappings (anonymous executable memory) still lies in an executable
// mapping of /proc/PID/maps: with ASLR another process's memory is
// elsewhere. (A mapping's recorded start is checked for being inside, not
// for being a start: adjacent anonymous areas merge in /proc/PID/maps.)
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <string>

namespace gilscan {

struct LiveProcess {
    bool running = false;  // /proc/PID is there, with one of the recorded JIT mappings
    int32_t ns_pid = 0;    // its pid in its own (innermost) pid namespace: NSpid's last field
    std::string root;      // PROC/PID/root: its filesystem as it sees it (mount namespace, chroot)
    std::string why;       // when not running: why it is taken for gone
};

// proc: where procfs is ("/proc"; another directory in tests). jit_starts:
// the recorded starts of the process's anonymous executable mappings.
LiveProcess live_process(const std::string& proc, int32_t pid, std::span<const uint64_t> jit_starts);

// The "NSpid:" line of a /proc/PID/status text: its last pid (the innermost
// namespace's), or 0 when there is no such line (kernels before 4.1) or it
// does not parse.
int32_t ns_pid_of_status(std::string_view status);

// Whether addr lies in an executable mapping of a /proc/PID/maps text
// ("START-END PERMS ..." per line, hex).
bool in_executable_mapping(std::string_view maps, uint64_t addr);

}  // namespace gilscan
