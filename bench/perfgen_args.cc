// perfgen's options and usage (perfgen.h).
#include "perfgen.h"

#include <cstdlib>

namespace perfgen {

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr,
                 "perfgen: %s\nusage: perfgen [--template F] [--cpus N] [--threads N] [--processes N] [--pid-base N]\n"
                 "               [--seconds S | --events N] [--pipe] [-z] [--stacks] [--seed N] -o OUT\n",
                 why);
    std::exit(2);
}


Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage("missing value");
            return argv[++i];
        };
        if (s == "--template") a.tmpl = val();
        else if (s == "--cpus") a.cpus = static_cast<unsigned>(std::stoul(val()));
        else if (s == "--threads") a.threads = static_cast<unsigned>(std::stoul(val()));
        else if (s == "--processes") a.processes = static_cast<unsigned>(std::stoul(val()));
        else if (s == "--pid-base") a.pid_base = static_cast<int32_t>(std::stol(val()));
        else if (s == "--seconds") a.seconds = std::stod(val());
        else if (s == "--events") a.events = std::stoull(val());
        else if (s == "--seed") a.seed = std::stoull(val());
        else if (s == "--pipe") a.pipe = true;
        else if (s == "-z") a.zstd = true;
        else if (s == "--stacks") a.stacks = true;
        else if (s == "-o") a.out = val();
        else usage(("unknown option " + s).c_str());
    }
    if (a.cpus == 0 || a.threads == 0) usage("--cpus and --threads must be positive");
    // pids are pid_base + 1000 * process, tids count up from there (4194304 = pid_max's limit).
    const unsigned nproc = processes_of(a);
    const int64_t last = int64_t{a.pid_base} + int64_t{1000} * nproc;
    if (a.pid_base <= 0 || last >= (int64_t{1} << 22) || (a.threads - 1) / nproc >= 1000)
        usage("--pid-base: pids must stay in 1..4194303, at most 1000 threads per process");
    if (a.tmpl.empty())
        a.tmpl = std::string(GILSCAN_TESTDATA) + (a.stacks ? "/stacks_py311.data" : "/gil_combined.data");
    return a;
}

// The output file: the header, the template's attrs and features around
// the generated data section, which -z compresses as perf -z does.
}  // namespace perfgen
