// Stage (part of symbols): jitdump files, the JIT's own record of the code
// it wrote, as perf's `perf inject --jit` reads them
// (tools/perf/Documentation/jitdump-specification.txt). CPython 3.13+ run
// with `-X perf_jit` writes one, /tmp/jit-PID.dump, instead of the
// /tmp/perf-PID.map that `-X perf` writes: a JIT_CODE_LOAD record per
// Python function's trampoline, named "py::qualname:/path/file.py", each
// after a JIT_CODE_UNWINDING_INFO record with the trampoline's .eh_frame.
//
//   JitDump d = parse_jitdump(bytes, "/tmp/jit-123.dump");
//   for (const JitCode& c : d.codes) ... c.start, c.size, c.name, c.eh_frame
//   if (!d.problem.empty()) ...   // where and why it stopped reading
//
// Why: perf itself names and unwinds JIT code from a jitdump only after
// `perf inject --jit` has turned each load into an ELF file (jitted-PID-N.so)
// and the recording into a new one. gilscan reads the dump beside the
// recording as it reads a perf map (perf_map.h): the same names, no inject.
//
// Like a perf map, a jitdump is auxiliary: whatever does not parse ends the
// reading there (the codes before it are kept) and is said in `problem`,
// never an error. The byte order is the header magic's ("JiTD" as a u32 in
// the writer's order). A JIT_CODE_MOVE moves a code's start; DEBUG_INFO is
// skipped; CLOSE ends the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

inline constexpr uint32_t JITHEADER_MAGIC = 0x4A695444;     // "JiTD" read in the writer's byte order
inline constexpr uint32_t JITHEADER_MAGIC_SW = 0x4454694A;  // the other byte order
inline constexpr uint32_t JIT_CODE_LOAD = 0;
inline constexpr uint32_t JIT_CODE_MOVE = 1;
inline constexpr uint32_t JIT_CODE_DEBUG_INFO = 2;
inline constexpr uint32_t JIT_CODE_CLOSE = 3;
inline constexpr uint32_t JIT_CODE_UNWINDING_INFO = 4;

struct JitCode {
    uint64_t start = 0, size = 0;  // code_addr (after any JIT_CODE_MOVE), code_size
    uint64_t index = 0;            // code_index: the JIT's unique id of the code
    uint64_t time = 0;             // the record's timestamp (the recording's clock)
    std::string name;
    // The unwinding info recorded just before this load (none: empty): its
    // .eh_frame, then its .eh_frame_hdr (eh_frame_hdr_size bytes at the end).
    std::vector<uint8_t> eh_frame;
    uint64_t eh_frame_hdr_size = 0;
};

struct JitDump {
    uint32_t pid = 0;
    uint32_t elf_mach = 0;
    std::vector<JitCode> codes;  // in file order
    uint64_t skipped = 0;        // records of types this reader does not know
    std::string problem;         // why reading stopped early ("" when it did not)
};

// bytes: a whole jitdump file; path names it in `problem`.
JitDump parse_jitdump(Bytes bytes, const std::string& path);

// The marker perf looks for (util/jitdump.c, jit_detect): a mapping of a
// file named jit-<pid>.dump. It is not code, and no module.
bool is_jitdump_path(std::string_view path);
// One of the ELF files `perf inject --jit` writes for a code load:
// jitted-<pid>-<code index>.so (util/jitdump.c).
bool is_injected_jit_path(std::string_view path);

}  // namespace gilscan
