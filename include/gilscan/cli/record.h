// `gilscan record`: giltracer's workflow in one command.
//
//   gilscan record [-o out.data] [--gil] [--state] [--stacks] [--gil-functions] -- python3 script.py args
//   gilscan record -p PID [--duration S]      gilscan record -a [--duration S | -- PROGRAM]
//
// Checks perf, permissions and tracefs (one sentence each, with the fix),
// places the GIL uprobes for the Python it is about to run (gilscan probe's
// logic), runs `perf record -k CLOCK_MONOTONIC` with the right events
// (call-graph=dwarf on sched_switch only with --stacks, so uprobes stay
// cheap), runs the program as its own child while perf records it
// (record_run.h: Ctrl-C reaches the program as when run directly), and hands
// the recording back to main for the analysis. The program's exit status
// is gilscan's exit status.
#pragma once

#include <string>
#include <vector>

#include "gilscan/cli/record_run.h"

namespace gilscan {

struct RecordResult {
    int status = 0;            // the recorded program's exit status
    bool analyse = false;      // a recording exists and should be analysed
    std::string data_file;     // perf.data written
    std::string trace;         // trace JSON to write ("" = none)
    std::string summary_json;  // "" = none
    std::string summary;       // --summary FILE: the table there, not on stderr ("" = stderr)
    bool quiet = false;
    bool gil_functions = false;  // --gil-functions: recorded for it, analysed with it
    bool viztracer = false;      // --viztracer: the trace's layout (TraceOptions::viztracer)
};

// Throws gilscan::Error with a user-facing sentence for the problems users hit.
RecordResult record_main(int argc, char** argv);

// gilscan top's recording: what `record --gil` records (and `--blame`'s
// CPU samples and stacks with blame) of the target, which names -p PID or
// a command; perf writes its pipe-mode stream to *target.perf_stdout.
// The probes are placed for the run and removed after it; perf's own lines
// are left out (record -q). Throws gilscan::Error as record_main does.
struct LiveRecordRequest {
    RecordTarget target;
    std::string python;  // --python PATH ("" = the command's, or the attached process's)
    bool blame = true;
    bool thread_names = true;
};
RunOutcome record_live(const LiveRecordRequest& req);

// The perf command line record_main runs (exposed for tests).
// (the target, -p PID or -a, is added by run_recording: record_run.h).
std::vector<std::string> perf_record_args(const std::string& out, bool gil, bool state, bool stacks,
                                          const std::string& probe_group, bool cpu_samples = false);

}  // namespace gilscan
