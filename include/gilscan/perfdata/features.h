// Header feature sections that gilscan uses (tools/perf/util/header.c).
//
//   Features f;
//   for (auto& fs : read_feature_table(bytes, h, path))
//       parse_feature(f, fs.feature, Cursor(bytes.subspan(fs.section.offset, fs.section.size),
//                                           h.swap, &path, fs.section.offset));
//   f.event_desc[0].name   // "sched:sched_switch"
//   f.tracing_data         // span handed to parse_tracing_data()
//
// Pipe mode delivers the same payloads in PERF_RECORD_HEADER_FEATURE records;
// the same parse_feature() reads them. Unknown features are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/header.h"

namespace gilscan {

struct EventDesc {
    PerfEventAttr attr;
    std::string name;
    std::vector<uint64_t> ids;
};

struct BuildIdEntry {
    int32_t pid = 0;
    std::vector<uint8_t> build_id;
    std::string filename;
};

struct ClockData {
    uint32_t clockid = 0;
    uint64_t tod_ns = 0;      // wall clock at the reference point
    uint64_t clockid_ns = 0;  // the recording clock at the same point
};

struct CompressionInfo {
    uint32_t version = 0;
    uint32_t type = 0;  // 1 = zstd
    uint32_t level = 0;
    uint32_t ratio = 0;
    uint32_t mmap_len = 0;
};

struct Features {
    std::string hostname, os_release, perf_version, arch, cpu_desc;
    uint32_t nr_cpus_avail = 0, nr_cpus_online = 0;
    std::vector<std::string> cmdline;
    std::vector<EventDesc> event_desc;
    std::vector<BuildIdEntry> build_ids;
    std::optional<uint64_t> clockid_res_ns;
    std::optional<ClockData> clock_data;
    std::optional<std::pair<uint64_t, uint64_t>> sample_time;  // first, last
    std::optional<CompressionInfo> compression;
    Bytes tracing_data;  // HEADER_TRACING_DATA payload (file mode)
    uint64_t tracing_data_offset = 0;
};

void parse_feature(Features& f, unsigned feature, Cursor c);

// perf's do_write_string: u32 padded length, then NUL-padded chars.
std::string read_feature_string(Cursor& c);

// Human-readable clock name for a clockid (CLOCK_MONOTONIC, ...).
std::string clock_name(int32_t clockid);

}  // namespace gilscan
