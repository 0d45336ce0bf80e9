// Stack classification against ground truth: each testdata/stacks_*.data was
// recorded beside a system-wide take_gil uprobe recording
// (testdata/record_stacks.sh); test/e2e/stack_truth.py turned that into
// stacks_*.truth.json. gilscan reads only the .data file here.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

void check_against_truth(const std::string& name) {
    CAPTURE(name);
    const fs::path dir = GILSCAN_TESTDATA;
    std::ifstream tf(dir / ("stacks_" + name + ".truth.json"));
    REQUIRE(tf.good());
    nlohmann::json truth = nlohmann::json::parse(tf);
    StackAnalysis a = analyse_with_stacks((dir / ("stacks_" + name + ".data")).string());
    CHECK(a.module_problems.empty());
    std::map<std::pair<int32_t, uint64_t>, std::string> label;  // (tid, switch-out) -> span name
    for (const auto& s : a.spans.spans)
        if (s.kind == SpanKind::Sleep) label[{s.tid, s.start}] = s.name;
    uint64_t gil_waits = 0, found = 0, labelled = 0, right = 0, matched = 0;
    for (const auto& s : truth["sleeps"]) {
        auto it = label.find({s[0].get<int32_t>(), s[1].get<uint64_t>()});
        if (it == label.end()) continue;
        ++matched;
        const bool truth_gil = s[2].get<bool>();
        const bool said_gil = it->second == "S(GIL)";
        gil_waits += truth_gil;
        found += truth_gil && said_gil;
        labelled += said_gil;
        right += truth_gil && said_gil;
    }
    MESSAGE(name << ": " << found << "/" << gil_waits << " GIL waits labelled S(GIL), " << right << "/" << labelled
                 << " S(GIL) labels right; stacks " << a.stack_stats.decided << " decided of "
                 << a.stack_stats.sleeps_seen);
    CHECK(matched == truth["sleeps"].size());  // every sleep of the truth is a sleep span here
    REQUIRE(gil_waits >= 50);
    CHECK(static_cast<double>(found) >= 0.97 * static_cast<double>(gil_waits));
    CHECK(static_cast<double>(right) >= 0.99 * static_cast<double>(labelled));
}

}  // namespace

TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 3.9") { check_against_truth("py39"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 3.11") { check_against_truth("py311"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 3.12") { check_against_truth("py312"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 3.12 -X perf") { check_against_truth("py312_xperf"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 3.13") { check_against_truth("py313"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: through the pyenv shim (bash that execs)") { check_against_truth("shim"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: pipe mode") { check_against_truth("pipe"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: zstd") { check_against_truth("zstd"); }
// Python 2: no take_gil; PyThread_acquire_lock called from ceval.c's GIL
// takers (truth: uprobes on those call sites and where they return), with
// threading.Lock waits in the same function beside them.
TEST_CASE("S(GIL) from stacks vs uprobe truth: pyenv 2.7") { check_against_truth("py27"); }
TEST_CASE("S(GIL) from stacks vs uprobe truth: Debian's stripped python3.11") { check_against_truth("debian"); }

TEST_CASE("a missing binary is reported once and leaves the sleep plain S") {
    // --symfs pointing at an empty tree does not hide the real path, so use a
    // recording whose python is looked for under a build-id that cannot match.
    ProcessMaps maps;
    ModuleOptions mo;
    mo.build_ids["/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"] = "00112233445566778899aabbccddeeff00112233";
    ModuleCache modules(mo);
    Mapping m;
    m.start = 0x7f0000000000;
    m.end = m.start + 0x1000;
    m.path = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
    CHECK(modules.get(m) == nullptr);
    CHECK(modules.get(m) == nullptr);
    REQUIRE(modules.problems().size() == 1);
    CHECK(modules.problems()[0].find("changed since the recording") != std::string::npos);
}

TEST_CASE("one module cache shared by threads loads each binary once") {
    ModuleCache modules(ModuleOptions{});
    Mapping libc, missing;
    libc.start = 0x7f0000000000;
    libc.end = libc.start + 0x1000;
    libc.path = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    missing = libc;
    missing.path = "/nonexistent/libmissing.so";
    std::vector<const Module*> seen(8);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < seen.size(); ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 200; ++i) {
                seen[t] = modules.get(libc);
                CHECK_FALSE(modules.get(missing));
            }
        });
    for (auto& th : threads) th.join();
    REQUIRE(seen[0] != nullptr);
    for (const Module* m : seen) CHECK(m == seen[0]);
    CHECK(modules.problems().size() == 1);  // the missing one, named once
}

namespace {

// stacks_py311.data opened, with the maps and modules its classifiers share
// (a fixture: the test cases see s, release, maps and modules).
struct Py311Sleeps {
    Session s{std::string(GILSCAN_TESTDATA) + "/stacks_py311.data"};
    const std::string release = s.features().os_release;
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
};

}  // namespace

TEST_CASE_FIXTURE(Py311Sleeps, "sleep stacks read the same while /proc/kallsyms is still being read (user frames named first)") {
    // The first sleeps usually come before the background read of the kernel
    // symbols is done: the classifier then names the user frames first (the
    // modules' DWARF loads meanwhile) and puts the kernel frames in front
    // after. Here the read is held back until the user frames of the first
    // sleep have been named, and every label must equal a classifier's whose
    // kernel symbols were there from the start.
    GilStackClassifier ready(&maps, modules, 64, release, nullptr, /*background=*/false);
    auto names = std::make_shared<GilStackClassifier::NameCache>(release, false);
    std::promise<std::shared_ptr<const KernelSymbols>> later;
    names->ksyms = later.get_future().share();
    GilStackClassifier held(&maps, modules, 64, release, names);
    bool user_names_first = false;
    std::thread reader([&] {
        for (int i = 0; i < 12000 && !user_names_first; ++i) {  // up to a minute (sanitizers)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::lock_guard<std::mutex> l(names->mu);
            for (const auto& [layout, pcs] : names->names) user_names_first |= !pcs.empty();
        }
        later.set_value(std::make_shared<KernelSymbols>(release));
    });
    uint64_t sleeps = 0, same = 0, stacks = 0, with_kernel = 0;
    classify_side_by_side(s, maps, ready, held, [&](const PrevState& ps, const SleepLabel& label, const SleepLabel& other) {
        if (ps.cls != StateClass::Sleeping) return;
        ++sleeps;
        same += label.name == other.name && label.evidence() == other.evidence() && label.stack() == other.stack();
        if (label.stack().empty()) return;
        ++stacks;
        with_kernel += label.stack().rfind("[\"", 0) == 0 && label.stack().find("([kernel])") != std::string::npos;
    });
    reader.join();
    CHECK(user_names_first);
    CHECK(sleeps > 100);
    CHECK(same == sleeps);
    CHECK(stacks > 100);
    CHECK(with_kernel == stacks);  // every stack has its kernel part
}

namespace {

// The sleeps of stacks_py311.data, classified by a reference classifier with
// a cache of its own; `each` gets every sleep with a user stack, its event,
// state and the reference label.
template <class F>
void for_each_stack_sleep(ProcessMaps& maps, ModuleCache& modules, const std::string& release, F&& each) {
    const std::string path = std::string(GILSCAN_TESTDATA) + "/stacks_py311.data";
    Session s(path);
    GilStackClassifier ref(&maps, modules, 64, release, nullptr, /*background=*/false);
    Collect sink;
    Timeline tl(s, sink);
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        ref.classify(smp, ev, ps, label);
        if (ps.cls == StateClass::Sleeping && label.stack().find("(libpython") != std::string::npos)
            each(smp, ev, ps, label);
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
}

}  // namespace

TEST_CASE("-j 2's reader never waits for a frame the stages are naming: it leaves that sleep, naming the rest") {
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
    const std::string release = Session(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data").features().os_release;
    // Both share `names` without a symbolizer, as -j 2's two threads do
    // (its kernel symbols read already).
    std::promise<std::shared_ptr<const KernelSymbols>> ready;
    ready.set_value(std::make_shared<KernelSymbols>(release));
    auto names = std::make_shared<GilStackClassifier::NameCache>(release, false);
    names->ksyms = ready.get_future().share();
    GilStackClassifier reader(&maps, modules, 64, release, names);
    reader.set_never_wait(true);
    auto own = std::make_shared<GilStackClassifier::NameCache>(release, false);  // to learn a stack's frames
    own->ksyms = names->ksyms;
    GilStackClassifier probe(&maps, modules, 64, release, own);
    uint64_t sleeps = 0, same = 0;
    bool checked_abandon = false;
    for_each_stack_sleep(maps, modules, release, [&](const Sample& smp, const EventInfo& ev, const PrevState& ps,
                                                     const SleepLabel& want) {
        ++sleeps;
        SleepLabel got;
        if (!checked_abandon) {
            // This stack's frames, as keys of the cache.
            probe.classify(smp, ev, ps, got);
            std::set<std::pair<uint64_t, uint64_t>> keys;
            {
                std::lock_guard<std::mutex> l(own->mu);
                for (const auto& [layout, pcs] : own->names)
                    for (const auto& [pc, text] : pcs) keys.insert({layout, pc});
            }
            REQUIRE(keys.size() >= 3);
            // The innermost... any one frame "being named" by the other thread.
            const auto busy = *keys.begin();
            {
                std::lock_guard<std::mutex> l(names->mu);
                names->pending.insert(busy);
            }
            const StackStats before = reader.stats();
            reader.classify(smp, ev, ps, got);
            CHECK(reader.abandoned());
            CHECK(got.name.empty());
            CHECK(got.stack().empty());
            CHECK(reader.stats().sleeps_seen == before.sleeps_seen);
            CHECK(reader.stats().decided == before.decided);
            CHECK(named_frames(*names) == keys.size() - 1);  // every other frame named meanwhile
            // A classifier that waits (the stages') blocks on that frame and
            // takes the other thread's text for it.
            GilStackClassifier stages(&maps, modules, 64, release, names);
            std::atomic<bool> done{false};
            SleepLabel waited;
            std::thread t([&] {
                stages.classify(smp, ev, ps, waited);
                done = true;
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            CHECK_FALSE(done.load());
            {
                std::lock_guard<std::mutex> l(names->mu);
                names->names[busy.first].emplace(busy.second, "\"named by the other thread\"");
                names->pending.erase(busy);
            }
            names->named.notify_all();
            t.join();
            CHECK_FALSE(stages.abandoned());
            CHECK(waited.stack().find("\"named by the other thread\"") != std::string::npos);
            {
                std::lock_guard<std::mutex> l(names->mu);  // its real text, for the sleeps below
                names->names[busy.first].erase(busy.second);
            }
            checked_abandon = true;
        }
        reader.classify(smp, ev, ps, got);
        CHECK_FALSE(reader.abandoned());
        same += got.name == want.name && got.evidence() == want.evidence() && got.stack() == want.stack();
    });
    CHECK(checked_abandon);
    CHECK(sleeps > 100);
    CHECK(same == sleeps);
}

TEST_CASE("-j 2's reader does not wait for /proc/kallsyms: it names the user frames and leaves the sleep") {
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
    const std::string release = Session(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data").features().os_release;
    auto names = std::make_shared<GilStackClassifier::NameCache>(release, false);
    std::promise<std::shared_ptr<const KernelSymbols>> later;
    names->ksyms = later.get_future().share();
    GilStackClassifier reader(&maps, modules, 64, release, names);
    reader.set_never_wait(true);
    uint64_t sleeps = 0, same = 0, abandoned = 0;
    for_each_stack_sleep(maps, modules, release, [&](const Sample& smp, const EventInfo& ev, const PrevState& ps,
                                                     const SleepLabel& want) {
        SleepLabel got;
        if (sleeps++ == 0) {
            reader.classify(smp, ev, ps, got);
            abandoned += reader.abandoned();
            CHECK(got.stack().empty());
            CHECK(named_frames(*names) >= 3);  // its user frames
            later.set_value(std::make_shared<KernelSymbols>(release));
        }
        reader.classify(smp, ev, ps, got);
        CHECK_FALSE(reader.abandoned());
        same += got.name == want.name && got.evidence() == want.evidence() && got.stack() == want.stack();
    });
    CHECK(abandoned == 1);
    CHECK(sleeps > 100);
    CHECK(same == sleeps);
}

TEST_CASE("a summary-only run's labels give the same answer without the evidence text, here and on -j workers") {
    // SleepLabel::text false (no trace written): the label's name, GIL flag
    // and counts are what a trace run gets; only the matching frame's
    // evidence text is not built. The same through the -j workers, told by
    // ParallelStackClassifier::set_text.
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
    const std::string release = Session(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data").features().os_release;
    GilStackClassifier summary_only(&maps, modules, 0, release, nullptr, /*background=*/false);
    ParallelStackClassifier workers(1, ModuleOptions(), 0, release);
    workers.set_text(false);
    ParallelStackClassifier traced_workers(1, ModuleOptions(), 0, release);  // texts by default
    uint64_t sleeps = 0, decided_with_text = 0, same = 0, no_text = 0;
    std::vector<std::tuple<int64_t, int64_t, SleepLabel>> tickets;  // (summary-only, traced, reference)
    for_each_stack_sleep(maps, modules, release, [&](const Sample& smp, const EventInfo& ev, const PrevState& ps,
                                                     const SleepLabel& want) {
        ++sleeps;
        decided_with_text += !want.evidence_built.empty();
        SleepLabel got;
        got.text = false;  // as the timeline sets it when no span is wanted
        summary_only.classify(smp, ev, ps, got);
        same += got.name == want.name && got.gil == want.gil;
        no_text += got.evidence().empty();
        tickets.emplace_back(workers.submit(maps.snapshot(smp.pid), smp),
                             traced_workers.submit(maps.snapshot(smp.pid), smp), want);
    });
    CHECK(sleeps > 100);
    CHECK(decided_with_text > 50);  // the reference (a trace run) has the texts
    CHECK(same == sleeps);
    CHECK(no_text == sleeps);
    CHECK(summary_only.stats().gil + summary_only.stats().handoff == decided_with_text);
    uint64_t w_same = 0, w_no_text = 0, t_same = 0;
    for (const auto& [ticket, traced, want] : tickets) {
        std::optional<SleepLabel> got = workers.resolve(ticket, true);
        std::optional<SleepLabel> full = traced_workers.resolve(traced, true);
        REQUIRE(got);
        REQUIRE(full);
        w_same += got->name == want.name && got->gil == want.gil;
        w_no_text += got->evidence().empty();
        t_same += full->name == want.name && full->evidence() == want.evidence();
    }
    CHECK(w_same == sleeps);
    CHECK(w_no_text == sleeps);
    CHECK(t_same == sleeps);
}

TEST_CASE("-j workers: a label the decoding thread made itself, for want of room, is resolved without waiting") {
    // With no room queued for the workers (as when they are 8 batches
    // behind), a staged batch is labelled on the decoding thread when a
    // resolve(wait) hands it over. The ticket waited for can be in it: that
    // resolve must take its label rather than wait for a worker that never
    // had the job. (It waited for ever before.)
    ProcessMaps maps;
    ModuleCache modules{ModuleOptions()};
    const std::string release = Session(std::string(GILSCAN_TESTDATA) + "/stacks_py311.data").features().os_release;
    ParallelStackClassifier no_room(1, ModuleOptions(), 0, release, /*max_queued_batches=*/0);
    std::vector<std::pair<int64_t, SleepLabel>> tickets;
    for_each_stack_sleep(maps, modules, release, [&](const Sample& smp, const EventInfo&, const PrevState&,
                                                     const SleepLabel& want) {
        if (tickets.size() < 5) tickets.emplace_back(no_room.submit(maps.snapshot(smp.pid), smp), want);  // staged
    });
    REQUIRE(tickets.size() == 5);
    // On a thread of its own, so that a wait for ever fails the test instead of hanging it.
    std::promise<size_t> same;
    std::future<size_t> result = same.get_future();
    std::thread t([&] {
        size_t n = 0;
        for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {  // the newest first
            std::optional<SleepLabel> got = no_room.resolve(it->first, true);
            n += got && got->name == it->second.name && got->gil == it->second.gil;
        }
        same.set_value(n);
    });
    if (result.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
        FAIL_CHECK("resolve(wait) still waiting after 60 s");
        std::fflush(nullptr);
        std::_Exit(1);  // the thread cannot be stopped
    }
    t.join();
    CHECK(result.get() == tickets.size());
}

TEST_CASE_FIXTURE(Py311Sleeps, "a kept stack text is byte for byte what building the stack again gives") {
    // The same sleeps through a classifier that keeps each distinct stack's
    // text once (the default) and one that builds every text (no room to
    // keep any): the same labels, the kept ones shared between sleeps.
    GilStackClassifier keeping(&maps, modules, 64, release, nullptr, /*background=*/false);
    GilStackClassifier building(&maps, modules, 64, release, nullptr, /*background=*/false);
    building.limit_stack_texts(0);
    struct StackSpans : SpanSink {
        uint64_t with_stack = 0, stable = 0;
        void span(const Span& sp) override {
            with_stack += !sp.stack_json.empty();
            stable += sp.stack_stable;
        }
    } sink;
    Timeline tl(s, sink);
    uint64_t stacks = 0, same = 0, shared = 0, owned = 0;
    std::set<const std::string*> texts;
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        SleepLabel built;
        keeping.classify(smp, ev, ps, label);
        building.classify(smp, ev, ps, built);
        if (ps.cls != StateClass::Sleeping || built.stack().empty()) return;
        ++stacks;
        same += label.name == built.name && label.evidence() == built.evidence() && label.stack() == built.stack();
        shared += label.stack_shared != nullptr && label.stack_json.empty();
        owned += built.stack_shared == nullptr;
        texts.insert(label.stack_shared);
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
    MESSAGE(stacks << " sleep stacks, " << texts.size() << " distinct texts");
    CHECK(stacks > 100);
    CHECK(same == stacks);
    CHECK(shared == stacks);
    CHECK(owned == stacks);
    CHECK(texts.size() == keeping.stack_texts().size());
    CHECK(texts.size() < stacks / 2);  // the same stacks recur
    CHECK(building.stack_texts().size() == 0);
    CHECK(building.stack_texts().refused() == stacks);
    // The trace's spans carry the kept texts by reference (Span::stack_stable).
    CHECK(sink.with_stack > 100);
    CHECK(sink.stable == sink.with_stack);
}

TEST_CASE("a sleep's evidence text is what printf's \"%s+0x%llx in %s (frame %u)\" gives, at any length") {
    const std::string long_path = "/opt/" + std::string(300, 'p') + "/libpython3.11.so.1.0";
    std::string out = "a longer text left from the sleep before, which must not show through";
    for (const char* fn : {"take_gil", "drop_gil.constprop.0", ""})
        for (uint64_t off : {0ull, 1ull, 0xbeull, 0xfull, 0x10ull, 0xdeadbeefull, ~0ull})
            for (const std::string& file : {std::string("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"),
                                            std::string("?"), long_path})
                for (unsigned depth : {0u, 2u, 9u, 10u, 63u, 4294967295u}) {
                    CAPTURE(fn);
                    CAPTURE(off);
                    CAPTURE(depth);
                    frame_evidence(out, fn, off, file, depth);
                    // printf into a buffer large enough for every case (the
                    // classifier used to print into 256 bytes, cutting long paths)
                    std::vector<char> want(file.size() + 128);
                    std::snprintf(want.data(), want.size(), "%s+0x%llx in %s (frame %u)", fn,
                                  static_cast<unsigned long long>(off), file.c_str(), depth);
                    CHECK(out == std::string(want.data()));
                }
}
