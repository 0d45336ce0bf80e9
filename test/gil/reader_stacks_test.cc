// The reader stage (reader_stacks.h) on synthetic recordings: which records
// get a note, that notes reach the stages with their own records, and that a
// GIL probe ends the work. That its labels equal the stages' own is checked
// on real recordings by golden_test's -j comparison.
#include <doctest/doctest.h>

#include <future>
#include <map>

#include "gilscan/gil/reader_stacks.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

// sched_switch with user registers and stack, beside take_gil probes.
struct StackRecording {
    GilRecording g;
    StackRecording() {
        PerfEventAttr& a = g.r.w.attrs[g.r.sw].attr;
        a.sample_type |= PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
        a.sample_regs_user = 0x7;  // three registers
        a.sample_stack_user = 64;
    }
    // A switch-out of tid 11 (process 10) at t, in `state`, with or without its stack.
    void sleep(uint64_t t, int64_t state, bool stack = true) {
        TestSample s;
        s.pid = 10;
        s.tid = 11;
        s.time = t;
        s.raw = g.r.w.raw(g.r.sw, {{"prev_pid", 11}, {"prev_state", state}, {"next_pid", 0},
                                   {"prev_comm", 0, "worker", true}, {"next_comm", 0, "swapper", true}});
        if (stack) {
            s.regs_user = {1, 2, 3};
            s.stack.assign(64, 0xab);
        }
        g.r.w.sample(g.r.sw, s);
    }
};

// Runs the recording with the reader thread and a stage making every note it
// can; returns, by sample time, whether the sample reached the stages with a
// note and how many sleeps that note's classification counted.
std::map<uint64_t, int> notes_by_time(const std::vector<uint8_t>& bytes, bool stop_at_probes, uint64_t* made) {
    Session s("reader_stacks.data", Bytes(bytes.data(), bytes.size()));
    s.set_threaded(true);
    ModuleCache modules{ModuleOptions{}};
    auto names = std::make_shared<GilStackClassifier::NameCache>("", false);
    ReaderStacks ahead(modules, names, 0, "", s.swap(), stop_at_probes);
    ahead.set_always(true);
    s.set_reader_stage(&ahead);
    struct Sink : EventSink {
        std::map<uint64_t, int> seen;
        void on_sample(const Sample& smp, const EventInfo&) override {
            const ReaderStacks::Note* n = ReaderStacks::note_of(smp);
            seen[smp.time] = n ? static_cast<int>(n->delta.sleeps_seen) : -1;
        }
    } sink;
    s.run(sink);
    *made = ahead.notes_made();
    return sink.seen;
}

// Samples reaching the stages, and how many came with a note.
struct CountNotes : EventSink {
    uint64_t samples = 0, noted = 0;
    void on_sample(const Sample& smp, const EventInfo&) override {
        ++samples;
        noted += smp.note != nullptr;
    }
};

}  // namespace

TEST_CASE("reader stage: a note for each switch-out into S with a stack, on its own record") {
    StackRecording r;
    r.sleep(100, 1);                 // S: noted
    r.sleep(200, 2);                 // D: the stages classify only S by stacks
    r.sleep(300, 0);                 // R (preempted)
    r.sleep(400, 1, false);          // S without registers and stack
    r.sleep(500, 1);                 // S again
    r.g.ev(r.g.take, 600, 11);       // not a sched_switch: never noted (and here no probe stop)
    uint64_t made = 0;
    auto seen = notes_by_time(r.g.r.w.build(), false, &made);
    CHECK(seen == std::map<uint64_t, int>{{100, 1}, {200, -1}, {300, -1}, {400, -1}, {500, 1}, {600, -1}});
    CHECK(made == 2);
}

TEST_CASE("reader stage: from the first GIL probe sample on, sleeps are left to the probes") {
    for (bool stop : {true, false}) {
        CAPTURE(stop);
        StackRecording r;
        r.sleep(100, 1);
        r.g.ev(r.g.take, 150, 12);
        r.sleep(200, 1);
        r.sleep(300, 1);
        uint64_t made = 0;
        auto seen = notes_by_time(r.g.r.w.build(), stop, &made);
        if (stop) {
            CHECK(seen == std::map<uint64_t, int>{{100, 1}, {150, -1}, {200, -1}, {300, -1}});
            CHECK(made == 1);
        } else {
            CHECK(seen == std::map<uint64_t, int>{{100, 1}, {150, -1}, {200, 1}, {300, 1}});
            CHECK(made == 3);
        }
    }
}

TEST_CASE("reader stage: inline reading (no reader thread) runs no stage") {
    StackRecording r;
    r.sleep(100, 1);
    const auto bytes = r.g.r.w.build();
    Session s("reader_stacks.data", Bytes(bytes.data(), bytes.size()));
    s.set_threaded(false);
    ModuleCache modules{ModuleOptions{}};
    ReaderStacks ahead(modules, std::make_shared<GilStackClassifier::NameCache>("", false), 0, "", s.swap(), true);
    ahead.set_always(true);
    s.set_reader_stage(&ahead);
    CountNotes sink;
    s.run(sink);
    CHECK(sink.samples == 1);
    CHECK(sink.noted == 0);
    CHECK(ahead.notes_made() == 0);
}

TEST_CASE("reader stage: a sleep whose label would wait for another thread is left to the stages") {
    // Real stacks (testdata) while /proc/kallsyms is still "being read"
    // (a future never made ready here): the reader names the user frames of
    // each sleep but makes no note, so every sleep reaches the stages without
    // one, and the stages classify it.
    const std::string path = std::string(GILSCAN_TESTDATA) + "/stacks_py311.data";
    Session s(path);
    s.set_threaded(true);
    ModuleCache modules{ModuleOptions{}};
    const std::string release = s.features().os_release;
    auto names = std::make_shared<GilStackClassifier::NameCache>(release, false);
    std::promise<std::shared_ptr<const KernelSymbols>> never;
    names->ksyms = never.get_future().share();
    ReaderStacks ahead(modules, names, 64, release, s.swap(), true);
    ahead.set_always(true);
    s.set_reader_stage(&ahead);
    CountNotes sink;
    s.run(sink);
    CHECK(sink.samples > 400);
    CHECK(sink.noted == 0);
    CHECK(ahead.notes_made() == 0);
    CHECK(ahead.notes_abandoned() > 100);
    CHECK(named_frames(*names) > 10);  // the user frames, named for the stages
}

TEST_CASE("reader stage: in a summary-only run its notes give the answer without the evidence text") {
    // set_text(false), as pipeline.cc sets it when no trace is written
    // (SleepLabel::text): the same names and GIL flags as with texts, and
    // no sleep's matching frame formatted into evidence.
    const std::string path = std::string(GILSCAN_TESTDATA) + "/stacks_py311.data";
    std::map<uint64_t, std::pair<std::string, bool>> answers[2];  // by sample time: (name, gil)
    uint64_t with_evidence[2] = {0, 0};
    for (int text = 0; text < 2; ++text) {
        CAPTURE(text);
        Session s(path);
        s.set_threaded(true);
        ModuleCache modules{ModuleOptions{}};
        auto names = std::make_shared<GilStackClassifier::NameCache>(s.features().os_release, false);
        ReaderStacks ahead(modules, names, 0, s.features().os_release, s.swap(), true);
        ahead.set_always(true);
        ahead.set_wait(true);
        ahead.set_text(text == 1);
        s.set_reader_stage(&ahead);
        struct Sink : EventSink {
            std::map<uint64_t, std::pair<std::string, bool>>* answers;
            uint64_t* with_evidence;
            void on_sample(const Sample& smp, const EventInfo&) override {
                const ReaderStacks::Note* n = ReaderStacks::note_of(smp);
                if (!n) return;
                (*answers)[smp.time] = {std::string(n->label.name), n->label.gil};
                *with_evidence += !n->label.evidence().empty();
            }
        } sink;
        sink.answers = &answers[text];
        sink.with_evidence = &with_evidence[text];
        s.run(sink);
        CHECK(ahead.notes_made() > 100);
    }
    uint64_t gil = 0;
    for (const auto& [t, a] : answers[1]) gil += a.second;
    CHECK(gil > 50);
    CHECK(answers[0] == answers[1]);
    CHECK(with_evidence[1] >= gil);  // each GIL wait (and hand-off) names its frame
    CHECK(with_evidence[0] == 0);
}

TEST_CASE("reader stage: its kernel frames are named at this boot's addresses from the maps it read itself") {
    // The reader runs ahead of the stages, so the recorded kernel maps it
    // names by must be the ones its own ProcessMaps logged (here nothing
    // else reads the records). Its stand-in kallsyms has the image 0x19000000
    // higher than stacks_py311.data recorded it.
    const std::string path = std::string(GILSCAN_TESTDATA) + "/stacks_py311.data";
    Session s(path);
    s.set_threaded(true);
    ModuleCache modules{ModuleOptions{}};
    const RecordedKernel rec = recorded_kernel(s.features());
    auto names = std::make_shared<GilStackClassifier::NameCache>(rec, false);
    std::promise<std::shared_ptr<const KernelSymbols>> ks;
    ks.set_value(std::make_shared<KernelSymbols>(KernelSymbols::texts, "ffffffff9a000000 T _text\nffffffff9a000000 T image_start\n", ""));
    names->ksyms = ks.get_future().share();
    ReaderStacks ahead(modules, names, 64, rec, s.swap(), true);
    ahead.set_always(true);
    ahead.set_wait(true);
    s.set_reader_stage(&ahead);
    struct Sink : EventSink {
        uint64_t stacks = 0, moved = 0;
        void on_sample(const Sample& smp, const EventInfo&) override {
            const ReaderStacks::Note* n = ReaderStacks::note_of(smp);
            if (!n || n->label.stack().empty()) return;
            ++stacks;
            moved += n->label.stack().find("image_start+0x") != std::string::npos &&
                     n->label.stack().find("0xffffffff8") == std::string::npos;
        }
    } sink;
    s.run(sink);
    CHECK(sink.stacks > 100);
    CHECK(sink.moved == sink.stacks);
    CHECK(rec.maps->layout().reloc_addr == 0xffffffff81000000);
}
