// Cursor — the one checked byte reader over perf.data bytes.
//
//   Cursor c(bytes, swap, "perf.data", file_offset_of(bytes));
//   uint32_t type = c.read<uint32_t>();     // memcpy + bounds check + byte swap
//   auto name = c.bytes(16);                // zero-copy span, bounds checked
//   c.check_count(nr, sizeof(uint64_t));    // before looping over nr u64s
//
// Fields are never reinterpret_cast out of the file: perf.data is only 8-byte
// aligned by convention and pipe-mode data after HEADER_TRACING_DATA is only
// 4-byte aligned. The byte order is decided once, from the magic, and passed
// in as `swap`. Every failure throws gilscan::Error naming the file and the
// absolute byte offset.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "gilscan/error.h"

namespace gilscan {

using Bytes = std::span<const uint8_t>;

template <class T>
constexpr T byteswap_int(T v) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    if constexpr (sizeof(T) == 1) {
        return v;
    } else if constexpr (sizeof(T) == 2) {
        return static_cast<T>(__builtin_bswap16(static_cast<U>(v)));
    } else if constexpr (sizeof(T) == 4) {
        return static_cast<T>(__builtin_bswap32(static_cast<U>(v)));
    } else if constexpr (sizeof(T) == 8) {
        return static_cast<T>(__builtin_bswap64(static_cast<U>(v)));
    } else {
        U u = static_cast<U>(v);
        U r = 0;
        for (size_t i = 0; i < sizeof(T); ++i) {
            r = static_cast<U>((r << 8) | (u & 0xff));
            u = static_cast<U>(u >> 8);
        }
        return static_cast<T>(r);
    }
}

// Load an integer of type T from p (no alignment assumed), swapping if asked.
template <class T>
inline T load(const uint8_t* p, bool swap) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return swap ? byteswap_int(v) : v;
}

// Calls f with the byte order as a compile-time constant (std::true_type:
// swap), so that each load<T>(p, swap) inside compiles to a plain load or
// to a byte swap: with the run-time flag GCC byte-swapped every field and
// then chose (a dozen instructions a record on the paths that read every
// record: the record's header, id and time, a sample's fields, the
// scheduler's tracepoint fields).
//
//   int ev = with_byte_order(swap, [&](auto sw) { return ids.event_for(r, sw); });
template <class F>
[[gnu::always_inline]] inline decltype(auto) with_byte_order(bool swap, F&& f) {
    if (swap) return f(std::true_type{});
    return f(std::false_type{});
}

// Byte-parallel tests on a word (the bit hacks collection): for each byte,
// the high bit set when the byte is zero, or below n (n <= 0x80). Exact as a
// yes/no answer for the word; of the bits set, the lowest (the first byte in
// memory when the word was loaded little-endian) marks a byte that is, since
// a borrow runs only upwards from one.
inline constexpr uint64_t kByteOnes = 0x0101010101010101ull, kByteHighs = 0x8080808080808080ull;
[[gnu::always_inline]] inline uint64_t zero_bytes(uint64_t v) { return (v - kByteOnes) & ~v & kByteHighs; }
[[gnu::always_inline]] inline uint64_t bytes_below(uint64_t v, uint8_t n) { return (v - kByteOnes * n) & ~v & kByteHighs; }

class Cursor {
public:
    Cursor() = default;
    Cursor(Bytes data, bool swap, const std::string* file, uint64_t base_offset)
        : data_(data), swap_(swap), file_(file), base_(base_offset) {}

    template <class T>
    T read() {
        need(sizeof(T));
        T v = load<T>(data_.data() + pos_, swap_);
        pos_ += sizeof(T);
        return v;
    }

    Bytes bytes(uint64_t n) {
        need(n);
        Bytes b = data_.subspan(pos_, static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n);
        return b;
    }

    void skip(uint64_t n) {
        need(n);
        pos_ += static_cast<size_t>(n);
    }

    // A count read from the file: refuse it before anything loops or allocates.
    void check_count(uint64_t count, uint64_t elem_size, const char* what) const {
        if (elem_size != 0 && count > left() / elem_size)
            fail(std::string(what) + " count " + std::to_string(count) + " exceeds the " +
                 std::to_string(left()) + " bytes left");
    }

    // NUL-terminated string stored in a fixed field of n bytes.
    std::string_view fixed_string(uint64_t n) {
        Bytes b = bytes(n);
        const char* s = reinterpret_cast<const char*>(b.data());
        return std::string_view(s, strnlen(s, b.size()));
    }

    // NUL-terminated string of unknown length (tracing data).
    std::string_view cstring() {
        const char* s = reinterpret_cast<const char*>(data_.data() + pos_);
        size_t n = strnlen(s, left());
        if (n == left()) fail("unterminated string");
        pos_ += n + 1;
        return std::string_view(s, n);
    }

    [[noreturn]] void fail(const std::string& reason) const {
        throw Error(file_ ? *file_ : std::string(), base_ + pos_, reason);
    }

    size_t left() const { return data_.size() - pos_; }
    size_t pos() const { return pos_; }
    void seek(size_t pos) {
        if (pos > data_.size()) fail("seek past the end");
        pos_ = pos;
    }
    bool swap() const { return swap_; }
    uint64_t offset() const { return base_ + pos_; }
    Bytes data() const { return data_; }
    Bytes rest() const { return data_.subspan(pos_); }
    const std::string* file() const { return file_; }

private:
    // The check is inlined into every read; the message is built out of line.
    void need(uint64_t n) const {
        if (n > left()) [[unlikely]]
            fail_need(n);
    }
    [[noreturn, gnu::cold, gnu::noinline]] void fail_need(uint64_t n) const {
        fail("needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) + " left");
    }

    Bytes data_;
    size_t pos_ = 0;
    bool swap_ = false;
    const std::string* file_ = nullptr;
    uint64_t base_ = 0;
};

// Hex digits at the front of text s (an optional 0x first), consumed: a
// perf map's START and SIZE, /proc/PID/maps' addresses. False when there
// are none, or more than 16 (a u64 cannot hold them).
inline bool take_hex(std::string_view& s, uint64_t& out) {
    if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
    size_t n = 0;
    uint64_t v = 0;
    for (; n < s.size(); ++n) {
        const char c = s[n];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else break;
        if (n == 16) return false;
        v = v << 4 | static_cast<uint64_t>(d);
    }
    if (n == 0) return false;
    s.remove_prefix(n);
    out = v;
    return true;
}

// Lower-case hex of raw bytes (build-ids as perf and readelf print them).
inline std::string to_hex(Bytes b) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(b.size() * 2);
    for (uint8_t c : b) {
        s += digits[c >> 4];
        s += digits[c & 15];
    }
    return s;
}

// An array of u64 inside the file (callchain ips, user registers), read lazily.
struct U64Array {
    Bytes bytes;
    bool swap = false;
    size_t size() const { return bytes.size() / 8; }
    uint64_t operator[](size_t i) const { return load<uint64_t>(bytes.data() + i * 8, swap); }
};

}  // namespace gilscan
