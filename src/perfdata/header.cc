#include "gilscan/perfdata/header.h"

namespace gilscan {

namespace {

FileSection read_section(Cursor& c) {
    FileSection s;
    s.offset = c.read<uint64_t>();
    s.size = c.read<uint64_t>();
    return s;
}

uint64_t reverse_bits(uint64_t v) {
    uint64_t r = 0;
    for (int i = 0; i < 64; ++i) {
        r = (r << 1) | (v & 1);
        v >>= 1;
    }
    return r;
}

void check_inside(const FileSection& s, uint64_t file_size, const std::string& path, const char* what,
                  uint64_t where) {
    if (s.offset > file_size || s.size > file_size - s.offset)
        throw Error(path, where,
                    std::string(what) + " section [" + std::to_string(s.offset) + ", +" +
                        std::to_string(s.size) + ") lies outside the " + std::to_string(file_size) +
                        "-byte file");
}

}  // namespace

FileHeader read_file_header(Bytes file, const std::string& path) {
    FileHeader h;
    if (file.size() < 8) throw Error(path, 0, "too short to be a perf.data file");
    uint64_t magic = load<uint64_t>(file.data(), false);
    if (magic == PERF_MAGIC2) {
        h.swap = false;
    } else if (magic == PERF_MAGIC2_SWAPPED) {
        h.swap = true;
    } else if (std::string_view(reinterpret_cast<const char*>(file.data()), 8) == "PERFFILE") {
        throw Error(path, 0, "perf.data version 1 (PERFFILE) is not supported; re-record with a newer perf");
    } else {
        throw Error(path, 0, "not a perf.data file (no PERFILE2 magic)");
    }
    Cursor c(file, h.swap, &path, 0);
    c.skip(8);
    h.header_size = c.read<uint64_t>();
    if (h.header_size == PERF_PIPE_HEADER_SIZE) {
        h.pipe = true;
        return h;
    }
    if (h.header_size != PERF_FILE_HEADER_SIZE)
        throw Error(path, 8, "unexpected header size " + std::to_string(h.header_size) +
                                 " (expected 104, or 16 for pipe mode)");
    if (file.size() < PERF_FILE_HEADER_SIZE) throw Error(path, file.size(), "file ends inside the header");
    h.attr_size = c.read<uint64_t>();
    h.attrs = read_section(c);
    h.data = read_section(c);
    h.event_types = read_section(c);
    for (unsigned w = 0; w < HEADER_FEAT_BITS / 64; ++w) {
        uint64_t bits = c.read<uint64_t>();
        // The bitmap is an array of unsigned long: in a swapped file each word
        // is swapped, bit numbering inside a word stays the same.
        for (unsigned b = 0; b < 64; ++b)
            if ((bits >> b) & 1) h.features.set(w * 64 + b);
    }
    check_inside(h.attrs, file.size(), path, "attrs", 24);
    if (h.data.offset > file.size())
        throw Error(path, 40, "data section offset " + std::to_string(h.data.offset) + " is past the end of the file");
    h.declared_data_end = h.data.offset + h.data.size;
    if (h.data.size == 0) {
        // perf was killed before it rewrote the header: perf reads to EOF.
        h.data_size_was_zero = true;
        h.data.size = file.size() - h.data.offset;
    } else if (h.data.size > file.size() - h.data.offset) {
        // Truncated copy: decode what is there and warn.
        h.truncated = true;
        h.data.size = file.size() - h.data.offset;
    }
    return h;
}

PerfEventAttr read_perf_event_attr(Cursor& c) {
    const uint64_t start = c.offset();
    const size_t start_pos = c.pos();
    PerfEventAttr a;
    a.type = c.read<uint32_t>();
    a.size = c.read<uint32_t>();
    uint32_t size = a.size == 0 ? PERF_ATTR_SIZE_VER0 : a.size;
    if (size < PERF_ATTR_SIZE_VER0)
        throw Error(c.file() ? *c.file() : "", start, "perf_event_attr size " + std::to_string(size) + " < 64");
    if (size - 8 > c.left())
        throw Error(c.file() ? *c.file() : "", start,
                    "perf_event_attr size " + std::to_string(size) + " runs past its container");
    a.size = size;
    a.config = c.read<uint64_t>();
    a.sample_period = c.read<uint64_t>();
    a.sample_type = c.read<uint64_t>();
    a.read_format = c.read<uint64_t>();
    uint64_t flags = c.read<uint64_t>();
    a.flags = c.swap() ? reverse_bits(flags) : flags;  // bitfields run from the MSB on big-endian
    a.wakeup_events = c.read<uint32_t>();
    a.bp_type = c.read<uint32_t>();
    a.config1 = c.read<uint64_t>();
    auto have = [&](uint32_t end) { return size >= end; };
    if (have(72)) a.config2 = c.read<uint64_t>();
    if (have(80)) a.branch_sample_type = c.read<uint64_t>();
    if (have(96)) {
        a.sample_regs_user = c.read<uint64_t>();
        a.sample_stack_user = c.read<uint32_t>();
        a.clockid = c.read<int32_t>();
    }
    if (have(104)) a.sample_regs_intr = c.read<uint64_t>();
    if (have(112)) {
        a.aux_watermark = c.read<uint32_t>();
        a.sample_max_stack = c.read<uint16_t>();
        c.skip(2);
    }
    // Newer fields (aux_sample_size, sig_data, config3, ...) are not needed.
    c.seek(start_pos + size);
    return a;
}

std::vector<EventAttr> read_attrs(Bytes file, const FileHeader& h, const std::string& path) {
    std::vector<EventAttr> attrs;
    if (h.attr_size == 0) {
        if (h.attrs.size != 0) throw Error(path, 16, "attr_size is 0 but the attrs section is not empty");
        return attrs;
    }
    if (h.attr_size < PERF_ATTR_SIZE_VER0 + 16)
        throw Error(path, 16, "attr_size " + std::to_string(h.attr_size) + " is too small");
    if (h.attrs.size % h.attr_size != 0)
        throw Error(path, 16, "attrs section size " + std::to_string(h.attrs.size) + " is not a multiple of attr_size " +
                                  std::to_string(h.attr_size));
    uint64_t n = h.attrs.size / h.attr_size;
    if (n == 0) throw Error(path, 32, "the attrs section holds no event");
    Cursor c(file.subspan(h.attrs.offset, h.attrs.size), h.swap, &path, h.attrs.offset);
    for (uint64_t i = 0; i < n; ++i) {
        EventAttr ea;
        // perf reads each attr by its own size, then the ids section after it.
        ea.attr = read_perf_event_attr(c);
        FileSection ids = read_section(c);
        check_inside(ids, file.size(), path, "attr ids", c.offset() - 16);
        Cursor ic(file.subspan(ids.offset, ids.size), h.swap, &path, ids.offset);
        ea.ids.reserve(ids.size / 8);
        for (uint64_t k = 0; k < ids.size / 8; ++k) ea.ids.push_back(ic.read<uint64_t>());
        attrs.push_back(std::move(ea));
    }
    return attrs;
}

std::vector<FeatureSection> read_feature_table(Bytes file, const FileHeader& h, const std::string& path) {
    std::vector<FeatureSection> out;
    if (h.pipe || h.data_size_was_zero || h.truncated) return out;  // killed perf leaves no table
    uint64_t table = h.data.offset + h.data.size;
    uint64_t n = h.features.count();
    if (table > file.size() || n * 16 > file.size() - table) {
        // A truncated copy loses its features; the records still decode.
        return out;
    }
    Cursor c(file.subspan(table, n * 16), h.swap, &path, table);
    for (unsigned bit = 0; bit < HEADER_FEAT_BITS; ++bit) {
        if (!h.features.test(bit)) continue;
        FeatureSection fs;
        fs.feature = bit;
        fs.section = read_section(c);
        if (fs.section.offset > file.size() || fs.section.size > file.size() - fs.section.offset)
            throw Error(path, c.offset() - 16,
                        "feature " + std::to_string(bit) + " section lies outside the file");
        out.push_back(fs);
    }
    return out;
}

}  // namespace gilscan
