#include "gilscan/perfdata/sample.h"

#include <bit>

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

namespace {

U64Array read_u64s(Cursor& c, uint64_t n, const char* what) {
    c.check_count(n, 8, what);
    return U64Array{c.bytes(n * 8), c.swap()};
}

void read_pid_tid(Cursor& c, SampleId& s) {
    s.pid = c.read<int32_t>();
    s.tid = c.read<int32_t>();
}

void read_cpu(Cursor& c, SampleId& s) {
    s.cpu = c.read<uint32_t>();
    c.skip(4);  // res
}

void skip_read_format(Cursor& c, uint64_t read_format, Sample& s) {
    const uint64_t times = std::popcount(read_format & (PERF_FORMAT_TOTAL_TIME_ENABLED |
                                                         PERF_FORMAT_TOTAL_TIME_RUNNING));
    const uint64_t per_value = 1 + ((read_format & PERF_FORMAT_ID) ? 1 : 0) + ((read_format & PERF_FORMAT_LOST) ? 1 : 0);
    if (read_format & PERF_FORMAT_GROUP) {
        uint64_t nr = c.read<uint64_t>();
        c.skip(times * 8);
        c.check_count(nr, per_value * 8, "read_format group");
        c.skip(nr * per_value * 8);
    } else {
        c.skip(8 + times * 8);  // value, times
        if (read_format & PERF_FORMAT_ID) c.skip(8);
        if (read_format & PERF_FORMAT_LOST) s.lost = c.read<uint64_t>();
    }
}

}  // namespace

void parse_sample(Cursor&& c, const PerfEventAttr& attr, Sample& s) {
    const uint64_t t = attr.sample_type;
    if (t & PERF_SAMPLE_IDENTIFIER) s.id = c.read<uint64_t>();
    if (t & PERF_SAMPLE_IP) s.ip = c.read<uint64_t>();
    if (t & PERF_SAMPLE_TID) read_pid_tid(c, s);
    if (t & PERF_SAMPLE_TIME) {
        s.time = c.read<uint64_t>();
        s.has_time = true;
    }
    if (t & PERF_SAMPLE_ADDR) s.addr = c.read<uint64_t>();
    if (t & PERF_SAMPLE_ID) s.id = c.read<uint64_t>();
    if (t & PERF_SAMPLE_STREAM_ID) s.stream_id = c.read<uint64_t>();
    if (t & PERF_SAMPLE_CPU) read_cpu(c, s);
    if (t & PERF_SAMPLE_PERIOD) s.period = c.read<uint64_t>();
    if (t & PERF_SAMPLE_READ) skip_read_format(c, attr.read_format, s);
    if (t & PERF_SAMPLE_CALLCHAIN) s.callchain = read_u64s(c, c.read<uint64_t>(), "callchain");
    if (t & PERF_SAMPLE_RAW) {
        uint32_t size = c.read<uint32_t>();
        s.raw = c.bytes(size);  // u32 size + data is padded to 8 by the kernel inside size
    }
    if (t & PERF_SAMPLE_BRANCH_STACK) {
        s.branch_nr = c.read<uint64_t>();
        if (attr.branch_sample_type & PERF_SAMPLE_BRANCH_HW_INDEX) c.skip(8);
        c.check_count(s.branch_nr, 24, "branch stack");
        c.skip(s.branch_nr * 24);
    }
    if (t & PERF_SAMPLE_REGS_USER) {
        s.regs_user_abi = c.read<uint64_t>();
        s.regs_user_mask = 0;
        s.regs_user = {};
        if (s.regs_user_abi != 0) {
            s.regs_user_mask = attr.sample_regs_user;
            s.regs_user = read_u64s(c, std::popcount(attr.sample_regs_user), "regs_user");
        }
    }
    if (t & PERF_SAMPLE_STACK_USER) {
        uint64_t size = c.read<uint64_t>();
        s.stack_user_size = size;
        s.stack_user = {};
        if (size != 0) {
            Bytes data = c.bytes(size);
            uint64_t dyn_size = c.read<uint64_t>();
            // Only dyn_size bytes were copied; the rest is zero fill.
            s.stack_user = data.first(static_cast<size_t>(std::min(dyn_size, size)));
        }
    }
    if (t & (PERF_SAMPLE_WEIGHT | PERF_SAMPLE_WEIGHT_STRUCT)) s.weight = c.read<uint64_t>();
    if (t & PERF_SAMPLE_DATA_SRC) s.data_src = c.read<uint64_t>();
    if (t & PERF_SAMPLE_TRANSACTION) s.transaction = c.read<uint64_t>();
    if (t & PERF_SAMPLE_REGS_INTR) {
        s.regs_intr_abi = c.read<uint64_t>();
        s.regs_intr = {};
        if (s.regs_intr_abi != 0) s.regs_intr = read_u64s(c, std::popcount(attr.sample_regs_intr), "regs_intr");
    }
    if (t & PERF_SAMPLE_PHYS_ADDR) s.phys_addr = c.read<uint64_t>();
    if (t & PERF_SAMPLE_CGROUP) s.cgroup = c.read<uint64_t>();
    if (t & PERF_SAMPLE_DATA_PAGE_SIZE) s.data_page_size = c.read<uint64_t>();
    if (t & PERF_SAMPLE_CODE_PAGE_SIZE) s.code_page_size = c.read<uint64_t>();
    if (t & PERF_SAMPLE_AUX) {
        uint64_t size = c.read<uint64_t>();
        s.aux = c.bytes(size);
    }
}

SampleLayout sample_layout(const PerfEventAttr& attr) {
    constexpr uint64_t kFixedFields = PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
                                      PERF_SAMPLE_ADDR | PERF_SAMPLE_ID | PERF_SAMPLE_STREAM_ID | PERF_SAMPLE_CPU |
                                      PERF_SAMPLE_PERIOD;
    const uint64_t t = attr.sample_type;
    SampleLayout l;
    // RAW may come last; anything else after the fixed fields: parse_sample.
    if (t & ~(kFixedFields | PERF_SAMPLE_RAW)) return l;
    int at = 0;
    auto field = [&](uint64_t bit, int8_t& off) {
        if (t & bit) {
            off = static_cast<int8_t>(at);
            at += 8;  // TID is pid+tid, CPU is cpu+res: 8 bytes each too
        }
    };
    // In parse_sample's order (linux/perf_event.h's PERF_RECORD_SAMPLE).
    field(PERF_SAMPLE_IDENTIFIER, l.identifier);
    field(PERF_SAMPLE_IP, l.ip);
    field(PERF_SAMPLE_TID, l.tid);
    field(PERF_SAMPLE_TIME, l.time);
    field(PERF_SAMPLE_ADDR, l.addr);
    field(PERF_SAMPLE_ID, l.id);
    field(PERF_SAMPLE_STREAM_ID, l.stream_id);
    field(PERF_SAMPLE_CPU, l.cpu);
    field(PERF_SAMPLE_PERIOD, l.period);
    l.size = static_cast<uint8_t>(at);
    l.raw = (t & PERF_SAMPLE_RAW) != 0;
    l.fixed = true;
    constexpr uint64_t kTp = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU |
                             PERF_SAMPLE_PERIOD | PERF_SAMPLE_RAW;
    if (t == (kTp | PERF_SAMPLE_ID)) l.shape = SampleLayout::Shape::TpId;
    if (t == (kTp | PERF_SAMPLE_IDENTIFIER)) l.shape = SampleLayout::Shape::TpIdentifier;
    return l;
}

namespace {

// A tracepoint's sample in one of perf record's two usual layouts: the id
// at `id`, IP, TID and TIME at `ip` and the 8 bytes after each, then CPU,
// PERIOD and RAW's size at 32, 40 and 48.
template <bool swap, int id, int ip>
bool parse_tp(Bytes body, Sample& s) {
    const size_t n = body.size();
    if (n < 52) return false;
    const uint8_t* p = body.data();
    const uint32_t size = load<uint32_t>(p + 48, swap);
    if (size > n - 52) return false;
    s.raw = body.subspan(52, size);
    s.id = load<uint64_t>(p + id, swap);
    s.ip = load<uint64_t>(p + ip, swap);
    s.pid = load<int32_t>(p + ip + 8, swap);
    s.tid = load<int32_t>(p + ip + 12, swap);
    s.time = load<uint64_t>(p + ip + 16, swap);
    s.has_time = true;
    s.cpu = load<uint32_t>(p + 32, swap);
    s.period = load<uint64_t>(p + 40, swap);
    return true;
}

// swap: the byte order as a compile-time constant (see with_byte_order).
template <bool swap>
bool parse_fixed(Bytes body, const SampleLayout& l, Sample& s) {
    const size_t n = body.size();
    if (n < l.size + (l.raw ? 4u : 0u)) return false;
    const uint8_t* p = body.data();
    if (l.raw) {
        const uint32_t size = load<uint32_t>(p + l.size, swap);
        if (size > n - l.size - 4) return false;
        s.raw = body.subspan(l.size + 4u, size);
    }
    // As parse_sample: ID after IDENTIFIER (both are the id; ID wins).
    if (l.identifier >= 0) s.id = load<uint64_t>(p + l.identifier, swap);
    if (l.ip >= 0) s.ip = load<uint64_t>(p + l.ip, swap);
    if (l.tid >= 0) {
        s.pid = load<int32_t>(p + l.tid, swap);
        s.tid = load<int32_t>(p + l.tid + 4, swap);
    }
    if (l.time >= 0) {
        s.time = load<uint64_t>(p + l.time, swap);
        s.has_time = true;
    }
    if (l.addr >= 0) s.addr = load<uint64_t>(p + l.addr, swap);
    if (l.id >= 0) s.id = load<uint64_t>(p + l.id, swap);
    if (l.stream_id >= 0) s.stream_id = load<uint64_t>(p + l.stream_id, swap);
    if (l.cpu >= 0) s.cpu = load<uint32_t>(p + l.cpu, swap);
    if (l.period >= 0) s.period = load<uint64_t>(p + l.period, swap);
    return true;
}

}  // namespace

// Out of line: inlined beside the two usual shapes (as it was once), the
// compiler loaded all of the layout's offsets for it before the shape test
// and kept them on the stack, some twenty instructions on every sample.
__attribute__((noinline)) bool parse_any_fixed(Bytes body, bool swap, const SampleLayout& l, Sample& s) {
    return with_byte_order(swap, [&](auto sw) { return parse_fixed<decltype(sw)::value>(body, l, s); });
}

bool parse_sample_fixed(Bytes body, bool swap, const SampleLayout& l, Sample& s) {
    switch (l.shape) {
    case SampleLayout::Shape::TpId:
        return with_byte_order(swap, [&](auto sw) { return parse_tp<decltype(sw)::value, 24, 0>(body, s); });
    case SampleLayout::Shape::TpIdentifier:
        return with_byte_order(swap, [&](auto sw) { return parse_tp<decltype(sw)::value, 0, 8>(body, s); });
    case SampleLayout::Shape::Any: break;
    }
    return parse_any_fixed(body, swap, l, s);
}

uint64_t sample_id_trailer_size(uint64_t t) {
    return 8 * static_cast<uint64_t>(std::popcount(t & (PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID |
                                                        PERF_SAMPLE_STREAM_ID | PERF_SAMPLE_CPU |
                                                        PERF_SAMPLE_IDENTIFIER)));
}

bool parse_sample_id_trailer(Bytes body, const PerfEventAttr& attr, bool swap, SampleId& s) {
    if (!attr.sample_id_all()) return false;
    const uint64_t t = attr.sample_type;
    uint64_t size = sample_id_trailer_size(t);
    if (size == 0 || size > body.size()) return false;
    Cursor c(body.subspan(body.size() - size), swap, nullptr, 0);
    if (t & PERF_SAMPLE_TID) read_pid_tid(c, s);
    if (t & PERF_SAMPLE_TIME) {
        s.time = c.read<uint64_t>();
        s.has_time = true;
    }
    if (t & PERF_SAMPLE_ID) s.id = c.read<uint64_t>();
    if (t & PERF_SAMPLE_STREAM_ID) s.stream_id = c.read<uint64_t>();
    if (t & PERF_SAMPLE_CPU) read_cpu(c, s);
    if (t & PERF_SAMPLE_IDENTIFIER) s.id = c.read<uint64_t>();
    return true;
}

IdLayout id_layout(const PerfEventAttr& attr) {
    const uint64_t t = attr.sample_type;
    IdLayout l;
    if (t & PERF_SAMPLE_IDENTIFIER) {
        l.sample_index = 0;
        l.trailer_index = attr.sample_id_all() ? 1 : -1;
        return l;
    }
    if (t & PERF_SAMPLE_ID) {
        l.sample_index = std::popcount(t & (PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR));
        if (attr.sample_id_all())
            l.trailer_index = 1 + std::popcount(t & (PERF_SAMPLE_CPU | PERF_SAMPLE_STREAM_ID));
    }
    return l;
}

int sample_time_index(uint64_t t) {
    if (!(t & PERF_SAMPLE_TIME)) return -1;
    return std::popcount(t & (PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_IP | PERF_SAMPLE_TID));
}

}  // namespace gilscan
