// The whole analysis (analyse_recording) on real recordings: --gil-functions
// against perf script, --sleep-stacks, on_complete, the summary JSON, the
// caches giving the same stacks.
#include <doctest/doctest.h>

#include "golden_fixtures.h"
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
    CHECK(warned("gil_combined", "auto", "--gil-functions: no event of the recording has user stacks"));
    CHECK(warned("stacks_py311", "auto", "--gil-functions: no GIL wait's stack reached a Python function"));
    CHECK_FALSE(warned("stacks_py311", "auto", "no GIL waits were found"));
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

