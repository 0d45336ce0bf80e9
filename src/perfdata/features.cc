#include "gilscan/perfdata/features.h"

namespace gilscan {

std::string read_feature_string(Cursor& c) {
    uint32_t len = c.read<uint32_t>();
    return std::string(c.fixed_string(len));
}

namespace {

void parse_event_desc(Features& f, Cursor& c) {
    uint32_t nr = c.read<uint32_t>();
    uint32_t attr_size = c.read<uint32_t>();
    if (attr_size < PERF_ATTR_SIZE_VER0) c.fail("EVENT_DESC attr size " + std::to_string(attr_size) + " < 64");
    c.check_count(nr, attr_size, "EVENT_DESC event");
    for (uint32_t i = 0; i < nr; ++i) {
        EventDesc d;
        // The attr occupies attr_size bytes here whatever its own size says.
        Cursor ac(c.bytes(attr_size), c.swap(), c.file(), c.offset() - attr_size);
        d.attr = read_perf_event_attr(ac);
        uint32_t nr_ids = c.read<uint32_t>();
        d.name = read_feature_string(c);
        c.check_count(nr_ids, 8, "EVENT_DESC ids");
        d.ids.reserve(nr_ids);
        for (uint32_t k = 0; k < nr_ids; ++k) d.ids.push_back(c.read<uint64_t>());
        f.event_desc.push_back(std::move(d));
    }
}

void parse_build_ids(Features& f, Cursor& c) {
    constexpr uint16_t PERF_RECORD_MISC_BUILD_ID_SIZE = 1u << 15;
    while (c.left() >= 8) {
        size_t start = c.pos();
        c.read<uint32_t>();  // type
        uint16_t misc = c.read<uint16_t>();
        uint16_t size = c.read<uint16_t>();
        if (size < 8 + 4 + 24 || size - 8u > c.left()) c.fail("bad BUILD_ID entry size " + std::to_string(size));
        BuildIdEntry e;
        e.pid = c.read<int32_t>();
        Bytes id = c.bytes(24);
        size_t id_size = (misc & PERF_RECORD_MISC_BUILD_ID_SIZE) ? std::min<size_t>(id[20], 20) : 20;
        e.build_id.assign(id.begin(), id.begin() + static_cast<long>(id_size));
        e.filename = std::string(c.fixed_string(start + size - c.pos()));
        f.build_ids.push_back(std::move(e));
        c.seek(start + size);
    }
}

}  // namespace

void parse_feature(Features& f, unsigned feature, Cursor c) {
    switch (feature) {
    case HEADER_TRACING_DATA:
        f.tracing_data = c.rest();
        f.tracing_data_offset = c.offset();
        break;
    case HEADER_BUILD_ID: parse_build_ids(f, c); break;
    case HEADER_HOSTNAME: f.hostname = read_feature_string(c); break;
    case HEADER_OSRELEASE: f.os_release = read_feature_string(c); break;
    case HEADER_VERSION: f.perf_version = read_feature_string(c); break;
    case HEADER_ARCH: f.arch = read_feature_string(c); break;
    case HEADER_CPUDESC: f.cpu_desc = read_feature_string(c); break;
    case HEADER_NRCPUS:
        f.nr_cpus_avail = c.read<uint32_t>();
        f.nr_cpus_online = c.read<uint32_t>();
        break;
    case HEADER_CMDLINE: {
        uint32_t nr = c.read<uint32_t>();
        c.check_count(nr, 4, "CMDLINE string");
        f.cmdline.clear();
        for (uint32_t i = 0; i < nr; ++i) f.cmdline.push_back(read_feature_string(c));
        break;
    }
    case HEADER_EVENT_DESC: f.event_desc.clear(); parse_event_desc(f, c); break;
    case HEADER_SAMPLE_TIME: {
        uint64_t first = c.read<uint64_t>();
        uint64_t last = c.read<uint64_t>();
        f.sample_time = {first, last};
        break;
    }
    case HEADER_CLOCKID: f.clockid_res_ns = c.read<uint64_t>(); break;
    case HEADER_CLOCK_DATA: {
        uint32_t version = c.read<uint32_t>();
        if (version != 1) break;  // unknown layout: ignore rather than misread
        ClockData d;
        d.clockid = c.read<uint32_t>();
        d.tod_ns = c.read<uint64_t>();
        d.clockid_ns = c.read<uint64_t>();
        f.clock_data = d;
        break;
    }
    case HEADER_COMPRESSED: {
        CompressionInfo ci;
        ci.version = c.read<uint32_t>();
        ci.type = c.read<uint32_t>();
        ci.level = c.read<uint32_t>();
        ci.ratio = c.read<uint32_t>();
        ci.mmap_len = c.read<uint32_t>();
        f.compression = ci;
        break;
    }
    default: break;
    }
}

std::string clock_name(int32_t clockid) {
    switch (clockid) {
    case 0: return "CLOCK_REALTIME";
    case 1: return "CLOCK_MONOTONIC";
    case 4: return "CLOCK_MONOTONIC_RAW";
    case 7: return "CLOCK_BOOTTIME";
    case 11: return "CLOCK_TAI";
    default: return "clockid " + std::to_string(clockid);
    }
}

}  // namespace gilscan
