// Decimal text for the trace's numbers, written into a buffer the caller
// has sized (TraceWriter reserves room for an event's worst case first).
//
//   char buf[32];
//   char* e = put_uint(buf, 1234);        // "1234"
//   e = put_int(buf, -5);                 // "-5"
//   e = put_us(buf, 1234567);             // "1234.567": nanoseconds as microseconds, three decimals
//
// Why not std::to_chars: a trace event has three to six numbers, and on a
// scheduler capture formatting them was a tenth of all instructions.
// to_chars counts digits in a loop of four comparisons per four digits and
// checks the room it is given; here the digit count is one multiply and one
// table lookup (the bit length times log10(2), corrected by comparing with
// the power of ten), values that fit in 32 bits are divided in 32 bits, and
// the room is the caller's to guarantee (at most 20 digits and a sign).
// Always inlined: with link-time optimization GCC kept them out of line,
// a call per number.
#pragma once

#include <cstdint>
#include <cstring>

namespace gilscan {

inline constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// Two digits of v < 100.
[[gnu::always_inline]] inline char* put_pair(char* p, unsigned v) {
    std::memcpy(p, kDigitPairs + 2 * v, 2);
    return p + 2;
}

// Decimal digits of v (1 for 0).
[[gnu::always_inline]] inline unsigned decimal_digits(uint64_t v) {
    static constexpr uint64_t kPow10[20] = {1ull,
                                            10ull,
                                            100ull,
                                            1000ull,
                                            10000ull,
                                            100000ull,
                                            1000000ull,
                                            10000000ull,
                                            100000000ull,
                                            1000000000ull,
                                            10000000000ull,
                                            100000000000ull,
                                            1000000000000ull,
                                            10000000000000ull,
                                            100000000000000ull,
                                            1000000000000000ull,
                                            10000000000000000ull,
                                            100000000000000000ull,
                                            1000000000000000000ull,
                                            10000000000000000000ull};
    // v | 1 has the digits of v (powers of ten from 10 on are even), and 0 gets one.
    const uint64_t w = v | 1;
    const auto bits = static_cast<unsigned>(64 - __builtin_clzll(w));
    const unsigned t = (bits * 1233) >> 12;  // 1233 / 4096 ~ log10(2): digits of 2^(bits-1), or one less
    return t + (w >= kPow10[t]);
}

namespace detail {
// The digits of v backwards from end, two at a time.
template <class U>
[[gnu::always_inline]] inline void put_digits_back(char* end, U v) {
    while (v >= 100) {
        const U q = v / 100;
        end -= 2;
        std::memcpy(end, kDigitPairs + 2 * (v - q * 100), 2);
        v = q;
    }
    if (v >= 10) {
        std::memcpy(end - 2, kDigitPairs + 2 * v, 2);
    } else {
        end[-1] = static_cast<char>('0' + v);
    }
}
}  // namespace detail

[[gnu::always_inline]] inline char* put_uint(char* p, uint64_t v) {
    char* const end = p + decimal_digits(v);
    if (v <= UINT32_MAX)
        detail::put_digits_back(end, static_cast<uint32_t>(v));
    else
        detail::put_digits_back(end, v);
    return end;
}

[[gnu::always_inline]] inline char* put_int(char* p, int64_t v) {
    if (v >= 0) return put_uint(p, static_cast<uint64_t>(v));
    *p++ = '-';
    return put_uint(p, uint64_t{0} - static_cast<uint64_t>(v));  // INT64_MIN too
}

// Nanoseconds as microseconds with three decimals: no floating point.
[[gnu::always_inline]] inline char* put_us(char* p, uint64_t ns) {
    const uint64_t us = ns / 1000;
    const auto frac = static_cast<unsigned>(ns - us * 1000);
    p = put_uint(p, us);
    p[0] = '.';
    p[1] = static_cast<char>('0' + frac / 100);
    return put_pair(p + 2, frac % 100);
}

}  // namespace gilscan
