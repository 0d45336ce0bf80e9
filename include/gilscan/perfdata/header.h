// The perf.data file header, the attrs section and the feature-section table.
//
//   FileHeader h = read_file_header(file.bytes(), file.path());
//   if (!h.pipe) {
//       std::vector<EventAttr> attrs = read_attrs(file.bytes(), h, file.path());
//       auto sections = read_feature_table(file.bytes(), h, file.path());
//   }
//
// Byte order is decided here, once, from the magic ("PERFILE2" as a u64, or
// its byte-swapped value). A 16-byte header means pipe mode: attrs, tracing
// data and features then arrive as records in the data stream.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

struct FileSection {
    uint64_t offset = 0;
    uint64_t size = 0;
};

struct FileHeader {
    bool pipe = false;
    bool swap = false;          // file byte order differs from ours
    uint64_t header_size = 0;
    uint64_t attr_size = 0;
    FileSection attrs, data, event_types;
    std::bitset<HEADER_FEAT_BITS> features;
    bool data_size_was_zero = false;  // perf killed: data read to end of file
    bool truncated = false;           // the declared data section runs past EOF
    uint64_t declared_data_end = 0;   // data.offset + data.size as written by perf
};

// perf_event_attr, fields by name. `flags` holds the bitfield word with bit k
// meaning the k-th bitfield (disabled = 0), whatever the file's byte order.
struct PerfEventAttr {
    uint32_t type = 0;
    uint32_t size = 0;
    uint64_t config = 0;
    uint64_t sample_period = 0;
    uint64_t sample_type = 0;
    uint64_t read_format = 0;
    uint64_t flags = 0;
    uint32_t wakeup_events = 0;
    uint32_t bp_type = 0;
    uint64_t config1 = 0;
    uint64_t config2 = 0;
    uint64_t branch_sample_type = 0;
    uint64_t sample_regs_user = 0;
    uint32_t sample_stack_user = 0;
    int32_t clockid = 0;
    uint64_t sample_regs_intr = 0;
    uint32_t aux_watermark = 0;
    uint16_t sample_max_stack = 0;

    bool flag(unsigned bit) const { return (flags >> bit) & 1; }
    bool sample_id_all() const { return flag(ATTR_BIT_sample_id_all); }
    bool use_clockid() const { return flag(ATTR_BIT_use_clockid); }
};

struct EventAttr {
    PerfEventAttr attr;
    std::vector<uint64_t> ids;
    std::string name;  // from HEADER_EVENT_DESC / EVENT_UPDATE / tracing formats
};

FileHeader read_file_header(Bytes file, const std::string& path);

// Reads one perf_event_attr whose own `size` field gives its length (0 means
// PERF_ATTR_SIZE_VER0); consumes exactly that many bytes.
PerfEventAttr read_perf_event_attr(Cursor& c);

std::vector<EventAttr> read_attrs(Bytes file, const FileHeader& h, const std::string& path);

// One {offset,size} per set feature bit, in bit order, stored after the data.
struct FeatureSection {
    unsigned feature = 0;
    FileSection section;
};
std::vector<FeatureSection> read_feature_table(Bytes file, const FileHeader& h, const std::string& path);

}  // namespace gilscan
