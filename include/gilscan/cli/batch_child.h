// One recording of `gilscan batch`, analysed in a process of its own: this
// executable run again as `gilscan __batch-one FILE [options]`
// (batch_one_main), which prints one JSON object on stdout:
// {"summary": ..., "date": ...} or {"error": ..., "write_error": ...}.
// A recording that crashes its analysis, exhausts its memory or outlasts
// --timeout takes only that process down; batch_main goes on.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gilscan {

inline constexpr const char* kBatchOneCommand = "__batch-one";

struct BatchResult {
    std::string path;
    std::string error;
    bool write_error = false;  // the recording was read; its trace could not be written
    std::string date;
    nlohmann::json summary;    // summary_json() of the recording, from its analysing process
};

// How long a process past its timeout has to end after SIGTERM (its handler
// removes its temporaries) before it is sent SIGKILL.
inline constexpr int kStopGraceMs = 5000;

// Runs `args` (kBatchOneCommand's argument vector, argv[0] first) as this
// executable, no shell, and reads its answer into r. timeout_s > 0: an
// analysis still running that many seconds after its start is stopped and
// its error says so. Throws gilscan::Error if the process cannot be started.
void analyse_in_child(const std::vector<std::string>& args, double timeout_s, BatchResult& r);

int batch_one_main(int argc, char** argv);

}  // namespace gilscan
