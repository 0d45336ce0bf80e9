// PERF_RECORD_SAMPLE bodies and the sample_id_all trailer of other records.
//
//   IdLayout lay = id_layout(attrs);                 // where the event id sits
//   uint64_t id = sample_id_of(body, lay, swap);     // -> which attr
//   Sample s;
//   parse_sample(Cursor(body, swap, &path, off), attr, s);
//   s.raw            // tracepoint payload (starts with u16 common_type)
//   s.stack_user     // only the dyn_size valid bytes; data[0] is at user SP
//
// Field order follows the kernel's perf_output_sample() (and perf's
// evsel__parse_sample): IDENTIFIER, IP, TID, TIME, ADDR, ID, STREAM_ID, CPU,
// PERIOD, READ, CALLCHAIN, RAW, BRANCH_STACK, REGS_USER, STACK_USER, WEIGHT*,
// DATA_SRC, TRANSACTION, REGS_INTR, PHYS_ADDR, CGROUP, DATA_PAGE_SIZE,
// CODE_PAGE_SIZE, AUX.
#pragma once

#include <cstdint>
#include <vector>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/header.h"

namespace gilscan {

// The fields that both samples and sample_id_all trailers can carry.
struct SampleId {
    int32_t pid = -1, tid = -1;
    uint64_t time = 0;
    bool has_time = false;
    uint64_t id = 0;
    uint64_t stream_id = 0;
    uint32_t cpu = ~0u;
};

struct Sample : SampleId {
    uint64_t ip = 0, addr = 0, period = 0;
    uint64_t lost = 0;  // PERF_FORMAT_LOST of a non-group read
    U64Array callchain;
    Bytes raw;
    uint64_t branch_nr = 0;
    uint64_t regs_user_abi = 0;
    uint64_t regs_user_mask = 0;
    U64Array regs_user;       // popcount(mask) values in bit order
    Bytes stack_user;         // first dyn_size bytes of the copied stack
    uint64_t stack_user_size = 0;  // bytes the kernel reserved (size field)
    uint64_t weight = 0, data_src = 0, transaction = 0, phys_addr = 0, cgroup = 0;
    uint64_t data_page_size = 0, code_page_size = 0;
    uint64_t regs_intr_abi = 0;
    U64Array regs_intr;
    Bytes aux;
    const void* note = nullptr;  // what a ReaderStage attached to the record (Session sets it)
};

// Parses the whole body; throws gilscan::Error when a count or size runs past it.
// Every field the attr's sample_type selects is (re)written, so one Sample can
// be reused for the samples of one attr without clearing it in between.
// (The cursor by reference: copied by value, the caller built it with 8-byte
// stores and the copy read it with 16-byte loads, a store-forwarding stall
// on every sample.)
void parse_sample(Cursor&& c, const PerfEventAttr& attr, Sample& s);

// Where each field sits when everything before RAW has a fixed size: the
// scheduler tracepoints and GIL uprobes gilscan reads (IDENTIFIER, IP, TID,
// TIME, ADDR, ID, STREAM_ID, CPU, PERIOD, then RAW or nothing). Byte offsets
// in the body, -1 for fields the attr does not select. Worked out once per
// attr (Session keeps it in EventInfo): parse_sample walks sample_type bit
// by bit through a checked cursor, about 170 instructions per scheduler
// sample, the largest single item of the stages' decoding.
//
//   const SampleLayout l = sample_layout(attr);
//   if (!l.fixed || !parse_sample_fixed(body, swap, l, s)) parse_sample(Cursor(body, ...), attr, s);
struct SampleLayout {
    bool fixed = false;  // false: parse_sample only
    bool raw = false;    // PERF_SAMPLE_RAW, its u32 size at `size`
    int8_t identifier = -1, ip = -1, tid = -1, time = -1, addr = -1, id = -1, stream_id = -1, cpu = -1, period = -1;
    uint8_t size = 0;  // bytes of the fixed fields
    // The layouts perf record gives tracepoints and uprobes, read at constant
    // offsets (a test per field was some 45 instructions a sample):
    // IP|TID|TIME|ID|CPU|PERIOD|RAW (several events) and
    // IDENTIFIER|IP|TID|TIME|CPU|PERIOD|RAW (beside a --call-graph event).
    enum class Shape : uint8_t { Any, TpId, TpIdentifier } shape = Shape::Any;
};
SampleLayout sample_layout(const PerfEventAttr& attr);

// The same fields as parse_sample writes, read at the layout's offsets.
// False when the body is too short for them (or for RAW's size): then
// parse_sample on the same body throws the error to report.
bool parse_sample_fixed(Bytes body, bool swap, const SampleLayout& l, Sample& s);

// Trailer of a non-sample record (sample_id_all), read from the end of the body.
bool parse_sample_id_trailer(Bytes body, const PerfEventAttr& attr, bool swap, SampleId& out);
uint64_t sample_id_trailer_size(uint64_t sample_type);

// Position of the event id, which must agree across attrs (perf requires it).
struct IdLayout {
    int sample_index = -1;  // u64 index from the start of a SAMPLE body, -1: none
    int trailer_index = -1; // u64 index from the end of other records, -1: none
};
IdLayout id_layout(const PerfEventAttr& attr);

// Offset in u64s of TIME in a sample body, -1 when the attr has no TIME.
int sample_time_index(uint64_t sample_type);

}  // namespace gilscan
