// The one perf.data record encoder, shared by the tests' PerfWriter
// (perf_writer.h: small synthetic recordings for edge cases) and
// bench/perfgen (large captures streamed to disk). Each function appends
// one part of a record in the layout perf writes (tools/perf/util/
// synthetic-events.c, perf_event.h), in either byte order.
//
//   Out body;
//   put_sample_body(body, attr, {.id = 101, .pid = 10, .tid = 11, .time = 1000, .raw = raw});
//   std::vector<uint8_t> rec = record_bytes(false, PERF_RECORD_SAMPLE, PERF_RECORD_MISC_USER, body.b);
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/tracepoint_format.h"

namespace gilscan::test {

// Byte output in either byte order.
struct Out {
    std::vector<uint8_t> b;
    bool swap = false;
    template <class T>
    void put(T v) {
        if (swap) v = byteswap_int(v);
        bytes(&v, sizeof(T));
    }
    // GCC 12 warns (-Wstringop-overflow) about the copy once inlined into
    // callers, wrongly: it assumes a size past the end of the address space
    // (with insert() as with resize + memcpy). A known false positive of that
    // version's range tracking.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
    void bytes(const void* p, size_t n) {
        if (n == 0) return;
        const size_t at = b.size();
        b.resize(at + n);
        std::memcpy(b.data() + at, p, n);
    }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    void str(std::string_view s) {
        bytes(s.data(), s.size());
        b.push_back(0);
    }
    void pad(size_t align) {
        while (b.size() % align) b.push_back(0);
    }
    template <class T>
    void patch(size_t at, T v) {
        if (swap) v = byteswap_int(v);
        std::memcpy(b.data() + at, &v, sizeof(T));
    }
    size_t size() const { return b.size(); }
};

// A whole record: the 8-byte perf_event_header, then the body.
std::vector<uint8_t> record_bytes(bool swap, uint32_t type, uint16_t misc, std::span<const uint8_t> body);

// The fields of one PERF_RECORD_SAMPLE; which are written is the attr's
// sample_type, in the kernel's order.
struct SampleView {
    uint64_t id = 0, ip = 0;
    int32_t pid = 0, tid = 0;
    uint64_t time = 0, addr = 0, stream_id = 0;
    uint32_t cpu = 0;
    uint64_t period = 1;
    std::span<const uint64_t> read_values;  // non-group: {value, [id], [lost]} as the format asks
    std::span<const uint64_t> callchain;    // the ips (nr is their count)
    std::span<const uint8_t> raw;
    std::span<const uint64_t> branch;       // 3 u64 per entry
    uint64_t regs_abi = 2;                  // PERF_SAMPLE_REGS_ABI_64; 0 is written when regs_user is empty
    std::span<const uint64_t> regs_user;
    std::span<const uint8_t> stack;         // the copied stack; dyn_size = stack.size()
    uint64_t stack_reserved = 0;            // the size field (>= stack.size())
    uint64_t weight = 0, data_src = 0, transaction = 0, phys_addr = 0, cgroup = 0;
    uint64_t data_page_size = 0, code_page_size = 0;
    std::span<const uint64_t> regs_intr;
    std::span<const uint8_t> aux;
};
void put_sample_body(Out& o, const PerfEventAttr& a, const SampleView& s);

// The sample_id_all trailer of a non-sample record of an event.
struct IdFields {
    uint64_t sample_type = 0, id = 0, stream_id = 0;
};
void put_id_trailer(Out& o, const IdFields& e, int32_t pid, int32_t tid, uint64_t time, uint32_t cpu);

// Bodies of the kernel records, without their trailer.
void put_comm_body(Out& o, int32_t pid, int32_t tid, std::string_view comm);  // NUL, padded to 8
void put_task_body(Out& o, int32_t pid, int32_t ppid, int32_t tid, int32_t ptid, uint64_t time);  // FORK, EXIT
struct Mmap2Fields {
    int32_t pid = 0, tid = 0;
    uint64_t start = 0, len = 0, pgoff = 0;
    uint32_t maj = 0, min = 0;
    uint64_t ino = 0, ino_generation = 0;
    uint32_t prot = 0, flags = 0;
    std::string_view filename;
};
void put_mmap2_body(Out& o, const Mmap2Fields& m);  // device/inode form, NUL, padded to 8

// A tracepoint's payload: common_type and the named fields set (integers
// in the file's byte order, strings inline or as __data_loc after the fixed
// part), padded so that 4 + size is 8-aligned. strict: a field the format
// lacks (or no common_type) throws std::runtime_error; else it is skipped.
struct RawValue {
    std::string_view name;
    int64_t value = 0;
    std::string_view str = {};
    bool is_str = false;
};
std::vector<uint8_t> tracepoint_raw(const TpFormat& f, bool swap, std::span<const RawValue> values, bool strict);

// A file-mode header (perf_file_header): the magic ("PERFILE2", byte-reversed
// in the other byte order), its size, the attrs and data sections, and the
// feature bits.
struct FileLayout {
    uint64_t attr_size = 0, attrs_offset = 0, attrs_size = 0, data_offset = 0, data_size = 0;
    std::vector<unsigned> features;  // HEADER_* bits set
};
std::vector<uint8_t> file_header_bytes(bool swap, const FileLayout& l);

// The feature sections after the data: the table of (offset, size) at
// table_offset, then each section's bytes in order. Sections by feature id,
// ascending, as perf writes them.
using FeatureBytes = std::vector<std::pair<unsigned, std::vector<uint8_t>>>;
std::vector<uint8_t> feature_sections(bool swap, uint64_t table_offset, const FeatureBytes& sections);

}  // namespace gilscan::test
