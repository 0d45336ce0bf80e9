// decimal.h against snprintf: every value up to 2,000,000, both sides of
// every power of ten and of two, the extremes, and random values of every
// magnitude.
#include <doctest/doctest.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "gilscan/output/decimal.h"

using namespace gilscan;

namespace {

std::string by_printf_u(uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "%" PRIu64, v);
    return b;
}

std::string by_printf_us(uint64_t ns) {
    char b[40];
    std::snprintf(b, sizeof b, "%" PRIu64 ".%03" PRIu64, ns / 1000, ns % 1000);
    return b;
}

// Values at the edges: powers of ten and of two, one either side.
std::vector<uint64_t> edges() {
    std::vector<uint64_t> v = {0, 1, UINT64_MAX, UINT64_MAX - 1, UINT32_MAX, uint64_t{UINT32_MAX} + 1, INT64_MAX};
    for (uint64_t p = 1, i = 0; i < 20; ++i, p *= 10)
        for (uint64_t d : {p - 1, p, p + 1}) v.push_back(d);
    for (unsigned b = 0; b < 64; ++b)
        for (uint64_t d : {(uint64_t{1} << b) - 1, uint64_t{1} << b, (uint64_t{1} << b) + 1}) v.push_back(d);
    uint64_t seed = 3;
    for (int i = 0; i < 200000; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v.push_back(seed >> (seed % 64));  // every magnitude
    }
    return v;
}

}  // namespace

TEST_CASE("decimal_digits and put_uint agree with printf") {
    char buf[48];
    size_t bad = 0, n = 0;
    auto check = [&](uint64_t v) {
        std::memset(buf, 'x', sizeof buf);
        const std::string want = by_printf_u(v);
        char* e = put_uint(buf, v);
        ++n;
        if (std::string(buf, e) != want || decimal_digits(v) != want.size() || buf[want.size()] != 'x') {
            if (bad++ < 5) CHECK(std::string(buf, e) == want);
        }
    };
    for (uint64_t v = 0; v <= 2'000'000; ++v) check(v);
    for (uint64_t v : edges()) check(v);
    CHECK(n > 2'200'000);
    CHECK(bad == 0);
}

TEST_CASE("put_int writes negative values with a sign, INT64_MIN included") {
    char buf[48];
    const int64_t values[] = {0, -1, 1, -9, -10, -99, -100, INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX, -1234567890123};
    for (int64_t v : values) {
        char want[32];
        std::snprintf(want, sizeof want, "%" PRId64, v);
        CHECK(std::string(buf, put_int(buf, v)) == want);
    }
    for (uint64_t u : edges()) {
        const auto v = static_cast<int64_t>(u);  // both signs
        char want[32];
        std::snprintf(want, sizeof want, "%" PRId64, v);
        REQUIRE(std::string(buf, put_int(buf, v)) == want);
    }
}

TEST_CASE("put_us: nanoseconds as microseconds with three decimals") {
    char buf[48];
    size_t bad = 0;
    for (uint64_t ns = 0; ns <= 200'000; ++ns)
        if (std::string(buf, put_us(buf, ns)) != by_printf_us(ns) && bad++ < 5) CHECK(std::string(buf, put_us(buf, ns)) == by_printf_us(ns));
    for (uint64_t ns : edges())
        if (std::string(buf, put_us(buf, ns)) != by_printf_us(ns) && bad++ < 5) CHECK(std::string(buf, put_us(buf, ns)) == by_printf_us(ns));
    CHECK(bad == 0);
}
