// Typed views of the non-sample kernel records gilscan uses.
//
//   CommEvent e;
//   decode_comm(rec.body, attr, swap, e);  // pid, tid, comm, exec flag, trailer
//   decode_switch(rec.body, rec.type, rec.misc, attr, swap, s);  // in or out, and whose (the trailer)
//
// Each decoder reads the fixed part from the front and the sample_id_all
// trailer from the back; strings in between are NUL-terminated and padded to
// 8 bytes. Decoders throw gilscan::Error when the body is too short.
#pragma once

#include <cstdint>
#include <string_view>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/sample.h"

namespace gilscan {

struct CommEvent {
    SampleId sid;
    int32_t pid = 0, tid = 0;
    std::string_view comm;
    bool exec = false;  // PERF_RECORD_MISC_COMM_EXEC: the process image was replaced
};

struct TaskEvent {  // PERF_RECORD_FORK / PERF_RECORD_EXIT
    SampleId sid;
    int32_t pid = 0, ppid = 0, tid = 0, ptid = 0;
    uint64_t time = 0;
};

struct MmapEvent {  // PERF_RECORD_MMAP and MMAP2
    SampleId sid;
    int32_t pid = 0, tid = 0;
    uint64_t start = 0, len = 0, pgoff = 0;
    bool mmap2 = false;
    uint32_t maj = 0, min = 0;
    uint64_t ino = 0, ino_generation = 0;
    uint8_t build_id_size = 0;  // MMAP2 with PERF_RECORD_MISC_MMAP_BUILD_ID
    uint8_t build_id[20] = {};
    uint32_t prot = 0, flags = 0;
    bool executable = true;  // MMAP records carry no prot; misc tells data maps apart
    std::string_view filename;
};

struct LostEvent {  // PERF_RECORD_LOST and PERF_RECORD_LOST_SAMPLES
    SampleId sid;
    uint64_t id = 0;
    uint64_t lost = 0;
    bool samples = false;  // LOST_SAMPLES: dropped by the kernel, not the ring buffer
};

// PERF_RECORD_SWITCH and PERF_RECORD_SWITCH_CPU_WIDE (perf record
// --switch-events, attr.context_switch): written in the switching task's own
// context, so sid (pid, tid, time, cpu; from the sample_id_all trailer) is the
// task switched in or out, also when another process's task switched it in.
struct SwitchEvent {
    SampleId sid;
    bool out = false;      // PERF_RECORD_MISC_SWITCH_OUT
    bool preempt = false;  // PERF_RECORD_MISC_SWITCH_OUT_PREEMPT
    bool cpu_wide = false;
    int32_t next_prev_pid = -1, next_prev_tid = -1;  // CPU_WIDE: the task switched out or in for it
};

void decode_comm(Bytes body, uint16_t misc, const PerfEventAttr& attr, bool swap, CommEvent& e);
void decode_task(Bytes body, const PerfEventAttr& attr, bool swap, TaskEvent& e);
void decode_mmap(Bytes body, uint32_t type, uint16_t misc, const PerfEventAttr& attr, bool swap, MmapEvent& e);
void decode_lost(Bytes body, uint32_t type, const PerfEventAttr& attr, bool swap, LostEvent& e);
void decode_switch(Bytes body, uint32_t type, uint16_t misc, const PerfEventAttr& attr, bool swap, SwitchEvent& e);

}  // namespace gilscan
