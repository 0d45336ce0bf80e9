// Processes that still run (live_process.h) and the perf maps read through
// them (PerfMaps::of): a container's map in its own /tmp, named by its pid
// there; a reused pid not taken for the recorded process; a map left in
// the directory by an earlier process of the same pid passed over. Over a fake
// procfs in a temporary directory; the real thing (unshare(1) namespaces
// and perf script's reading of them) is in test/e2e/record_e2e.py.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "gilscan/symbols/live_process.h"
#include "gilscan/symbols/perf_map.h"
#include "support/test_util.h"

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kJit = 0x7f3a00001000;  // a recorded anonymous executable mapping

// PROC/PID with a status (NSpid pids) and maps of its own.
void fake_process(const fs::path& proc, int pid, const std::string& nspid, const std::string& maps) {
    fs::create_directories(proc / std::to_string(pid) / "root" / "tmp");
    std::ofstream(proc / std::to_string(pid) / "status")
        << "Name:\tpython3\nTgid:\t" << pid << "\nPid:\t" << pid << "\n" << nspid << "Threads:\t5\n";
    std::ofstream(proc / std::to_string(pid) / "maps") << maps;
}

const std::string kMaps =
    "55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234   /usr/bin/python3.12\n"
    "7f3a00000000-7f3a00002000 r-xp 00000000 00:00 0 \n"  // two trampoline arenas merged: 0x...1000 inside
    "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]\n";

AddressSpace space(int32_t pid, const std::string& marker = "") {
    AddressSpace as;
    as.pid = pid;
    as.maps[0x55d0c0000000] = Mapping{0x55d0c0000000, 0x55d0c0001000, 0, "/usr/bin/python3.12", "", 1234, true};
    as.maps[kJit] = Mapping{kJit, kJit + 0x1000, 0, "//anon", "", 0, true};
    as.maps[0x7f3a10000000] = Mapping{0x7f3a10000000, 0x7f3a10010000, 0, "//anon", "", 0, false};  // data: not JIT
    if (!marker.empty()) as.maps[0x7f3b00000000] = Mapping{0x7f3b00000000, 0x7f3b00001000, 0, marker, "", 99, true};
    return as;
}

}  // namespace

TEST_CASE("NSpid: the pid a process has in its innermost pid namespace") {
    CHECK(ns_pid_of_status("Name:\tpython3\nNSpid:\t1234\t7\nNSpgid:\t1234\t7\n") == 7);
    CHECK(ns_pid_of_status("NSpid:\t1234\n") == 1234);                // the first line; no namespace of its own
    CHECK(ns_pid_of_status("Pid:\t9\nNSpid:\t9000\t80\t3") == 3);    // nested, no newline at the end
    CHECK(ns_pid_of_status("Name:\tx\nPid:\t9\n") == 0);              // kernels before 4.1
    CHECK(ns_pid_of_status("NSpid:\t12x4\n") == 0);
    CHECK(ns_pid_of_status("NSpid:\t1234\t-7\n") == 0);
    CHECK(ns_pid_of_status("NSpid:\t99999999999\n") == 0);
    CHECK(ns_pid_of_status("XNSpid:\t5\n") == 0);
    CHECK(ns_pid_of_status("NSpid:\n") == 0);
}

TEST_CASE("an address in an executable mapping of /proc/PID/maps") {
    CHECK(in_executable_mapping(kMaps, 0x7f3a00000000));
    CHECK(in_executable_mapping(kMaps, 0x7f3a00001fff));
    CHECK_FALSE(in_executable_mapping(kMaps, 0x7f3a00002000));  // its end
    CHECK_FALSE(in_executable_mapping(kMaps, 0x55d0c0000000));  // r--p
    CHECK_FALSE(in_executable_mapping(kMaps, 0x7ffd00000010));  // rw-p
    CHECK_FALSE(in_executable_mapping("", 1));
    CHECK_FALSE(in_executable_mapping("garbage\n7f-\n-7f r-xp\n", 0x7f));
    CHECK(in_executable_mapping("10-20 --xp 0 0:0 0", 0x10));  // execute only, no newline
}

TEST_CASE("a recorded process runs still only where one of its JIT mappings is in /proc/PID/maps") {
    gilscan::test::TempDir dir("gilscan-live");
    const fs::path proc = dir.path / "proc";
    fake_process(proc, 1234, "NSpid:\t1234\t7\n", kMaps);
    fake_process(proc, 1300, "", kMaps);
    fake_process(proc, 1400, "NSpid:\t1400\n", "55d0c0000000-55d0c0001000 r-xp 00000000 08:01 1234 /x\n");
    const std::vector<uint64_t> jit = {0x7f3b00000000, kJit};
    LiveProcess p = live_process(proc.string(), 1234, jit);
    CHECK(p.running);
    CHECK(p.ns_pid == 7);
    CHECK(p.root == proc.string() + "/1234/root");
    CHECK(p.why.empty());
    p = live_process(proc.string(), 1300, jit);
    CHECK((p.running && p.ns_pid == 1300));  // no NSpid line: its pid
    p = live_process(proc.string(), 1400, jit);
    CHECK_FALSE(p.running);
    CHECK(p.why == "pid 1400 is another process now (none of the recorded JIT code's memory in " + proc.string() +
                       "/1400/maps)");
    p = live_process(proc.string(), 1234, std::vector<uint64_t>{0x7f3b00000000});
    CHECK_FALSE(p.running);
    p = live_process(proc.string(), 1500, jit);
    CHECK_FALSE(p.running);
    CHECK(p.why == "no " + proc.string() + "/1500: it has exited");
    CHECK_FALSE(live_process(proc.string(), 0, jit).running);
}

TEST_CASE("a running process's perf map in its own /tmp, named by its pid in its namespace") {
    gilscan::test::TempDir dir("gilscan-live");
    const fs::path proc = dir.path / "proc", host_tmp = dir.path / "tmp";
    fs::create_directories(host_tmp);
    fake_process(proc, 1234, "NSpid:\t1234\t7\n", kMaps);     // a container's python, pid 7 there
    fake_process(proc, 1300, "NSpid:\t1300\n", kMaps);        // PrivateTmp=: its own /tmp, the same pid
    fake_process(proc, 1400, "NSpid:\t1400\t8\n", "");        // a reused pid: other memory
    fake_process(proc, 1500, "NSpid:\t1500\t9\n", kMaps);     // runs, wrote nothing
    std::ofstream(proc / "1234" / "root" / "tmp" / "perf-7.map") << "7f3a00001000 40 py::spin:/app/w.py\n";
    std::ofstream(proc / "1234" / "root" / "tmp" / "perf-1234.map") << "7f3a00001000 40 wrong: the host pid\n";
    std::ofstream(host_tmp / "perf-7.map") << "7f3a00001000 40 wrong: the host's pid 7\n";
    std::ofstream(proc / "1300" / "root" / "tmp" / "perf-1300.map") << "7f3a00001000 40 py::private\nbad\n";
    std::ofstream(proc / "1400" / "root" / "tmp" / "perf-8.map") << "7f3a00001000 40 wrong: another process\n";
    PerfMaps maps(host_tmp.string(), proc.string());
    auto m = maps.of(space(1234));
    REQUIRE(m->find(kJit + 5));
    CHECK(m->find(kJit + 5)->name == "py::spin:/app/w.py");
    CHECK(m->source() == "perf-7.map");
    CHECK(maps.of(space(1300))->find(kJit)->name == "py::private");
    CHECK(maps.of(space(1400))->size() == 0);
    CHECK(maps.of(space(1500))->size() == 0);
    // The directory's own map of the pid comes first.
    std::ofstream(host_tmp / "perf-1600.map") << "7f3a00001000 40 py::host\n";
    fake_process(proc, 1600, "NSpid:\t1600\t3\n", kMaps);
    std::ofstream(proc / "1600" / "root" / "tmp" / "perf-3.map") << "7f3a00001000 40 py::inside\n";
    CHECK(maps.of(space(1600))->find(kJit)->name == "py::host");
    // A pid alone (no mappings to check the process by): the directory only.
    PerfMaps by_pid(host_tmp.string(), proc.string());
    CHECK(by_pid.of_pid(1234)->size() == 0);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 3);
    CHECK(problems[0] == proc.string() + "/1300/root/tmp/perf-1300.map: 1 line is not \"START SIZE NAME\" and was skipped");
    CHECK(problems[1] == "no perf map " + host_tmp.string() + "/perf-1400.map (No such file or directory) or jitdump "
                         "jit-1400.dump: process 1400's frames in anonymous memory (JIT code, Python's -X perf "
                         "trampolines) stay unnamed");
    CHECK(problems[2] == "no perf map " + host_tmp.string() + "/perf-1500.map (No such file or directory) or jitdump "
                         "jit-1500.dump; nor in the running process's own /tmp (" + proc.string() +
                         "/1500/root/tmp/) as perf-9.map or jit-9.dump: process 1500's frames in anonymous memory "
                         "(JIT code, Python's -X perf trampolines) stay unnamed");
}

TEST_CASE("a running process that shares the directory: no second mention of it") {
    gilscan::test::TempDir dir("gilscan-live");
    const fs::path proc = dir.path / "proc";
    fake_process(proc, 1234, "NSpid:\t1234\n", kMaps);
    // Its root is the host's: its /tmp is the directory.
    fs::remove_all(proc / "1234" / "root");
    fs::create_directories(dir.path / "host" / "tmp");
    fs::create_directory_symlink(dir.path / "host", proc / "1234" / "root");
    PerfMaps maps((dir.path / "host" / "tmp").string(), proc.string());
    CHECK(maps.of(space(1234))->size() == 0);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].find("nor in") == std::string::npos);
}

TEST_CASE("a map none of whose symbols lies in the process's JIT memory is another process's: passed over") {
    gilscan::test::TempDir dir("gilscan-live");
    const fs::path proc = dir.path / "proc", host_tmp = dir.path / "tmp";
    fs::create_directories(host_tmp);
    // The host's /tmp holds maps by pid 1234 and 1300 left by earlier
    // processes (their JIT code elsewhere); 1234 is a container's python,
    // still running, with its own map inside; 1300 has exited.
    fake_process(proc, 1234, "NSpid:\t1234\t7\n", kMaps);
    // (py::before ends where the JIT mapping starts.)
    std::ofstream(host_tmp / "perf-1234.map") << "7f3b00001000 40 py::stale\n7f3a00000000 1000 py::before\n";
    std::ofstream(proc / "1234" / "root" / "tmp" / "perf-7.map") << "7f3a00001000 40 py::spin:/app/w.py\n";
    std::ofstream(host_tmp / "perf-1300.map") << "7f3b00001000 40 py::stale\n";
    // 1400's map in the directory: one symbol overlapping its mapping from below is enough.
    std::ofstream(host_tmp / "perf-1400.map") << "7f3b00001000 40 py::elsewhere\n7f3a00000f00 200 py::straddles\n";
    // 1500's is empty (a process that had written nothing yet): nothing to tell by, kept.
    std::ofstream(host_tmp / "perf-1500.map") << "";
    PerfMaps maps(host_tmp.string(), proc.string());
    const auto m = maps.of(space(1234));
    REQUIRE(m->find(kJit + 5));
    CHECK(m->find(kJit + 5)->name == "py::spin:/app/w.py");
    CHECK(m->source() == "perf-7.map");
    CHECK(maps.of(space(1300))->size() == 0);
    CHECK(maps.of(space(1400))->find(kJit)->name == "py::straddles");
    CHECK(maps.of(space(1500))->size() == 0);
    // A pid alone has no memory to check against: the directory's map is taken.
    CHECK(PerfMaps(host_tmp.string(), proc.string()).of_pid(1300)->size() == 1);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 3);
    CHECK(problems[0] == host_tmp.string() + "/perf-1234.map: none of its 2 symbols lies in process 1234's JIT memory; "
                                             "not used (an earlier process's with the same pid?)");
    CHECK(problems[1].rfind(host_tmp.string() + "/perf-1300.map: none of its 1 symbols", 0) == 0);
    CHECK(problems[2].rfind("no perf map " + host_tmp.string() + "/perf-1300.map (another process's) or jitdump "
                            "jit-1300.dump: process 1300's", 0) == 0);
}
