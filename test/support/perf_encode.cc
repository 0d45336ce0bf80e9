#include "perf_encode.h"

#include <algorithm>
#include <stdexcept>

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan::test {

std::vector<uint8_t> record_bytes(bool swap, uint32_t type, uint16_t misc, std::span<const uint8_t> body) {
    Out o;
    o.swap = swap;
    o.b.reserve(8 + body.size());
    o.put<uint32_t>(type);
    o.put<uint16_t>(misc);
    o.put<uint16_t>(static_cast<uint16_t>(8 + body.size()));
    o.bytes(body.data(), body.size());
    return std::move(o.b);
}

namespace {

void put_words(Out& o, std::span<const uint64_t> v) {
    for (uint64_t x : v) o.put<uint64_t>(x);
}

void put_regs(Out& o, uint64_t abi, std::span<const uint64_t> regs) {
    o.put<uint64_t>(regs.empty() ? 0 : abi);
    put_words(o, regs);
}

void put_stack_user(Out& o, const SampleView& s) {
    const uint64_t size = std::max<uint64_t>(s.stack_reserved, s.stack.size());
    o.put<uint64_t>(size);
    if (size == 0) return;
    o.bytes(s.stack.data(), s.stack.size());
    o.b.resize(o.b.size() + (size - s.stack.size()), 0);
    o.put<uint64_t>(s.stack.size());
}

}  // namespace

void put_sample_body(Out& o, const PerfEventAttr& a, const SampleView& s) {
    const uint64_t t = a.sample_type;
    if (t & PERF_SAMPLE_IDENTIFIER) o.put<uint64_t>(s.id);
    if (t & PERF_SAMPLE_IP) o.put<uint64_t>(s.ip);
    if (t & PERF_SAMPLE_TID) {
        o.put<int32_t>(s.pid);
        o.put<int32_t>(s.tid);
    }
    if (t & PERF_SAMPLE_TIME) o.put<uint64_t>(s.time);
    if (t & PERF_SAMPLE_ADDR) o.put<uint64_t>(s.addr);
    if (t & PERF_SAMPLE_ID) o.put<uint64_t>(s.id);
    if (t & PERF_SAMPLE_STREAM_ID) o.put<uint64_t>(s.stream_id);
    if (t & PERF_SAMPLE_CPU) {
        o.put<uint32_t>(s.cpu);
        o.put<uint32_t>(0);
    }
    if (t & PERF_SAMPLE_PERIOD) o.put<uint64_t>(s.period);
    if (t & PERF_SAMPLE_READ) put_words(o, s.read_values);
    if (t & PERF_SAMPLE_CALLCHAIN) {
        o.put<uint64_t>(s.callchain.size());
        put_words(o, s.callchain);
    }
    if (t & PERF_SAMPLE_RAW) {
        o.put<uint32_t>(static_cast<uint32_t>(s.raw.size()));
        o.bytes(s.raw.data(), s.raw.size());
    }
    if (t & PERF_SAMPLE_BRANCH_STACK) {
        o.put<uint64_t>(s.branch.size() / 3);
        if (a.branch_sample_type & PERF_SAMPLE_BRANCH_HW_INDEX) o.put<uint64_t>(0);
        put_words(o, s.branch);
    }
    if (t & PERF_SAMPLE_REGS_USER) put_regs(o, s.regs_abi, s.regs_user);
    if (t & PERF_SAMPLE_STACK_USER) put_stack_user(o, s);
    if (t & (PERF_SAMPLE_WEIGHT | PERF_SAMPLE_WEIGHT_STRUCT)) o.put<uint64_t>(s.weight);
    if (t & PERF_SAMPLE_DATA_SRC) o.put<uint64_t>(s.data_src);
    if (t & PERF_SAMPLE_TRANSACTION) o.put<uint64_t>(s.transaction);
    if (t & PERF_SAMPLE_REGS_INTR) put_regs(o, s.regs_abi, s.regs_intr);
    if (t & PERF_SAMPLE_PHYS_ADDR) o.put<uint64_t>(s.phys_addr);
    if (t & PERF_SAMPLE_CGROUP) o.put<uint64_t>(s.cgroup);
    if (t & PERF_SAMPLE_DATA_PAGE_SIZE) o.put<uint64_t>(s.data_page_size);
    if (t & PERF_SAMPLE_CODE_PAGE_SIZE) o.put<uint64_t>(s.code_page_size);
    if (t & PERF_SAMPLE_AUX) {
        o.put<uint64_t>(s.aux.size());
        o.bytes(s.aux.data(), s.aux.size());
    }
}

void put_id_trailer(Out& o, const IdFields& e, int32_t pid, int32_t tid, uint64_t time, uint32_t cpu) {
    const uint64_t t = e.sample_type;
    if (t & PERF_SAMPLE_TID) {
        o.put<int32_t>(pid);
        o.put<int32_t>(tid);
    }
    if (t & PERF_SAMPLE_TIME) o.put<uint64_t>(time);
    if (t & PERF_SAMPLE_ID) o.put<uint64_t>(e.id);
    if (t & PERF_SAMPLE_STREAM_ID) o.put<uint64_t>(e.stream_id);
    if (t & PERF_SAMPLE_CPU) {
        o.put<uint32_t>(cpu);
        o.put<uint32_t>(0);
    }
    if (t & PERF_SAMPLE_IDENTIFIER) o.put<uint64_t>(e.id);
}

void put_comm_body(Out& o, int32_t pid, int32_t tid, std::string_view comm) {
    o.put<int32_t>(pid);
    o.put<int32_t>(tid);
    o.str(comm);
    o.pad(8);
}

void put_task_body(Out& o, int32_t pid, int32_t ppid, int32_t tid, int32_t ptid, uint64_t time) {
    o.put<int32_t>(pid);
    o.put<int32_t>(ppid);
    o.put<int32_t>(tid);
    o.put<int32_t>(ptid);
    o.put<uint64_t>(time);
}

void put_mmap2_body(Out& o, const Mmap2Fields& m) {
    o.put<int32_t>(m.pid);
    o.put<int32_t>(m.tid);
    o.put<uint64_t>(m.start);
    o.put<uint64_t>(m.len);
    o.put<uint64_t>(m.pgoff);
    o.put<uint32_t>(m.maj);
    o.put<uint32_t>(m.min);
    o.put<uint64_t>(m.ino);
    o.put<uint64_t>(m.ino_generation);
    o.put<uint32_t>(m.prot);
    o.put<uint32_t>(m.flags);
    o.str(m.filename);
    o.pad(8);
}

std::vector<uint8_t> tracepoint_raw(const TpFormat& f, bool swap, std::span<const RawValue> values, bool strict) {
    size_t size = 0;
    for (const auto& fl : f.fields) size = std::max<size_t>(size, uint64_t{fl.offset} + fl.size);
    std::vector<uint8_t> r(size, 0);
    auto put_int = [&](const TpField& fl, uint64_t v) {
        Out o;
        o.swap = swap;
        switch (fl.size) {
        case 1: o.put<uint8_t>(static_cast<uint8_t>(v)); break;
        case 2: o.put<uint16_t>(static_cast<uint16_t>(v)); break;
        case 4: o.put<uint32_t>(static_cast<uint32_t>(v)); break;
        default: o.put<uint64_t>(v); break;
        }
        if (uint64_t{fl.offset} + o.b.size() <= r.size()) std::memcpy(r.data() + fl.offset, o.b.data(), o.b.size());
    };
    if (const TpField* common_type = f.field("common_type")) put_int(*common_type, f.id);
    else if (strict) throw std::runtime_error("format without common_type");
    for (const RawValue& v : values) {
        const TpField* fl = f.field(v.name);
        if (!fl) {
            if (strict) throw std::runtime_error("no field " + std::string(v.name));
            continue;
        }
        if (v.is_str && fl->data_loc) {
            const uint32_t off = static_cast<uint32_t>(r.size());
            r.insert(r.end(), v.str.begin(), v.str.end());
            r.push_back(0);
            put_int(*fl, (static_cast<uint64_t>(v.str.size() + 1) << 16) | off);
        } else if (v.is_str) {
            std::memcpy(r.data() + fl->offset, v.str.data(), std::min<size_t>(v.str.size(), fl->size - 1));
        } else {
            put_int(*fl, static_cast<uint64_t>(v.value));
        }
    }
    while ((r.size() + 4) % 8) r.push_back(0);
    return r;
}

std::vector<uint8_t> file_header_bytes(bool swap, const FileLayout& l) {
    Out o;
    o.swap = swap;
    o.b.resize(104, 0);
    std::memcpy(o.b.data(), "PERFILE2", 8);
    if (swap) std::reverse(o.b.begin(), o.b.begin() + 8);
    o.patch<uint64_t>(8, 104);
    o.patch<uint64_t>(16, l.attr_size);
    o.patch<uint64_t>(24, l.attrs_offset);
    o.patch<uint64_t>(32, l.attrs_size);
    o.patch<uint64_t>(40, l.data_offset);
    o.patch<uint64_t>(48, l.data_size);
    uint64_t bits[4] = {};
    for (unsigned f : l.features)
        if (f < 256) bits[f / 64] |= uint64_t{1} << (f % 64);
    for (int k = 0; k < 4; ++k) o.patch<uint64_t>(72 + 8 * static_cast<size_t>(k), bits[k]);
    return std::move(o.b);
}

std::vector<uint8_t> feature_sections(bool swap, uint64_t table_offset, const FeatureBytes& sections) {
    Out o;
    o.swap = swap;
    uint64_t payload = table_offset + sections.size() * 16;
    for (const auto& s : sections) {
        o.put<uint64_t>(payload);
        o.put<uint64_t>(s.second.size());
        payload += s.second.size();
    }
    for (const auto& s : sections) o.bytes(s.second.data(), s.second.size());
    return std::move(o.b);
}

}  // namespace gilscan::test
