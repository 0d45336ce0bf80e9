// Tracepoint format files (events/<system>/<name>/format) and field access.
//
//   TpFormat f = parse_tracepoint_format("sched", text);      // from tracing data
//   const TpField* st = f.field("prev_state");                // never hard-code offsets
//   int64_t state = read_int(raw, *st, swap);
//   std::string_view comm = read_str(raw, *f.field("prev_comm"), swap);
//
// Layouts differ between kernels (sched_waking lost `success` in 5.14; comm
// fields became __data_loc on some events): always go through these.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

struct TpField {
    std::string name;
    std::string type;  // "long", "char[16]", "__data_loc char[]", ...
    uint32_t offset = 0;
    uint32_t size = 0;
    bool is_signed = false;
    bool data_loc = false;  // u32: offset (low 16) and length (high 16) of the payload
    bool rel_loc = false;   // like data_loc, offset relative to the end of the field
    bool is_array = false;
};

struct TpFormat {
    std::string system;
    std::string name;
    uint32_t id = 0;
    std::vector<TpField> fields;
    std::string print_fmt;

    const TpField* field(std::string_view n) const {
        for (const auto& f : fields)
            if (f.name == n) return &f;
        return nullptr;
    }
    std::string full_name() const { return system + ":" + name; }
};

// Throws std::invalid_argument with a reason when the text is not a format file.
TpFormat parse_tracepoint_format(std::string_view system, std::string_view text);

// Readers return 0 / "" when the field lies outside `raw` (a short record is
// per-sample trouble, not a fatal error); `ok` reports it when given.
// Always inlined: the decoder reads five of these per sched_switch (with
// link-time optimization GCC made each a call).
[[gnu::always_inline]] inline uint64_t read_uint(Bytes raw, const TpField& f, bool swap, bool* ok = nullptr) {
    if (f.offset > raw.size() || f.size > raw.size() - f.offset) [[unlikely]] {
        if (ok) *ok = false;
        return 0;
    }
    const uint8_t* p = raw.data() + f.offset;
    switch (f.size) {
    case 1: return *p;
    case 2: return load<uint16_t>(p, swap);
    case 4: return load<uint32_t>(p, swap);
    case 8: return load<uint64_t>(p, swap);
    default:
        if (ok) *ok = false;
        return 0;
    }
}

[[gnu::always_inline]] inline int64_t read_int(Bytes raw, const TpField& f, bool swap, bool* ok = nullptr) {
    const uint64_t v = read_uint(raw, f, swap, ok);
    if (!f.is_signed) return static_cast<int64_t>(v);
    switch (f.size) {
    case 1: return static_cast<int8_t>(v);
    case 2: return static_cast<int16_t>(v);
    case 4: return static_cast<int32_t>(v);
    default: return static_cast<int64_t>(v);
    }
}

// Length of the NUL-terminated string in the n bytes at p (n when none).
// comm fields are char[16] (TASK_COMM_LEN), two per sched_switch: two words
// and cursor.h's zero_bytes(), whose lowest set bit marks the first zero
// byte, instead of a call to strnlen.
[[gnu::always_inline]] inline size_t field_strnlen(const uint8_t* p, size_t n) {
    if constexpr (std::endian::native == std::endian::little) {
        if (n == 16) {
            if (const uint64_t m = zero_bytes(load<uint64_t>(p, false))) return static_cast<size_t>(__builtin_ctzll(m)) / 8;
            if (const uint64_t m = zero_bytes(load<uint64_t>(p + 8, false)))
                return 8 + static_cast<size_t>(__builtin_ctzll(m)) / 8;
            return 16;
        }
    }
    return strnlen(reinterpret_cast<const char*>(p), n);
}

// A __data_loc / __rel_loc string (out of line: tracepoint_format.cc).
std::string_view read_loc_str(Bytes raw, const TpField& f, bool swap, bool* ok);

// A string field up to its first NUL. Inline: two comm fields per sched_switch.
[[gnu::always_inline]] inline std::string_view read_str(Bytes raw, const TpField& f, bool swap, bool* ok = nullptr) {
    if (f.data_loc || f.rel_loc) [[unlikely]]
        return read_loc_str(raw, f, swap, ok);
    if (f.offset > raw.size() || f.size > raw.size() - f.offset) [[unlikely]] {
        if (ok) *ok = false;
        return {};
    }
    const uint8_t* p = raw.data() + f.offset;
    return std::string_view(reinterpret_cast<const char*>(p), field_strnlen(p, f.size));
}

}  // namespace gilscan
