#include "gilscan/perfdata/kernel_records.h"

#include <cstring>

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

namespace {

// The body minus its sample_id_all trailer.
Bytes without_trailer(Bytes body, const PerfEventAttr& attr, bool swap, SampleId& sid) {
    if (parse_sample_id_trailer(body, attr, swap, sid))
        return body.first(body.size() - sample_id_trailer_size(attr.sample_type));
    return body;
}

std::string_view string_in(Cursor& c) {
    Bytes rest = c.rest();
    const char* s = reinterpret_cast<const char*>(rest.data());
    return std::string_view(s, strnlen(s, rest.size()));
}

}  // namespace

void decode_comm(Bytes body, uint16_t misc, const PerfEventAttr& attr, bool swap, CommEvent& e) {
    Cursor c(without_trailer(body, attr, swap, e.sid), swap, nullptr, 0);
    e.pid = c.read<int32_t>();
    e.tid = c.read<int32_t>();
    e.comm = string_in(c);
    e.exec = (misc & PERF_RECORD_MISC_COMM_EXEC) != 0;
}

void decode_task(Bytes body, const PerfEventAttr& attr, bool swap, TaskEvent& e) {
    Cursor c(without_trailer(body, attr, swap, e.sid), swap, nullptr, 0);
    e.pid = c.read<int32_t>();
    e.ppid = c.read<int32_t>();
    e.tid = c.read<int32_t>();
    e.ptid = c.read<int32_t>();
    e.time = c.read<uint64_t>();
    if (!e.sid.has_time) {
        e.sid.time = e.time;
        e.sid.has_time = true;
    }
}

void decode_mmap(Bytes body, uint32_t type, uint16_t misc, const PerfEventAttr& attr, bool swap, MmapEvent& e) {
    Cursor c(without_trailer(body, attr, swap, e.sid), swap, nullptr, 0);
    e.pid = c.read<int32_t>();
    e.tid = c.read<int32_t>();
    e.start = c.read<uint64_t>();
    e.len = c.read<uint64_t>();
    e.pgoff = c.read<uint64_t>();
    if (type == PERF_RECORD_MMAP2) {
        e.mmap2 = true;
        if (misc & PERF_RECORD_MISC_MMAP_BUILD_ID) {
            e.build_id_size = c.read<uint8_t>();
            c.skip(3);
            Bytes id = c.bytes(20);
            if (e.build_id_size > 20) e.build_id_size = 20;
            std::memcpy(e.build_id, id.data(), 20);
        } else {
            e.maj = c.read<uint32_t>();
            e.min = c.read<uint32_t>();
            e.ino = c.read<uint64_t>();
            e.ino_generation = c.read<uint64_t>();
        }
        e.prot = c.read<uint32_t>();
        e.flags = c.read<uint32_t>();
        e.executable = (e.prot & 0x4) != 0;  // PROT_EXEC
    } else {
        constexpr uint16_t PERF_RECORD_MISC_MMAP_DATA = 1u << 13;
        e.executable = (misc & PERF_RECORD_MISC_MMAP_DATA) == 0;
    }
    e.filename = string_in(c);
}

void decode_lost(Bytes body, uint32_t type, const PerfEventAttr& attr, bool swap, LostEvent& e) {
    Cursor c(without_trailer(body, attr, swap, e.sid), swap, nullptr, 0);
    if (type == PERF_RECORD_LOST) {
        e.id = c.read<uint64_t>();
        e.lost = c.read<uint64_t>();
    } else {
        e.samples = true;
        e.lost = c.read<uint64_t>();
    }
}

void decode_switch(Bytes body, uint32_t type, uint16_t misc, const PerfEventAttr& attr, bool swap, SwitchEvent& e) {
    e.out = (misc & PERF_RECORD_MISC_SWITCH_OUT) != 0;
    e.preempt = e.out && (misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT) != 0;
    e.cpu_wide = type == PERF_RECORD_SWITCH_CPU_WIDE;
    Cursor c(without_trailer(body, attr, swap, e.sid), swap, nullptr, 0);
    if (e.cpu_wide) {
        e.next_prev_pid = c.read<int32_t>();
        e.next_prev_tid = c.read<int32_t>();
    }
}

}  // namespace gilscan
