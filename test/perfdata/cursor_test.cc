#include <doctest/doctest.h>

#include "gilscan/perfdata/cursor.h"

using namespace gilscan;

TEST_CASE("cursor reads little and big endian by memcpy, at any alignment") {
    const uint8_t bytes[] = {0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
    std::string name = "f";
    Cursor le(Bytes(bytes, sizeof bytes), false, &name, 100);
    le.skip(1);  // unaligned from here on
    CHECK(le.read<uint32_t>() == 0x04030201u);
    CHECK(le.read<uint16_t>() == 0x0605u);
    Cursor be(Bytes(bytes, sizeof bytes), true, &name, 100);
    be.skip(1);
    CHECK(be.read<uint32_t>() == 0x01020304u);
    CHECK(be.offset() == 105);
}

TEST_CASE("cursor refuses to read past the end and names file and offset") {
    const uint8_t bytes[6] = {};
    std::string name = "rec.data";
    Cursor c(Bytes(bytes, sizeof bytes), false, &name, 1000);
    c.read<uint32_t>();
    try {
        c.read<uint32_t>();
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("rec.data") != std::string::npos);
        CHECK(e.offset() == 1004);
    }
}

TEST_CASE("check_count rejects counts larger than the bytes left before any loop") {
    const uint8_t bytes[16] = {};
    Cursor c(Bytes(bytes, sizeof bytes), false, nullptr, 0);
    CHECK_NOTHROW(c.check_count(2, 8, "ids"));
    CHECK_THROWS_AS(c.check_count(3, 8, "ids"), Error);
    CHECK_THROWS_AS(c.check_count(~uint64_t{0}, 8, "ids"), Error);  // no overflow in the product
}

TEST_CASE("strings: fixed fields stop at NUL, unterminated C strings fail") {
    const uint8_t bytes[] = {'a', 'b', 0, 'z', 'c', 'd'};
    Cursor c(Bytes(bytes, sizeof bytes), false, nullptr, 0);
    CHECK(c.fixed_string(4) == "ab");
    CHECK_THROWS_AS(c.cstring(), Error);
}

TEST_CASE("byteswap_int") {
    CHECK(byteswap_int<uint16_t>(0x1234) == 0x3412);
    CHECK(byteswap_int<uint64_t>(0x0102030405060708ull) == 0x0807060504030201ull);
    CHECK(byteswap_int<int32_t>(-2) == static_cast<int32_t>(0xfeffffff));
}
