// Perf maps (/tmp/perf-PID.map): the parser and lookup, the per-pid reader,
// and JIT frames named in sleep stacks on a -X perf recording, checked
// against what `perf script` named there while the map was in /tmp
// (testdata/stacks_py312_perfmap.jit.json, testdata/record_stacks.sh), and
// each GIL wait's Python function (--gil-functions) against the first JIT
// frame past take_gil in perf script's stack (stacks_py312_perfmap.gilfn.json).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "gilscan/symbols/perf_map.h"
#include "support/perf_writer.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

TEST_CASE("a perf map line is START SIZE NAME in hex, the name to the end of the line; others are skipped") {
    const PerfMap m = PerfMap::parse(
        "7f0000001000 b py::spin:/w/workload.py\n"
        "0x7f0000002000 0x10 py::with spaces:<frozen importlib._bootstrap>\r\n"
        "\n"
        "7F0000003000 20 UPPER\n"
        "7f0000004000 b\n"                      // no name
        "7f0000005000 0 zero-size\n"            // nothing covered
        "zz 10 not hex\n"
        "7f0000006000  10 two spaces\n"         // perf's format has one
        "11112222333344445 10 seventeen digits\n"
        "ffffffffffffff00 200 wraps\n"          // start + size past 2^64
        "7f0000007000 10 no newline at the end");
    CHECK(m.size() == 4);
    CHECK(m.skipped_lines() == 6);
    REQUIRE(m.find(0x7f0000001000));
    CHECK(m.find(0x7f0000001000)->name == "py::spin:/w/workload.py");
    CHECK(m.find(0x7f000000100a)->name == "py::spin:/w/workload.py");
    CHECK_FALSE(m.find(0x7f000000100b));  // past its 0xb bytes
    CHECK_FALSE(m.find(0x7f0000000fff));
    REQUIRE(m.find(0x7f000000200f));
    CHECK(m.find(0x7f000000200f)->name == "py::with spaces:<frozen importlib._bootstrap>");  // no \r
    CHECK(m.find(0x7f000000301f)->name == "UPPER");
    CHECK_FALSE(m.find(0x7f0000004000));
    CHECK_FALSE(m.find(0x7f0000005000));
    CHECK_FALSE(m.find(0x7f0000006000));
    CHECK(m.find(0x7f0000007000)->name == "no newline at the end");
    CHECK_FALSE(m.find(0));
    CHECK_FALSE(m.find(~uint64_t{0}));
    CHECK(PerfMap::parse("").size() == 0);
}

TEST_CASE("a pc is named by the symbol starting last at or below it; of equal starts, the line written last") {
    const PerfMap m = PerfMap::parse(
        "3000 10 later\n"
        "1000 100 outer\n"
        "1000 8 old\n"
        "1000 8 new\n"
        "1040 10 inner\n");
    CHECK(m.find(0x1000)->name == "new");  // written after "old" and "outer" at the same start
    CHECK(m.find(0x1007)->name == "new");
    CHECK_FALSE(m.find(0x1008));           // "new" ends there; a nested range is not searched for
    CHECK(m.find(0x1045)->name == "inner");
    CHECK(m.find(0x3000)->name == "later");
    CHECK_FALSE(m.find(0x2000));
}

TEST_CASE("only anonymous memory is named from a perf map, as perf does") {
    for (const char* p : {"//anon", "/dev/zero (deleted)", "/anon_hugepage (deleted)", "[anon:jit]", "[heap]",
                          "[stack]", "/SYSV00000000"})
        CHECK_MESSAGE(is_jit_mapping(p), p);
    for (const char* p : {"/usr/lib/x86_64-linux-gnu/libc.so.6", "[vdso]", "[uprobes]", "//anonymous", "", "/tmp/x",
                          "[heapx]"})
        CHECK_MESSAGE(!is_jit_mapping(p), p);
}

TEST_CASE("perf maps are read once per pid from the directory; a missing or damaged one is reported") {
    TempDir dir("gilscan-perfmap");
    std::ofstream(dir.path / "perf-5.map") << "1000 10 five\n";
    std::ofstream(dir.path / "perf-7.map") << "1000 10 seven\nbad line\n2000 20 more\n";
    PerfMaps maps(dir.path.string());
    auto five = maps.of_pid(5);
    REQUIRE(five);
    CHECK(five->find(0x1000)->name == "five");
    std::ofstream(dir.path / "perf-5.map") << "1000 10 rewritten\n";
    CHECK(maps.of_pid(5) == five);  // not read again
    CHECK(maps.of_pid(7)->size() == 2);
    CHECK(maps.of_pid(6)->size() == 0);
    CHECK(maps.of_pid(6)->size() == 0);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 2);  // each once, sorted
    CHECK(problems[0] == dir.path.string() + "/perf-7.map: 1 line is not \"START SIZE NAME\" and was skipped");
    CHECK(problems[1].rfind("no perf map " + dir.path.string() +
                                "/perf-6.map (No such file or directory) or jitdump jit-6.dump: process 6's",
                            0) == 0);
    PerfMaps none("");
    CHECK(none.of_pid(5)->size() == 0);
    CHECK(none.problems().empty());
}

TEST_CASE("missing perf maps: the first few by pid, then how many more") {
    TempDir dir("gilscan-perfmap");
    std::ofstream(dir.path / "perf-3.map") << "1000 10 three\nnot a line\nnor this\n";
    PerfMaps maps(dir.path.string());
    const size_t missing = PerfMaps::kMissingShown + 3;
    for (int32_t pid = static_cast<int32_t>(missing) + 3; pid >= 4; --pid) CHECK(maps.of_pid(pid * 10)->size() == 0);
    CHECK(maps.of_pid(3)->size() == 1);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 1 + PerfMaps::kMissingShown + 1);
    CHECK(problems[0] == dir.path.string() + "/perf-3.map: 2 lines are not \"START SIZE NAME\" and were skipped");
    for (size_t i = 0; i < PerfMaps::kMissingShown; ++i)  // the lowest pids, in order
        CHECK(problems[1 + i].find("/perf-" + std::to_string((i + 4) * 10) + ".map (") != std::string::npos);
    CHECK(problems.back() == "and 3 more processes with no perf map or jitdump in " + dir.path.string() +
                                 ": their frames in anonymous memory stay unnamed");
    PerfMaps few(dir.path.string());
    for (int32_t pid = 1; pid <= static_cast<int32_t>(PerfMaps::kMissingShown); ++pid) few.of_pid(pid + 100);
    CHECK(few.problems().size() == PerfMaps::kMissingShown);  // all shown: no "more" line
}

namespace {

// The JIT frames ("... (perf-PID.map)" or "... (jit-PID.dump)") of a sleep
// stack's text, without their offsets: "py::spin:/w/workload.py+0x5
// (perf-1.map)" -> "py::spin:/w/workload.py".
std::vector<std::string> jit_names(std::string_view stack_json, std::string* map_seen = nullptr) {
    std::vector<std::string> out;
    if (stack_json.empty()) return out;
    for (const auto& f : nlohmann::json::parse(stack_json)) {
        const std::string s = f.get<std::string>();
        size_t at = s.rfind(" (perf-");
        if (at == std::string::npos) at = s.rfind(" (jit-");
        if (at == std::string::npos) continue;
        if (map_seen) *map_seen = s.substr(at + 2, s.size() - at - 3);
        out.push_back(s.substr(0, s.rfind("+0x", at)));
    }
    return out;
}

// stacks_py312_perfmap.data through a classifier naming stack_frames user
// frames (0: none, the answer alone), JIT frames from perf_maps ("": none),
// GIL waits' Python functions looked for or not; `each` sees every sleep's label
// with the classifier and the maps of the moment. Returns the module cache's
// perf map problems and its modules'.
template <class F>
std::vector<std::string> classify_perfmap_sleeps(const std::string& perf_maps, F&& each, unsigned stack_frames = 64,
                                                 bool gil_functions = false,
                                                 const std::string& data = "stacks_py312_perfmap.data") {
    Session s(std::string(GILSCAN_TESTDATA) + "/" + data);
    ProcessMaps maps;
    ModuleOptions mo;
    mo.perf_maps = perf_maps;
    ModuleCache modules(mo);
    GilStackClassifier gsc(&maps, modules, stack_frames, s.features().os_release, nullptr, /*background=*/false);
    gsc.set_gil_functions(gil_functions);
    Collect sink;
    Timeline tl(s, sink);
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        gsc.classify(smp, ev, ps, label);
        if (ps.cls == StateClass::Sleeping) each(smp, label, gsc, maps);
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
    // With the modules' own ("cannot unwind through" each): a jitdump's
    // marker mapping is no module to complain of.
    std::vector<std::string> problems = modules.perf_maps().problems();
    for (const auto& p : modules.problems()) problems.push_back(p);
    return problems;
}

}  // namespace

TEST_CASE("sleep stacks name -X perf trampolines as perf script does from the same perf map") {
    std::map<std::pair<int32_t, uint64_t>, std::vector<std::string>> want;  // (tid, switch-out) -> perf script's
    std::ifstream jf(std::string(GILSCAN_TESTDATA) + "/stacks_py312_perfmap.jit.json");
    REQUIRE(jf.good());
    for (const auto& s : nlohmann::json::parse(jf))
        want[{s[0].get<int32_t>(), s[1].get<uint64_t>()}] = s[2].get<std::vector<std::string>>();
    REQUIRE(want.size() >= 50);

    for (const bool with_maps : {true, false}) {
        CAPTURE(with_maps);
        uint64_t sleeps = 0, same = 0, named = 0, gil_named = 0;
        const auto problems = classify_perfmap_sleeps(
            with_maps ? std::string(GILSCAN_TESTDATA) + "/perf-maps" : std::string(),
            [&](const Sample& smp, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
                if (label.stack().empty()) return;
                ++sleeps;
                const auto mine = jit_names(label.stack());
                auto it = want.find({smp.tid, smp.time});
                const std::vector<std::string> theirs = it == want.end() ? std::vector<std::string>{} : it->second;
                if (with_maps) {
                    same += mine == theirs;
                    named += !mine.empty();
                    gil_named += label.name == "S(GIL)" && !mine.empty();
                } else {
                    same += mine.empty() && (theirs.empty() || label.stack().find("(anon)") != std::string::npos);
                }
            });
        MESSAGE(sleeps << " sleep stacks, " << named << " with JIT frames named (" << gil_named << " S(GIL))");
        CHECK(sleeps >= want.size());
        CHECK(same == sleeps);  // with the map: perf script's names; without: "0x... (anon)" as before
        // Without a directory nothing is read or reported.
        CHECK(problems.empty());
        if (with_maps) {
            CHECK(named == want.size());
            CHECK(gil_named >= 30);  // the point: which Python function waits for the GIL
        }
    }
}

TEST_CASE("a stack through JIT code is another text in another process of the same layout and pcs") {
    // A forked CPython's trampolines sit where its parent's did, for other
    // functions: frames named from a perf map are the process's own. The
    // same sleeps classified again as another pid's (a copy of the address
    // space: same layout, same pcs), whose map names every function
    // differently, must carry that map's names, not the first process's
    // texts kept for the same pcs.
    TempDir dir("gilscan-perfmap");
    const std::string recorded = "perf-23131.map";  // stacks_py312_perfmap.data's python
    fs::copy_file(fs::path(GILSCAN_TESTDATA) / "perf-maps" / recorded, dir.path / recorded);
    {
        std::ifstream in(dir.path / recorded);
        std::ofstream out(dir.path / "perf-777.map");
        for (std::string line; std::getline(in, line);) {
            const size_t name = line.find(' ', line.find(' ') + 1) + 1;
            out << line.substr(0, name) << "other::" << line.substr(name) << '\n';
        }
    }
    uint64_t jit = 0, other = 0, functions = 0;
    classify_perfmap_sleeps(dir.path.string(), [&](const Sample& smp, const SleepLabel& label,
                                                   GilStackClassifier& gsc, const ProcessMaps& maps) {
        std::string map_seen;
        const auto mine = jit_names(label.stack(), &map_seen);
        if (mine.empty()) return;
        ++jit;
        CHECK(map_seen == recorded);
        AddressSpace copy = *maps.space(smp.pid);
        copy.pid = 777;
        SleepLabel again;
        gsc.classify_into(&copy, smp, again);
        std::string again_map;
        const auto names = jit_names(again.stack(), &again_map);
        bool all_other = names.size() == mine.size() && again_map == "perf-777.map";
        for (size_t i = 0; all_other && i < names.size(); ++i) all_other = names[i] == "other::" + mine[i];
        other += all_other;
        CHECK(again.name == label.name);
        // A GIL wait's function, too, is the process's own.
        if (!label.function.empty()) ++functions;
        if (!label.function.empty()) CHECK(again.function == "other::" + std::string(label.function));
    }, 64, true);
    CHECK(jit >= 50);
    CHECK(other == jit);
    CHECK(functions >= 50);
}

TEST_CASE("a GIL wait's Python function is perf script's first JIT frame past take_gil") {
    // (tid, switch-out) -> the function, "" where perf script names none, of
    // every sleep whose perf script stack holds take_gil.
    std::map<std::pair<int32_t, uint64_t>, std::string> want;
    std::ifstream jf(std::string(GILSCAN_TESTDATA) + "/stacks_py312_perfmap.gilfn.json");
    REQUIRE(jf.good());
    for (const auto& s : nlohmann::json::parse(jf))
        want[{s[0].get<int32_t>(), s[1].get<uint64_t>()}] = s[2].is_null() ? "" : s[2].get<std::string>();
    REQUIRE(want.size() >= 50);
    const std::string maps_dir = std::string(GILSCAN_TESTDATA) + "/perf-maps";
    // 0: the answer's unwind, on past take_gil for the function; 4: a
    // stack of 4 frames kept, the function sought deeper (the trampoline is
    // frame 5 or more here); 64: found within the kept stack.
    for (const unsigned frames : {0u, 4u, 64u}) {
        CAPTURE(frames);
        uint64_t gil = 0, same = 0, named = 0, other_named = 0, beyond = 0;
        std::string stacks_text;
        classify_perfmap_sleeps(
            maps_dir,
            [&](const Sample& smp, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
                stacks_text += label.stack();
                auto it = want.find({smp.tid, smp.time});
                if (it == want.end()) {
                    other_named += !label.function.empty() || label.gil;
                    return;
                }
                gil += label.gil;
                same += label.gil && label.function == it->second;
                named += !label.function.empty();
                // Named from a frame the kept stack does not reach.
                beyond += frames && !label.function.empty() && label.stack().find(label.function) == std::string::npos;
            },
            frames, true);
        MESSAGE(frames << " frames: " << gil << " GIL waits, " << named << " with a function");
        CHECK(gil == want.size());
        CHECK(same == want.size());
        CHECK(named >= 55);  // all but the 3 perf script names none for (the threads' first take)
        CHECK(other_named == 0);
        // The kept stacks are the option's alone to leave as they are.
        std::string plain_text;
        uint64_t plain_named = 0;
        classify_perfmap_sleeps(
            maps_dir,
            [&](const Sample&, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
                plain_text += label.stack();
                plain_named += !label.function.empty();
            },
            frames, false);
        CHECK(plain_text == stacks_text);
        CHECK(plain_named == 0);  // not looked for without the option
        if (frames == 4) CHECK(beyond >= 50);  // sought past the 4 frames kept
        else CHECK(beyond == 0);
    }
    // Without a perf map the frames stay unnamed: no function, the same waits.
    uint64_t gil = 0, named = 0;
    classify_perfmap_sleeps(
        "", [&](const Sample&, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
            gil += label.gil;
            named += !label.function.empty();
        },
        0, true);
    CHECK(gil == want.size());
    CHECK(named == 0);
}

// CPython 3.13's -X perf_jit: testdata/stacks_py313_perfjit.data and the
// jitdump its python wrote (perf-maps/jit-PID.dump), against perf script on
// the recording `perf inject --jit` made of them (testdata/record_stacks.sh):
// perf names each trampoline from the ELF file inject wrote for it and
// unwinds through it by the CFI the dump gave; gilscan reads the dump.
namespace {
std::map<std::pair<int32_t, uint64_t>, nlohmann::json> truth_of(const std::string& file) {
    std::map<std::pair<int32_t, uint64_t>, nlohmann::json> want;
    std::ifstream jf(std::string(GILSCAN_TESTDATA) + "/" + file);
    REQUIRE(jf.good());
    for (const auto& s : nlohmann::json::parse(jf)) want[{s[0].get<int32_t>(), s[1].get<uint64_t>()}] = s[2];
    return want;
}
}  // namespace

TEST_CASE("-X perf_jit: sleep stacks name and unwind through the trampolines from the jitdump, as perf after inject") {
    const auto want = truth_of("stacks_py313_perfjit.jit.json");
    REQUIRE(want.size() >= 50);
    for (const bool with_dump : {true, false}) {
        CAPTURE(with_dump);
        uint64_t sleeps = 0, same = 0, named = 0, deep = 0, anon = 0;
        const auto problems = classify_perfmap_sleeps(
            with_dump ? std::string(GILSCAN_TESTDATA) + "/perf-maps" : std::string(),
            [&](const Sample& smp, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
                if (label.stack().empty()) return;
                ++sleeps;
                std::string source;
                const auto mine = jit_names(label.stack(), &source);
                auto it = want.find({smp.tid, smp.time});
                const auto theirs =
                    it == want.end() ? std::vector<std::string>{} : it->second.get<std::vector<std::string>>();
                same += mine == theirs;
                named += !mine.empty();
                deep += mine.size() >= 3;  // unwound on through a trampoline or more
                anon += label.stack().find("(anon)") != std::string::npos;
                if (!mine.empty()) CHECK(source.rfind("jit-", 0) == 0);
            },
            64, false, "stacks_py313_perfjit.data");
        MESSAGE(sleeps << " sleep stacks, " << named << " with JIT frames, " << deep << " with 3 or more");
        CHECK(problems.empty());
        if (with_dump) {
            CHECK(same == sleeps);  // every sleep's Python frames, all of them, in perf's order
            CHECK(named == want.size());
            CHECK(deep >= 50);
            CHECK(anon == 0);
        } else {
            // No dump read: the frames stay unnamed and the unwind ends at
            // the first trampoline (no CFI, no frame pointer), as before.
            CHECK(named == 0);
            CHECK(anon >= want.size());
        }
    }
}

TEST_CASE("-X perf_jit: a GIL wait's Python function is perf script's first JIT frame past take_gil after inject") {
    const auto want = truth_of("stacks_py313_perfjit.gilfn.json");
    REQUIRE(want.size() >= 30);
    uint64_t gil = 0, same = 0, named = 0, other = 0;
    classify_perfmap_sleeps(
        std::string(GILSCAN_TESTDATA) + "/perf-maps",
        [&](const Sample& smp, const SleepLabel& label, GilStackClassifier&, const ProcessMaps&) {
            auto it = want.find({smp.tid, smp.time});
            if (it == want.end()) {
                other += label.gil || !label.function.empty();
                return;
            }
            gil += label.gil;
            same += label.gil && label.function == (it->second.is_null() ? "" : it->second.get<std::string>());
            named += !label.function.empty();
        },
        0, true, "stacks_py313_perfjit.data");
    MESSAGE(gil << " GIL waits, " << named << " with a function");
    CHECK(gil == want.size());
    CHECK(same == want.size());
    CHECK(named + 5 >= want.size());
    CHECK(other == 0);
}

