// Constants of the perf ABI, spelled as in linux/perf_event.h and
// tools/perf/util/{event.h,header.h} so code greps against the kernel.
//
//   if (attr.sample_type & PERF_SAMPLE_CALLCHAIN) ...
//   switch (hdr.type) { case PERF_RECORD_SAMPLE: ... }
//
// Only values: gilscan never overlays these structs on file bytes.
#pragma once

#include <cstdint>

namespace gilscan {

// perf_event_attr.type
inline constexpr uint32_t PERF_TYPE_HARDWARE = 0;
inline constexpr uint32_t PERF_TYPE_SOFTWARE = 1;
inline constexpr uint32_t PERF_TYPE_TRACEPOINT = 2;
inline constexpr uint32_t PERF_TYPE_HW_CACHE = 3;
inline constexpr uint32_t PERF_TYPE_RAW = 4;
inline constexpr uint64_t PERF_COUNT_SW_CPU_CLOCK = 0;
inline constexpr uint64_t PERF_COUNT_SW_TASK_CLOCK = 1;

// perf_event_attr.sample_type
inline constexpr uint64_t PERF_SAMPLE_IP = 1ull << 0;
inline constexpr uint64_t PERF_SAMPLE_TID = 1ull << 1;
inline constexpr uint64_t PERF_SAMPLE_TIME = 1ull << 2;
inline constexpr uint64_t PERF_SAMPLE_ADDR = 1ull << 3;
inline constexpr uint64_t PERF_SAMPLE_READ = 1ull << 4;
inline constexpr uint64_t PERF_SAMPLE_CALLCHAIN = 1ull << 5;
inline constexpr uint64_t PERF_SAMPLE_ID = 1ull << 6;
inline constexpr uint64_t PERF_SAMPLE_CPU = 1ull << 7;
inline constexpr uint64_t PERF_SAMPLE_PERIOD = 1ull << 8;
inline constexpr uint64_t PERF_SAMPLE_STREAM_ID = 1ull << 9;
inline constexpr uint64_t PERF_SAMPLE_RAW = 1ull << 10;
inline constexpr uint64_t PERF_SAMPLE_BRANCH_STACK = 1ull << 11;
inline constexpr uint64_t PERF_SAMPLE_REGS_USER = 1ull << 12;
inline constexpr uint64_t PERF_SAMPLE_STACK_USER = 1ull << 13;
inline constexpr uint64_t PERF_SAMPLE_WEIGHT = 1ull << 14;
inline constexpr uint64_t PERF_SAMPLE_DATA_SRC = 1ull << 15;
inline constexpr uint64_t PERF_SAMPLE_IDENTIFIER = 1ull << 16;
inline constexpr uint64_t PERF_SAMPLE_TRANSACTION = 1ull << 17;
inline constexpr uint64_t PERF_SAMPLE_REGS_INTR = 1ull << 18;
inline constexpr uint64_t PERF_SAMPLE_PHYS_ADDR = 1ull << 19;
inline constexpr uint64_t PERF_SAMPLE_AUX = 1ull << 20;
inline constexpr uint64_t PERF_SAMPLE_CGROUP = 1ull << 21;
inline constexpr uint64_t PERF_SAMPLE_DATA_PAGE_SIZE = 1ull << 22;
inline constexpr uint64_t PERF_SAMPLE_CODE_PAGE_SIZE = 1ull << 23;
inline constexpr uint64_t PERF_SAMPLE_WEIGHT_STRUCT = 1ull << 24;

// perf_event_attr.read_format
inline constexpr uint64_t PERF_FORMAT_TOTAL_TIME_ENABLED = 1ull << 0;
inline constexpr uint64_t PERF_FORMAT_TOTAL_TIME_RUNNING = 1ull << 1;
inline constexpr uint64_t PERF_FORMAT_ID = 1ull << 2;
inline constexpr uint64_t PERF_FORMAT_GROUP = 1ull << 3;
inline constexpr uint64_t PERF_FORMAT_LOST = 1ull << 4;

// perf_event_attr.branch_sample_type
inline constexpr uint64_t PERF_SAMPLE_BRANCH_HW_INDEX = 1ull << 17;

// Bits of the flags word at offset 40 of perf_event_attr (bitfield order on a
// little-endian host: `disabled` is bit 0).
inline constexpr unsigned ATTR_BIT_sample_id_all = 18;
inline constexpr unsigned ATTR_BIT_use_clockid = 25;

// perf_event_header.type: kernel records
inline constexpr uint32_t PERF_RECORD_MMAP = 1;
inline constexpr uint32_t PERF_RECORD_LOST = 2;
inline constexpr uint32_t PERF_RECORD_COMM = 3;
inline constexpr uint32_t PERF_RECORD_EXIT = 4;
inline constexpr uint32_t PERF_RECORD_THROTTLE = 5;
inline constexpr uint32_t PERF_RECORD_UNTHROTTLE = 6;
inline constexpr uint32_t PERF_RECORD_FORK = 7;
inline constexpr uint32_t PERF_RECORD_READ = 8;
inline constexpr uint32_t PERF_RECORD_SAMPLE = 9;
inline constexpr uint32_t PERF_RECORD_MMAP2 = 10;
inline constexpr uint32_t PERF_RECORD_AUX = 11;
inline constexpr uint32_t PERF_RECORD_ITRACE_START = 12;
inline constexpr uint32_t PERF_RECORD_LOST_SAMPLES = 13;
inline constexpr uint32_t PERF_RECORD_SWITCH = 14;
inline constexpr uint32_t PERF_RECORD_SWITCH_CPU_WIDE = 15;
inline constexpr uint32_t PERF_RECORD_NAMESPACES = 16;
inline constexpr uint32_t PERF_RECORD_KSYMBOL = 17;
inline constexpr uint32_t PERF_RECORD_BPF_EVENT = 18;
inline constexpr uint32_t PERF_RECORD_CGROUP = 19;
inline constexpr uint32_t PERF_RECORD_TEXT_POKE = 20;
inline constexpr uint32_t PERF_RECORD_AUX_OUTPUT_HW_ID = 21;
inline constexpr uint32_t PERF_RECORD_KERNEL_MAX = 64;

// perf_event_header.type: records perf itself writes (tools/lib/perf/include/perf/event.h)
inline constexpr uint32_t PERF_RECORD_HEADER_ATTR = 64;
inline constexpr uint32_t PERF_RECORD_HEADER_EVENT_TYPE = 65;
inline constexpr uint32_t PERF_RECORD_HEADER_TRACING_DATA = 66;
inline constexpr uint32_t PERF_RECORD_HEADER_BUILD_ID = 67;
inline constexpr uint32_t PERF_RECORD_FINISHED_ROUND = 68;
inline constexpr uint32_t PERF_RECORD_ID_INDEX = 69;
inline constexpr uint32_t PERF_RECORD_AUXTRACE_INFO = 70;
inline constexpr uint32_t PERF_RECORD_AUXTRACE = 71;
inline constexpr uint32_t PERF_RECORD_AUXTRACE_ERROR = 72;
inline constexpr uint32_t PERF_RECORD_THREAD_MAP = 73;
inline constexpr uint32_t PERF_RECORD_CPU_MAP = 74;
inline constexpr uint32_t PERF_RECORD_STAT_CONFIG = 75;
inline constexpr uint32_t PERF_RECORD_STAT = 76;
inline constexpr uint32_t PERF_RECORD_STAT_ROUND = 77;
inline constexpr uint32_t PERF_RECORD_EVENT_UPDATE = 78;
inline constexpr uint32_t PERF_RECORD_TIME_CONV = 79;
inline constexpr uint32_t PERF_RECORD_HEADER_FEATURE = 80;
inline constexpr uint32_t PERF_RECORD_COMPRESSED = 81;
inline constexpr uint32_t PERF_RECORD_FINISHED_INIT = 82;
inline constexpr uint32_t PERF_RECORD_COMPRESSED2 = 83;

// perf_event_header.misc
inline constexpr uint16_t PERF_RECORD_MISC_CPUMODE_MASK = 7;
inline constexpr uint16_t PERF_RECORD_MISC_COMM_EXEC = 1u << 13;
inline constexpr uint16_t PERF_RECORD_MISC_MMAP_BUILD_ID = 1u << 14;
// PERF_RECORD_SWITCH*: set on a switch-out (clear: a switch-in), and on a
// switch-out the task was preempted in (it stays runnable).
inline constexpr uint16_t PERF_RECORD_MISC_SWITCH_OUT = 1u << 13;
inline constexpr uint16_t PERF_RECORD_MISC_SWITCH_OUT_PREEMPT = 1u << 14;

// Callchain context markers (enum perf_callchain_context)
inline constexpr uint64_t PERF_CONTEXT_HV = static_cast<uint64_t>(-32);
inline constexpr uint64_t PERF_CONTEXT_KERNEL = static_cast<uint64_t>(-128);
inline constexpr uint64_t PERF_CONTEXT_USER = static_cast<uint64_t>(-512);
inline constexpr uint64_t PERF_CONTEXT_GUEST = static_cast<uint64_t>(-2048);
inline constexpr uint64_t PERF_CONTEXT_GUEST_KERNEL = static_cast<uint64_t>(-2176);
inline constexpr uint64_t PERF_CONTEXT_GUEST_USER = static_cast<uint64_t>(-2560);
inline constexpr uint64_t PERF_CONTEXT_MAX = static_cast<uint64_t>(-4095);

// Header feature bits (tools/perf/util/header.h, enum HEADER_*)
inline constexpr unsigned HEADER_TRACING_DATA = 1;
inline constexpr unsigned HEADER_BUILD_ID = 2;
inline constexpr unsigned HEADER_HOSTNAME = 3;
inline constexpr unsigned HEADER_OSRELEASE = 4;
inline constexpr unsigned HEADER_VERSION = 5;
inline constexpr unsigned HEADER_ARCH = 6;
inline constexpr unsigned HEADER_NRCPUS = 7;
inline constexpr unsigned HEADER_CPUDESC = 8;
inline constexpr unsigned HEADER_CPUID = 9;
inline constexpr unsigned HEADER_TOTAL_MEM = 10;
inline constexpr unsigned HEADER_CMDLINE = 11;
inline constexpr unsigned HEADER_EVENT_DESC = 12;
inline constexpr unsigned HEADER_CPU_TOPOLOGY = 13;
inline constexpr unsigned HEADER_NUMA_TOPOLOGY = 14;
inline constexpr unsigned HEADER_BRANCH_STACK = 15;
inline constexpr unsigned HEADER_PMU_MAPPINGS = 16;
inline constexpr unsigned HEADER_GROUP_DESC = 17;
inline constexpr unsigned HEADER_AUXTRACE = 18;
inline constexpr unsigned HEADER_STAT = 19;
inline constexpr unsigned HEADER_CACHE = 20;
inline constexpr unsigned HEADER_SAMPLE_TIME = 21;
inline constexpr unsigned HEADER_MEM_TOPOLOGY = 22;
inline constexpr unsigned HEADER_CLOCKID = 23;
inline constexpr unsigned HEADER_DIR_FORMAT = 24;
inline constexpr unsigned HEADER_BPF_PROG_INFO = 25;
inline constexpr unsigned HEADER_BPF_BTF = 26;
inline constexpr unsigned HEADER_COMPRESSED = 27;
inline constexpr unsigned HEADER_CPU_PMU_CAPS = 28;
inline constexpr unsigned HEADER_CLOCK_DATA = 29;
inline constexpr unsigned HEADER_HYBRID_TOPOLOGY = 30;
inline constexpr unsigned HEADER_PMU_CAPS = 31;
inline constexpr unsigned HEADER_LAST_FEATURE = 32;
inline constexpr unsigned HEADER_FEAT_BITS = 256;

// "PERFILE2" read as a little-endian u64, and the same bytes byte-swapped.
inline constexpr uint64_t PERF_MAGIC2 = 0x32454c4946524550ull;
inline constexpr uint64_t PERF_MAGIC2_SWAPPED = 0x50455246494c4532ull;

inline constexpr uint64_t PERF_FILE_HEADER_SIZE = 104;
inline constexpr uint64_t PERF_PIPE_HEADER_SIZE = 16;
inline constexpr uint64_t PERF_EVENT_HEADER_SIZE = 8;

// perf_event_attr sizes by version (PERF_ATTR_SIZE_VER0 .. VER8)
inline constexpr uint32_t PERF_ATTR_SIZE_VER0 = 64;

}  // namespace gilscan
