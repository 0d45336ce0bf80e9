// Golden end-to-end cases: real recordings made on this machine kind
// (testdata/record.sh) against facts computed from `perf script` by
// test/e2e/golden_expect.py and stored next to them.
#include <doctest/doctest.h>

#include <charconv>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gilscan/pipeline.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/mapped_file.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/summary.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

const fs::path kData = GILSCAN_TESTDATA;

nlohmann::json load_json(const fs::path& p) {
    std::ifstream f(p);
    REQUIRE_MESSAGE(f.good(), "missing " << p);
    return nlohmann::json::parse(f);
}

std::map<std::string, uint64_t> event_counts(const std::string& path) {
    Session s(path);
    struct Null : EventSink {} n;
    s.run(n);
    std::map<std::string, uint64_t> out;
    const auto& by_event = s.stats().samples_by_event;
    for (size_t i = 0; i < by_event.size(); ++i)
        if (by_event[i]) out[s.events()[i].name] += by_event[i];
    return out;
}

void check_golden(const std::string& name) {
    CAPTURE(name);
    fs::path data = kData / (name + ".data");
    nlohmann::json exp = load_json(kData / (name + ".expected.json"));
    Analysis a = analyse(data.string());
    CHECK(a.stats.truncated == false);
    CHECK(a.stats.malformed == 0);
    auto counts = event_counts(data.string());
    for (auto& item : exp["event_counts"].items()) {
        const std::string ev = item.key();
        CAPTURE(ev);
        CHECK(counts[ev] == item.value().get<uint64_t>());
    }
    CHECK(counts.size() == exp["event_counts"].size());
    CHECK(a.stats.lost_records == exp["lost_records"].get<uint64_t>());
    CHECK(a.stats.lost_samples == exp["lost_samples"].get<uint64_t>());
    std::map<std::string, uint64_t> per_cpu;
    for (auto& [cpu, n] : a.stats.lost_by_cpu) per_cpu[std::to_string(cpu)] = n;
    CHECK(per_cpu == exp["lost_by_cpu"].get<std::map<std::string, uint64_t>>());
    if (!exp.contains("threads")) return;
    size_t checked = 0;
    for (auto& item : exp["threads"].items()) {
        const std::string tid = item.key();
        const nlohmann::json& e = item.value();
        CAPTURE(tid);
        const ThreadStats* t = a.thread(std::stoi(tid));
        REQUIRE(t);
        CHECK(t->sleep_count == e["sleep_count"].get<uint64_t>());
        CHECK(t->sleep_ns == e["sleep_ns"].get<uint64_t>());
        CHECK(t->disk_count == e["disk_count"].get<uint64_t>());
        CHECK(t->disk_ns == e["disk_ns"].get<uint64_t>());
        ++checked;
    }
    CHECK(checked >= 5);  // the workload's main thread and its four workers at least
}

// GIL wait / held per thread from uprobes, against the same rules applied to
// perf script's text: must agree within 0.5% of the thread's span.
void check_golden_gil(const std::string& name, bool with_sleeps) {
    CAPTURE(name);
    nlohmann::json exp = load_json(kData / (name + ".expected.json"));
    REQUIRE(exp.contains("gil"));
    Analysis a = analyse((kData / (name + ".data")).string());
    CHECK(a.gil_anomalies.total() == 0);
    size_t contending = 0;
    for (auto& item : exp["gil"].items()) {
        const std::string tid = item.key();
        const nlohmann::json& e = item.value();
        CAPTURE(tid);
        const GilThreadStats* g = a.gil_thread(std::stoi(tid));
        REQUIRE(g);
        const double tol = 0.005 * e["span_ns"].get<double>();
        CHECK(std::abs(static_cast<double>(g->wait_ns) - e["wait_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g->hold_ns) - e["hold_ns"].get<double>()) <= tol);
        contending += e["wait_ns"].get<uint64_t>() > 0 && e["hold_ns"].get<uint64_t>() > 0;
        uint64_t mask = 0;  // the GILs it took, by index
        for (const auto& k : e["gils"]) mask |= uint64_t{1} << k.get<unsigned>();
        CHECK(g->gil_mask == mask);
        if (with_sleeps) {
            const ThreadStats* t = a.thread(std::stoi(tid));
            REQUIRE(t);
            CHECK(t->gil_sleep_count == e["gil_sleep_count"].get<uint64_t>());
        }
    }
    CHECK(contending >= 3);
    // Per GIL: the process's GILs, told apart by the take_gil probe's gil=
    // address where it has one, in the order perf script's text first names them.
    REQUIRE(exp.contains("gils"));
    REQUIRE(a.gils.size() == exp["gils"].size());
    for (size_t i = 0; i < a.gils.size(); ++i) {
        const nlohmann::json& e = exp["gils"][i];
        const GilProcessStats& g = a.gils[i];
        CAPTURE(i);
        CHECK(g.pid == e["pid"].get<int32_t>());
        if (e["address"].is_null()) {
            CHECK(g.address == 0);
        } else {
            CHECK(g.address == std::stoull(e["address"].get<std::string>(), nullptr, 16));
        }
        const double span = e["span_ns"].get<double>(), tol = 0.005 * span;
        CHECK(std::abs(static_cast<double>(g.last - g.first) - span) <= tol);
        CHECK(std::abs(static_cast<double>(g.held_ns) - e["held_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g.contended_ns) - e["contended_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g.waiting_ns) - e["waiting_ns"].get<double>()) <= tol);
        CHECK(g.max_waiters == e["max_waiters"].get<uint32_t>());
    }
}

}  // namespace

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
    for (const char* name : {"plain", "pipe", "zstd", "pipe_zstd", "mixed_callgraph", "lost", "gil_combined"}) {
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
                                   "gil_stacks", "stacks_py312_perfmap", "stacks_py313_perfjit", "stacks_py27"}) {
        const bool no_stacks = name == "gil_combined" || name == "gil_subinterp";
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

TEST_CASE("analysis: --gil-functions totals S(GIL) sleeps by the Python function perf script's stacks name") {
    // perf script's answer per GIL wait (test/e2e/stack_truth.py --gil-functions).
    std::map<std::string, uint64_t> want;  // function ("" = none named) -> GIL waits
    {
        std::ifstream jf(kData / "stacks_py312_perfmap.gilfn.json");
        REQUIRE(jf.good());
        for (const auto& w : nlohmann::json::parse(jf)) ++want[w[2].is_null() ? "" : w[2].get<std::string>()];
    }
    REQUIRE(want.size() >= 4);
    std::string ref;
    for (unsigned config : {1u, 2u, 3u}) {
        CAPTURE(config);
        AnalysisOptions o;
        o.input = (kData / "stacks_py312_perfmap.data").string();
        o.perf_maps = (kData / "perf-maps").string();
        o.gil_functions = true;
        o.jobs = config;
        if (config > 1) o.reader_thread = true;
        if (config == 2) o.reader_stacks = true;  // every label the reader thread's
        if (config == 3) o.sleep_stacks = 8;      // the workers' labels, the function past the 8 frames kept
        const FileSummary sum = analyse_recording(o);
        REQUIRE(sum.gil_functions_known);
        std::map<std::string, uint64_t> got;
        uint64_t ns = 0, threads_ns = 0, threads_count = 0;
        for (size_t i = 0; i < sum.gil_functions.size(); ++i) {
            const GilFunctionStats& f = sum.gil_functions[i];
            CHECK(f.tgid == 23131);
            got[f.function] += f.sleep_count;
            ns += f.sleep_ns;
            if (i) CHECK(sum.gil_functions[i - 1].sleep_ns >= f.sleep_ns);  // the most time first
        }
        for (const auto& t : sum.threads) {
            threads_ns += t.gil_sleep_ns.value_or(0);
            threads_count += t.gil_sleep_count.value_or(0);
        }
        CHECK(got == want);
        CHECK(ns == threads_ns);  // every S(GIL) sleep under one function or none
        CHECK(threads_count == 63);
        CHECK(sum.warnings.end() == std::find_if(sum.warnings.begin(), sum.warnings.end(), [](const std::string& w) {
                  return w.find("--gil-functions") != std::string::npos;
              }));
        const nlohmann::json j = summary_json(sum);
        REQUIRE(j.contains("gil_functions"));
        CHECK(j["gil_functions"].size() == sum.gil_functions.size());
        CHECK(j["gil_functions"][0]["function"] == "py::spin:/work/main/testdata/workload.py");
        CHECK(std::any_of(j["gil_functions"].begin(), j["gil_functions"].end(),
                          [](const nlohmann::json& f) { return f["function"].is_null() && f["sleep_count"] == 3; }));
        char* buf = nullptr;
        size_t len = 0;
        std::FILE* mem = open_memstream(&buf, &len);
        print_summary_table(mem, sum);
        std::fclose(mem);
        const std::string table(buf, len);
        std::free(buf);
        CHECK(table.find("GIL waits by Python function") != std::string::npos);
        CHECK(table.find("py::compress:/work/main/testdata/workload.py") != std::string::npos);
        CHECK(table.find("(no function named)") != std::string::npos);
        if (config == 1) ref = j.dump();
        else CHECK(j.dump() == ref);
    }
    // Not asked for: neither looked for nor reported.
    AnalysisOptions plain;
    plain.input = (kData / "stacks_py312_perfmap.data").string();
    plain.perf_maps = (kData / "perf-maps").string();
    const FileSummary sum = analyse_recording(plain);
    CHECK_FALSE(sum.gil_functions_known);
    CHECK_FALSE(summary_json(sum).contains("gil_functions"));
    // Another process than the recording's: its rows only (none).
    AnalysisOptions other = plain;
    other.gil_functions = true;
    other.pids = {1};
    CHECK(analyse_recording(other).gil_functions.empty());
    // Where no function can be found, a warning says why.
    auto warned = [](const std::string& name, const std::string& evidence, const std::string& what) {
        AnalysisOptions o;
        o.input = (kData / (name + ".data")).string();
        o.perf_maps = (kData / "perf-maps").string();
        o.gil_functions = true;
        o.gil_evidence = evidence;
        const FileSummary got = analyse_recording(o);
        return std::any_of(got.warnings.begin(), got.warnings.end(),
                           [&](const std::string& w) { return w.find(what) != std::string::npos; });
    };
    CHECK(warned("gil_combined", "auto", "--gil-functions: no GIL waits were found from stacks (sleeps were classified by the GIL uprobes"));
    CHECK(warned("stacks_py311", "auto", "--gil-functions: no GIL wait's stack reached a Python function"));
    CHECK_FALSE(warned("stacks_py311", "auto", "no GIL waits were found from stacks"));
}

TEST_CASE("analysis: how many frames --sleep-stacks keeps does not change a sleep's label") {
    // The answer comes from the first 64 frames whatever N is: with N as the
    // limit, --sleep-stacks 1 and 2 labelled no GIL wait (take_gil is frame
    // 2 to 5) and 3 a fifth fewer on stacks_py311.
    for (const std::string name : {"stacks_py311", "stacks_debian", "gil_stacks", "stacks_py312_perfmap"}) {
        CAPTURE(name);
        std::string ref;
        for (unsigned frames : {0u, 1u, 2u, 3u, 8u, 200u}) {
            CAPTURE(frames);
            AnalysisOptions o;
            o.input = (kData / (name + ".data")).string();
            o.perf_maps = (kData / "perf-maps").string();
            o.gil_evidence = "stacks";
            o.gil_functions = true;
            o.sleep_stacks = frames;
            const nlohmann::json j = summary_json(analyse_recording(o));
            REQUIRE(j["stacks"]["gil"].get<uint64_t>() > 10);
            const std::string labels = j["threads"].dump() + j["stacks"].dump() + j["gil_functions"].dump();
            if (frames == 0) ref = labels;
            else CHECK(labels == ref);
        }
    }
}

TEST_CASE("analysis: on_complete sees the finished summary once, the trace already complete at its name") {
    // `gilscan FILE` reports in on_complete and ends the process there: the
    // trace must be committed by then, and the summary the one returned.
    const fs::path dir = fs::current_path() / "golden_complete.tmp";
    fs::create_directories(dir);
    for (unsigned jobs : {1u, 2u}) {
        CAPTURE(jobs);
        AnalysisOptions o;
        o.input = (kData / "stacks_py311.data").string();
        o.output = (dir / "t.json").string();
        o.sleep_stacks = 16;
        o.jobs = jobs;
        if (jobs > 1) o.reader_thread = true;
        int calls = 0;
        std::string seen, trace_then;
        o.on_complete = [&](const FileSummary& s) {
            ++calls;
            seen = summary_json(s).dump();
            trace_then = slurp(o.output);
        };
        FileSummary fsum = analyse_recording(o);
        CHECK(calls == 1);
        CHECK(seen == summary_json(fsum).dump());
        REQUIRE(trace_then.size() > 1000);
        CHECK(trace_then == slurp(o.output));
        CHECK(nlohmann::json::parse(trace_then).contains("traceEvents"));
        for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename() == "t.json");  // no temporary left
        fs::remove(o.output);
    }
    fs::remove_all(dir);
}

TEST_CASE("summary JSON written row by row is json_dump(summary_json(), 2), byte for byte") {
    const fs::path dir = fs::current_path() / "golden_summary.tmp";
    fs::create_directories(dir);
    auto check_same = [&](const FileSummary& fsum) {
        const fs::path p = dir / "s.json";
        {
            OutputFile out(p.string());
            write_summary_json(out, fsum);
            out.commit();
        }
        CHECK(slurp(p) == json_dump(summary_json(fsum), 2) + "\n");
        return nlohmann::json::parse(slurp(p));  // strict: throws on ill-formed UTF-8
    };
    for (const std::string name : {"plain", "gil_combined", "stacks_py311"}) {
        CAPTURE(name);
        AnalysisOptions o;
        o.input = (kData / (name + ".data")).string();
        FileSummary fsum = analyse_recording(o);
        REQUIRE(fsum.threads.size() >= 2);
        check_same(fsum);
        // A name that needs escaping, and no rows at all.
        fsum.threads[0].st.comm = "a\"b\\c\nd\t\x01";
        check_same(fsum);
        // A comm the kernel cut inside a character, a non-UTF-8 host name:
        // U+FFFD, where nlohmann's default dump() threw and ended the run.
        fsum.threads[1].st.comm = "ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xe7";
        fsum.hostname = "h\xff";
        const nlohmann::json back = check_same(fsum);
        CHECK(back["hostname"] == "h\xef\xbf\xbd");
        bool found = false;
        for (const auto& t : back["threads"]) found |= t["comm"] == "ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xef\xbf\xbd";
        CHECK(found);
        // The table: the same U+FFFD, and 16 characters of a longer name, not
        // 16 bytes (which would cut the ninth é in two).
        std::string ten_e;
        for (int k = 0; k < 10; ++k) ten_e += "\xc3\xa9";
        fsum.threads[0].st.comm = ten_e + "xxxxxxxxxx";  // 20 characters, 30 bytes
        char* buf = nullptr;
        size_t len = 0;
        std::FILE* mem = open_memstream(&buf, &len);
        print_summary_table(mem, fsum, true);
        std::fclose(mem);
        const std::string table(buf, len);
        std::free(buf);
        CHECK(table.find("  ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xef\xbf\xbd          ") != std::string::npos);
        CHECK(table.find("  " + ten_e + "xxxxxx ") != std::string::npos);  // 16 characters, then the column's space
        fsum.threads.clear();
        check_same(fsum);
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
    CHECK(j["gil"]["anomalies"]["overlapping_holders"] == 0);
    fs::remove_all(dir);
}

TEST_CASE("golden: GIL uprobes with scheduler events: both views, S(GIL) from the probes") {
    check_golden("gil_combined");
    check_golden_gil("gil_combined", true);
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

TEST_CASE("debuginfo cache: a recording's sleep stacks are the same without the cache, cold and warm") {
    // stacks_py311 was recorded on this project's machine: its glibc frames
    // carry inline names from libc6-dbg's compressed debug file.
    const fs::path dir = fs::current_path() / "golden_dicache.tmp";
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto trace = [&](const std::string& cache) {
        AnalysisOptions o;
        o.input = (kData / "stacks_py311.data").string();
        o.output = (dir / "t.json").string();
        o.sleep_stacks = 16;
        o.debuginfo_cache = cache;
        analyse_recording(o);
        return slurp(o.output);
    };
    const std::string none = trace("");
    const std::string cold = trace((dir / "c").string());
    const std::string warm = trace((dir / "c").string());
    CHECK(none.find("[inlined] __pthread_cond_wait_common (libc.so.6)") != std::string::npos);
    CHECK(cold == none);
    CHECK(warm == none);
    set_debuginfo_cache("", 1);
    fs::remove_all(dir);
}

TEST_CASE("name store: a recording's sleep stacks are named the same from kept answers, at -j 1, 2 and 3") {
    const fs::path dir = fs::current_path() / "golden_names.tmp";
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto trace = [&](const std::string& cache, unsigned jobs) {
        AnalysisOptions o;
        o.input = (kData / "stacks_py311.data").string();
        o.output = (dir / "t.json").string();
        o.sleep_stacks = 16;
        o.jobs = jobs;
        o.debuginfo_cache = cache;
        analyse_recording(o);
        return slurp(o.output);
    };
    const std::string cache = (dir / "c").string();
    const std::string none = trace("", 1);
    CHECK(trace(cache, 1) == none);  // cold: every answer from libdw, then kept
    std::vector<fs::path> kept;
    for (const auto& e : fs::directory_iterator(cache))
        if (e.path().filename().string().rfind("names-", 0) == 0) kept.push_back(e.path());
    CHECK(kept.size() >= 2);  // libpython's and glibc's at least
    for (unsigned jobs : {1u, 2u, 3u}) {
        CAPTURE(jobs);
        CHECK(trace(cache, jobs) == none);  // warm
    }
    // The kept answers are what names the frames: one changed (and its
    // file's hash made right, as a store would write it) shows in the trace.
    const std::string from = "__pthread_cond_wait_common", to = "__pthread_cond_wait_KEPTxx";
    bool changed = false;
    for (const fs::path& p : kept) {
        std::string text = slurp(p);
        size_t n = 0;
        for (size_t at = 0; (at = text.find("\t" + from, at)) != std::string::npos; at += to.size(), ++n)
            text.replace(at + 1, from.size(), to);
        if (n == 0) continue;
        const size_t end_at = text.rfind("end\t");
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < end_at; ++i) h = (h ^ static_cast<unsigned char>(text[i])) * 0x100000001b3ull;
        char hex[17];
        text = text.substr(0, end_at) + "end\t" + std::string(hex, std::to_chars(hex, hex + 16, h, 16).ptr) + "\n";
        std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
        changed = true;
    }
    REQUIRE(changed);
    const std::string tampered = trace(cache, 2);
    CHECK(tampered.find("[inlined] " + to + " (libc.so.6)") != std::string::npos);
    CHECK(tampered.find("[inlined] " + from + " (libc.so.6)") == std::string::npos);
    // Without the store's files: libdw's names again, and the files anew.
    for (const fs::path& p : kept) fs::remove(p);
    CHECK(trace(cache, 2) == none);
    for (const fs::path& p : kept) CHECK(fs::exists(p));
    set_debuginfo_cache("", 1);
    fs::remove_all(dir);
}
