// Stage: GIL blame's outputs — the table after the per-thread one, the
// summary JSON's `gil_blame` array, and folded stacks for flame graphs.
//
//   print_blame_table(stdout, summary);
//   j["gil_blame"] = blame_json(summary);
//   write_folded("blame.folded", lines);   // "root;...;leaf weight" per line
//
// Folded stacks are Brendan Gregg's collapsed format (FlameGraph's
// stackcollapse output, read by flamegraph.pl, inferno, speedscope): one
// line per distinct stack, frames root first joined by ';', a space, an
// integer weight (here microseconds). The first frame names the process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gilscan/gil/blame.h"
#include "gilscan/gil/blame_stacks.h"
#include "gilscan/output/summary.h"

namespace gilscan {

void print_blame_table(std::FILE* out, const FileSummary& fs);
nlohmann::json blame_json(const FileSummary& fs);

// The folded lines of weights by (pid, stack) in ns: µs weights, stacks
// under a microsecond left out, sorted by stack text. comm: pid -> its
// name, for the root frame ("python3 (1234)").
std::vector<std::string> folded_lines(const std::map<std::pair<int32_t, uint32_t>, uint64_t>& ns_by_stack,
                                      const BlameStacks& stacks, const std::map<int32_t, std::string>& comm);
// (blame, waits): the folded lines of the contended holds' stacks and of the
// GIL waits' stacks, of the processes in `pids` (empty: all); none without blame.
std::pair<std::vector<std::string>, std::vector<std::string>> folded_stacks(
    const GilBlame* blame, const BlameStacks* stacks, const FileSummary& summary, const std::unordered_set<int32_t>& pids);
// The lines into `path`, replaced whole (output_file.h): "-" is stdout.
void write_folded(const std::string& path, const std::vector<std::string>& lines);

}  // namespace gilscan
