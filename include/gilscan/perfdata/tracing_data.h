// HEADER_TRACING_DATA: the tracefs snapshot perf embeds (util/trace-event-read.c).
//
//   TracingData td = parse_tracing_data(section_bytes, path, section_offset);
//   const TpFormat* sw = td.by_id(attr.config);   // attr.config == format ID
//   td.saved_cmdlines[1234]                       // "python3" (version 0.6+)
//
// Layout: "\x17\x08\x44tracing", version string, u8 big_endian, u8 long_size,
// u32 page_size, header_page, header_event, ftrace formats, per-system event
// formats, kallsyms, printk formats, then (0.6) saved cmdlines. Numbers use
// the byte order named by big_endian, not the perf.data header's.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/tracepoint_format.h"

namespace gilscan {

struct TracingData {
    std::string version;
    bool big_endian = false;
    uint8_t long_size = 8;
    uint32_t page_size = 0;
    std::vector<TpFormat> events;
    std::unordered_map<uint32_t, int32_t> saved_cmdlines;  // pid -> index in cmdline_names
    std::vector<std::string> cmdline_names;
    std::vector<std::string> warnings;  // broken format files that were skipped

    const TpFormat* by_id(uint64_t id) const;
    const TpFormat* by_name(std::string_view system_colon_name) const;
    bool swap() const;  // raw tracepoint payloads need swapping
    uint64_t consumed = 0;  // bytes of the input the tracing data occupied
};

TracingData parse_tracing_data(Bytes data, const std::string& path, uint64_t base_offset);

// Fallback when a recording lost its tracing data (perf killed, file cut):
// read the format of every tracepoint id wanted from this machine's tracefs.
TracingData tracing_data_from_tracefs(const std::vector<uint64_t>& ids);

}  // namespace gilscan
