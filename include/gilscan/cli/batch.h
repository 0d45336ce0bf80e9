// `gilscan batch`: many archived recordings, in parallel, one summary row per
// recording and thread.
//
//   gilscan batch -j 4 --summary rows.jsonl --traces traces/ archive/ more.data
//
// PATHs are files or directories searched recursively for *.data,
// *.data.zst (zstd-compressed archives, decompressed to a temporary file) and
// perf.data*. A file that cannot be read gets a row with its error and the
// batch goes on; the exit status is non-zero only if nothing could be read,
// or a trace or table could not be written.
// Binaries that are absent or changed on this machine only cost the stack
// classification of their sleeps (said once per module in the warnings);
// scheduler states and uprobe GIL figures need none. --symfs DIR finds them
// in a tree (an unpacked `perf archive` included). --gil-functions FILE
// writes a second table: GIL waits by Python function, one row per
// recording, process and function (perf maps from --perf-maps DIR).
// --shard K/N analyses one share of the recordings (batch_inputs.h).
// Each recording is analysed in a process of its own (batch_child.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gilscan {

int batch_main(int argc, char** argv);

// A .zst archive unpacked into a file with no name under dir (read it as
// /proc/self/fd/N; close it when done): at most max_bytes, and never into
// the last tenth (at most 1 GiB) of dir's free space. A copy cut short, a
// bomb past the bound or a failed write throws gilscan::Error.
int unpack_zstd_archive(const std::string& in, const std::string& dir, uint64_t max_bytes);

// The most a .zst archive may unpack to unless --max-unpacked says otherwise.
inline constexpr uint64_t kDefaultMaxUnpacked = 64ull << 30;

}  // namespace gilscan
