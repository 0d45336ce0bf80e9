// libFuzzer target over the whole analysis, not just the decoder
// (fuzz_decoder.cc): process maps, the binaries a recording names, DWARF
// unwinding of the recorded user stacks (REGS_USER / STACK_USER bytes taken
// from the file), the GIL locator and uprobe tracker, the sleep classifier,
// kernel callchains, symbolized --sleep-stacks texts and the trace writer.
// Seeded with the real recordings in testdata/ (their maps name this
// machine's Pythons, so mutated stacks are unwound against real CFI), any
// input must end in a summary and a trace or in a gilscan::Error, and -j 2
// or -j 3 (with the reader thread forced on) must give the same summary and
// the same trace bytes as -j 1, or the same error.
//
//   build-fuzz/test/fuzz_analysis -max_total_time=600 -rss_limit_mb=4096 CORPUS testdata
//
// fuzz_analysis_replay replays the checked-in corpus (test/fuzz/analysis_corpus)
// and testdata/ through this function as an ordinary test in every build.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "gilscan/pipeline.h"
#include "gilscan/error.h"
#include "gilscan/output/summary.h"

namespace {

// The analysis reads a path: each input goes to one file in a private
// directory (in /dev/shm when there is one: no disk writes per execution).
// The directory is kept in a plain array: its exit handler runs after the
// destructors of statics made before it was registered.
char g_dir[64];

void remove_work_dir() {
    std::remove((std::string(g_dir) + "/in.data").c_str());
    rmdir(g_dir);
}

std::string work_dir() {
    if (!g_dir[0]) {
        std::snprintf(g_dir, sizeof g_dir, "%s/gilscan-fuzz-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(g_dir)) {
            std::perror("fuzz_analysis: mkdtemp");
            std::abort();
        }
        std::atexit(remove_work_dir);  // trace.json goes after each input, in.data at exit
    }
    return g_dir;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
        std::perror("fuzz_analysis: write");
        std::abort();
    }
}

// One analysis: the summary as JSON and the trace's bytes, or the error.
struct Result {
    std::string error, summary, trace;
};

Result run(const std::string& in, const std::string& out, const gilscan::AnalysisOptions& base, unsigned jobs) {
    gilscan::AnalysisOptions o = base;
    o.input = in;
    o.output = out;
    o.jobs = jobs;
    if (jobs > 1) {
        // The reader thread for any size (by default from 4 MiB), and at -j 2
        // every sleep it can label labelled there, waiting for the stages
        // where it must: the paths a big recording takes, on small inputs.
        o.reader_thread = true;
        if (jobs == 2) o.reader_stacks = true;
    }
    Result r;
    try {
        r.summary = gilscan::json_dump(gilscan::summary_json(gilscan::analyse_recording(o)));
        std::ifstream f(out, std::ios::binary);
        r.trace.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const gilscan::Error& e) {
        r.error = e.what();
    }
    std::remove(out.c_str());
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string in = work_dir() + "/in.data";
    const std::string out = work_dir() + "/trace.json";
    write_file(in, data, size);
    gilscan::AnalysisOptions o;
    o.sleep_stacks = 16;  // symbolize the stacks too, not only classify them
    o.perf_maps = GILSCAN_PERF_MAPS;  // and JIT frames from perf maps
    o.trace.running = true;
    // The last bytes pick the evidence, the threads and --gil-functions, so
    // every shape of input meets both classifiers (a recording with uprobes
    // and stacks under "stacks" too) and -j 2 and -j 3.
    static const char* const kEvidence[] = {"auto", "stacks", "probes"};
    o.gil_evidence = kEvidence[size ? data[size - 1] % 3 : 0];
    const unsigned jobs = size > 1 ? 2 + data[size - 2] % 2 : 2;
    // And whether GIL waits' Python functions are sought (past the 16 frames kept).
    o.gil_functions = size > 2 && data[size - 3] % 2;
    // -j 1 is the reference: every -j must give the same summary and the
    // same trace bytes, or the same error.
    const Result one = run(in, out, o, 1);
    const Result many = run(in, out, o, jobs);
    if (one.error != many.error || one.summary != many.summary || one.trace != many.trace) {
        std::fprintf(stderr, "fuzz_analysis: -j 1 and -j %u differ (evidence %s):\n  error: \"%s\" / \"%s\"\n"
                             "  summary equal: %d, trace equal: %d (%zu / %zu bytes)\n",
                     jobs, o.gil_evidence.c_str(), one.error.c_str(), many.error.c_str(),
                     one.summary == many.summary, one.trace == many.trace, one.trace.size(), many.trace.size());
        std::abort();
    }
    return 0;
}
