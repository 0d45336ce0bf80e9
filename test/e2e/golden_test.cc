// Golden end-to-end cases: real recordings made on this machine kind
// (testdata/record.sh) against facts computed from `perf script` by
// test/e2e/golden_expect.py and stored next to them.
#include <doctest/doctest.h>

#include "golden_fixtures.h"

TEST_CASE("golden: plain file") { check_golden("plain"); }
TEST_CASE("golden: pipe mode") { check_golden("pipe"); }
TEST_CASE("golden: zstd (-z)") { check_golden("zstd"); }
TEST_CASE("golden: pipe mode with zstd") { check_golden("pipe_zstd"); }
TEST_CASE("golden: per-event call-graph mix (dwarf stacks on sched_switch only)") { check_golden("mixed_callgraph"); }
TEST_CASE("golden: system-wide (-a)") { check_golden("system_wide"); }

TEST_CASE("golden: lost events (perf record -m 4 --call-graph dwarf) counted as perf does, marked unknown") {
    check_golden("lost");
    Analysis a = analyse((kData / "lost.data").string());
    REQUIRE(a.stats.lost_records > 0);
    uint64_t per_cpu = 0;
    for (auto& [cpu, n] : a.stats.lost_by_cpu) per_cpu += n;
    CHECK(per_cpu == a.stats.lost_events);
    uint64_t unknown = 0;
    for (auto& t : a.threads) unknown += t.unknown_ns;
    CHECK(unknown > 0);
    bool unknown_span = std::any_of(a.spans.spans.begin(), a.spans.spans.end(),
                                    [](auto& s) { return s.kind == SpanKind::Unknown; });
    CHECK(unknown_span);
}

TEST_CASE("golden: tiny read chunks and the reader thread give the same spans, threads and counts") {
    // 64 bytes is smaller than most records (a DWARF sample is ~8 KiB): every
    // such record starts a chunk of its own; 4099 makes records straddle.
    // These recordings are small enough to be read inline by default: the
    // reader thread is forced here (batches, hand-off, idle waits for pipe
    // mode's header records).
    for (const char* name : {"plain", "pipe", "zstd", "pipe_zstd", "mixed_callgraph", "lost", "gil_combined",
                             "switch_events"}) {
        CAPTURE(name);
        const std::string path = (kData / (std::string(name) + ".data")).string();
        Analysis ref = analyse(path, 0, false);
        REQUIRE(ref.spans.spans.size() > 10);
        for (const auto& setting : std::vector<std::pair<size_t, bool>>{{0, true}, {64, false}, {64, true}, {4099, true}}) {
            // (Not structured bindings: CAPTURE's lambda cannot capture them in clang 14.)
            const size_t chunk = setting.first;
            const bool threaded = setting.second;
            CAPTURE(chunk);
            CAPTURE(threaded);
            Analysis a = analyse(path, chunk, threaded);
            CHECK(a.spans.spans == ref.spans.spans);
            CHECK(a.stats.records == ref.stats.records);
            CHECK(a.stats.samples_by_event == ref.stats.samples_by_event);
            CHECK(a.stats.lost_events == ref.stats.lost_events);
            CHECK(a.stats.warnings == ref.stats.warnings);
            REQUIRE(a.threads.size() == ref.threads.size());
            for (size_t i = 0; i < a.threads.size(); ++i) {
                CHECK(a.threads[i].tid == ref.threads[i].tid);
                CHECK(a.threads[i].sleep_ns == ref.threads[i].sleep_ns);
                CHECK(a.threads[i].gil_sleep_count == ref.threads[i].gil_sleep_count);
            }
        }
    }
}

TEST_CASE("golden: -j 1, 2 and 3 write byte-identical traces and summaries, the reader thread forced on") {
    // -j 1 runs on one thread (records read inline, the trace written as it
    // is made); -j 2 adds the reader and writer threads; -j 3 with
    // --sleep-stacks one unwinding worker. The recordings are small enough
    // to be read inline by default: the reader thread is forced for -j 2/3.
    const fs::path dir = fs::current_path() / "golden_jobs.tmp";
    fs::create_directories(dir);
    auto count_threads = [] {
        size_t n = 0;
        for ([[maybe_unused]] const auto& t : fs::directory_iterator("/proc/self/task")) ++n;
        return n;
    };
    // gil_combined: uprobes, no stacks (S(GIL) by probes, -j 3 without work for a worker);
    // gil_subinterp the same with three GILs in a process (their tracks and counters).
    // gil_stacks: uprobes and stacks, S(GIL) by stacks: while -j 3's spans
    // wait for their labels, the GIL tracker's events must wait with them.
    // stacks_py312_perfmap: -X perf trampolines named from its perf map
    // (each thread reads it at the first such frame it meets);
    // stacks_py313_perfjit: -X perf_jit's named from its jitdump and unwound
    // through by the dump's CFI (each thread's unwinder reads it too).
    // stacks_py27: Python 2, a GIL wait decided by the frame above
    // PyThread_acquire_lock, one past the frame that would decide on 3.x.
    for (const std::string name : {"stacks_py311", "stacks_pipe", "gil_combined", "gil_subinterp", "mixed_callgraph",
                                   "gil_stacks", "stacks_py312_perfmap", "stacks_py313_perfjit", "stacks_py27",
                                   "switch_events"}) {
        const bool no_stacks = name == "gil_combined" || name == "gil_subinterp" || name == "switch_events";
        for (unsigned frames : {0u, 16u}) {
            std::string ref_trace, ref_summary;
            uint64_t ref_sleeps = 0;
            // 4: -j 2 with the reader thread classifying every sleep it can
            // (by default it does so only when the stages are behind).
            for (unsigned config : {1u, 2u, 3u, 4u}) {
                const unsigned jobs = config == 4 ? 2 : config;
                CAPTURE(name);
                CAPTURE(frames);
                CAPTURE(config);
                AnalysisOptions o;
                o.input = (kData / (name + ".data")).string();
                o.output = (dir / "t.json").string();
                o.sleep_stacks = frames;
                o.perf_maps = (kData / "perf-maps").string();
                // With stacks kept, GIL waits' Python functions too (found
                // on the stages, in reader notes and by workers alike).
                o.gil_functions = frames > 0;
                if (name == "gil_stacks") o.gil_evidence = "stacks";
                o.jobs = jobs;
                if (jobs > 1) o.reader_thread = true;
                if (config == 4) o.reader_stacks = true;
                if (config == 2) o.reader_stacks = false;
                // Threads of this process while the records are read, beyond
                // those before (a sanitizer's own): -j 1 adds none.
                size_t most_threads = 0;
                o.progress = [&](uint64_t, uint64_t) { most_threads = std::max(most_threads, count_threads()); };
                const size_t before = count_threads();
                FileSummary fsum = analyse_recording(o);
                if (jobs == 1) CHECK(most_threads == before);
                else CHECK(most_threads >= before + 2);  // the reader and the trace writer
                const std::string trace = slurp(o.output), summary = summary_json(fsum).dump();
                REQUIRE(trace.size() > 1000);
                // A GIL wait found in a stack names its frame in the trace
                // (on every path: stages, reader notes, workers), and the
                // same run without a trace, whose labels skip those texts
                // (SleepLabel::text; checked per path in gil_stacks_test and
                // reader_stacks_test), gives the same summary.
                if (!no_stacks) CHECK(trace.find(" (frame ") != std::string::npos);
                AnalysisOptions summary_only = o;
                summary_only.output.clear();
                summary_only.progress = nullptr;
                CHECK(summary_json(analyse_recording(summary_only)).dump() == summary);
                // Every sleep classified by its stack got its label from the
                // reader thread: it took the same sleeps as the stages would.
                if (config == 4) CHECK(fsum.stack_stats.from_reader == ref_sleeps);
                else CHECK(fsum.stack_stats.from_reader == 0);
                if (jobs == 1) {
                    ref_sleeps = fsum.stack_stats.sleeps_seen;
                    if (!no_stacks) CHECK(ref_sleeps > 0);
                    ref_trace = trace;
                    ref_summary = summary;
                    if (frames && !no_stacks) CHECK(trace.find("\"stack\":[") != std::string::npos);
                    if (frames && name == "stacks_py312_perfmap")
                        CHECK(trace.find("py::spin:") != std::string::npos);
                    if (frames && name == "stacks_py313_perfjit")
                        CHECK(trace.find("py::spin:/work/main/testdata/workload.py+0x5 (jit-") != std::string::npos);
                    CHECK(trace.find("S(GIL)") != std::string::npos);
                } else {
                    CHECK(trace == ref_trace);
                    CHECK(summary == ref_summary);
                }
            }
        }
    }
    fs::remove_all(dir);
}

TEST_CASE("golden: header features of a real recording") {
    Session s((kData / "plain.data").string());
    const Features& f = s.features();
    CHECK_FALSE(f.hostname.empty());
    CHECK(f.cmdline.size() > 3);
    CHECK(f.cmdline[0].find("perf") != std::string::npos);
    REQUIRE(f.clock_data.has_value());
    CHECK(f.clock_data->clockid == 1);
    CHECK(f.clockid_res_ns.has_value());
    REQUIRE(f.sample_time.has_value());
    CHECK(f.sample_time->first <= f.sample_time->second);
    CHECK(s.clock() == "CLOCK_MONOTONIC");
    CHECK(f.event_desc.size() == 4);
    CHECK(s.tracing().by_name("sched:sched_switch") != nullptr);
    struct Null : EventSink {} n;
    s.run(n);
    CHECK(s.stats().first_time == f.sample_time->first);
    CHECK(s.stats().last_time == f.sample_time->second);
}

TEST_CASE("golden: GIL uprobes only (per4m's gil mode)") { check_golden_gil("gil_uprobes", false); }

TEST_CASE("golden: subinterpreters that own their GIL (3.13): one GIL per interpreter, by the probe's gil= field") {
    // testdata/subinterp.py: two threads in isolated subinterpreters, two in
    // the main interpreter. One process, three GILs; only the main one is
    // contended. Before the probe read the GIL's address, the three were
    // one: a thousand "overlapping holders" and a GIL held 98% of the time.
    check_golden("gil_subinterp");
    check_golden_gil("gil_subinterp", true);
    Analysis a = analyse((kData / "gil_subinterp.data").string());
    REQUIRE(a.gils.size() == 3);
    CHECK(a.gils[0].contended_ns > a.gils[0].held_ns / 2);
    for (size_t i = 1; i < 3; ++i) {
        CHECK(a.gils[i].index == i);
        CHECK(a.gils[i].contended_ns == 0);
        CHECK(a.gils[i].held_ns > (a.gils[i].last - a.gils[i].first) / 2);
    }
    // The trace and the summary name each GIL: a holder track and a waiters
    // counter apiece, the addresses in the summary's JSON.
    const fs::path dir = fs::current_path() / "golden_subinterp.tmp";
    fs::create_directories(dir);
    AnalysisOptions o;
    o.input = (kData / "gil_subinterp.data").string();
    o.output = (dir / "t.json").string();
    const FileSummary sum = analyse_recording(o);
    const nlohmann::json trace = nlohmann::json::parse(slurp(o.output));
    std::map<std::string, int> tracks, counters;
    std::map<int, int> locks_by_gil;  // LOCK spans by their args.gil (0: none, the first GIL)
    for (const auto& e : trace["traceEvents"]) {
        if (e.value("name", "") == "LOCK") ++locks_by_gil[e.contains("args") ? e["args"].value("gil", 0) : 0];
        if (e["ph"] == "M" && e["name"] == "thread_name") ++tracks[e["args"]["name"].get<std::string>()];
        if (e["ph"] == "C") ++counters[e["name"].get<std::string>()];
        if (e.value("cat", "") == "GIL holder") {
            const int32_t track = e["tid"].get<int32_t>(), pid = e["pid"].get<int32_t>();
            CHECK((track == gil_track_tid(pid, 0) || track == gil_track_tid(pid, 1) || track == gil_track_tid(pid, 2)));
        }
    }
    CHECK(tracks["GIL holder"] == 1);
    CHECK(tracks["GIL holder (GIL 2)"] == 1);
    CHECK(tracks["GIL holder (GIL 3)"] == 1);
    CHECK(counters["GIL waiters"] > 100);
    CHECK(counters["GIL waiters (GIL 2)"] > 10);
    CHECK(counters["GIL waiters (GIL 3)"] > 10);
    CHECK(locks_by_gil.size() == 3);
    CHECK(locks_by_gil[0] > 100);
    CHECK(locks_by_gil[2] > 10);
    CHECK(locks_by_gil[3] > 10);
    const nlohmann::json j = summary_json(sum);
    REQUIRE(j["gil"]["processes"].size() == 3);
    for (size_t i = 0; i < 3; ++i) {
        CHECK(j["gil"]["processes"][i]["gil_index"] == i);
        char want[24];
        std::snprintf(want, sizeof want, "0x%llx", static_cast<unsigned long long>(a.gils[i].address));
        CHECK(j["gil"]["processes"][i]["gil_address"] == want);
    }
    CHECK(j["gil"]["anomalies"]["releases_not_seen"] == 0);
    fs::remove_all(dir);
}

TEST_CASE("golden: GIL uprobes with scheduler events: both views, S(GIL) from the probes") {
    check_golden("gil_combined");
    check_golden_gil("gil_combined", true);
}

// gilscan record's per-process recording with switch records (--switch-events):
// every switch-in is in it, by whichever task; on this kernel a wake-up by
// another process's task (a timer on an idle CPU) is not.
TEST_CASE("golden: switch records: every switch-in seen, sleeps woken unrecorded end at theirs") {
    check_golden("switch_events");
    check_golden_gil("switch_events", true);
    Analysis a = analyse((kData / "switch_events.data").string());
    uint64_t hidden_switch_ins = 0, hidden_wakeups = 0, runnable = 0;
    for (const auto& t : a.threads) {
        hidden_switch_ins += t.hidden_switch_ins;
        hidden_wakeups += t.hidden_wakeups;
        runnable += t.runnable_ns;
    }
    CHECK(hidden_switch_ins == 0);
    CHECK(hidden_wakeups > 0);
    CHECK(runnable > 0);
}

TEST_CASE("golden: truncated copy yields the records before the cut and a warning") {
    // Independent expectation: walk plain.data's record headers up to the cut.
    MappedFile plain((kData / "plain.data").string());
    MappedFile cut((kData / "truncated.data").string());
    FileHeader h = read_file_header(plain.bytes(), plain.path());
    uint64_t pos = h.data.offset, samples = 0, records = 0;
    while (pos + 8 <= cut.size()) {
        uint16_t size = load<uint16_t>(plain.bytes().data() + pos + 6, false);
        uint32_t type = load<uint32_t>(plain.bytes().data() + pos, false);
        if (pos + size > cut.size()) break;
        samples += type == PERF_RECORD_SAMPLE;
        ++records;
        pos += size;
    }
    REQUIRE(records > 10);
    Analysis a = analyse((kData / "truncated.data").string());
    CHECK(a.stats.truncated);
    CHECK(a.stats.records == records);
    uint64_t got = 0;
    for (uint64_t n : a.stats.samples_by_event) got += n;
    CHECK(got == samples);
    bool offset_named = false;
    for (auto& w : a.stats.warnings) offset_named |= w.find("at byte " + std::to_string(pos)) != std::string::npos;
    CHECK(offset_named);
}

