// dwarf_cfi.h: LEB128 numbers, DW_EH_PE_* pointers and CIE headers, on
// bytes laid out as DWARF 5 (7.6) and the LSB's .eh_frame describe them.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "gilscan/error.h"
#include "gilscan/symbols/dwarf_cfi.h"

using namespace gilscan;

namespace {

const std::string kName = "test.eh_frame";

Cursor cursor(const std::vector<uint8_t>& b) { return Cursor(Bytes(b.data(), b.size()), false, &kName, 0); }

uint64_t uleb(const std::vector<uint8_t>& b) {
    Cursor c = cursor(b);
    const uint64_t v = read_uleb128(c);
    CHECK(c.left() == 0);
    return v;
}

int64_t sleb(const std::vector<uint8_t>& b) {
    Cursor c = cursor(b);
    const int64_t v = read_sleb128(c);
    CHECK(c.left() == 0);
    return v;
}

}  // namespace

TEST_CASE("dwarf cfi: LEB128 as DWARF 5's examples, the widest, and one too long") {
    CHECK(uleb({0x02}) == 2);
    CHECK(uleb({0x7f}) == 127);
    CHECK(uleb({0x80, 0x01}) == 128);
    CHECK(uleb({0x81, 0x01}) == 129);
    CHECK(uleb({0xb9, 0x64}) == 12857);
    CHECK(uleb({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}) == ~uint64_t{0});
    CHECK(sleb({0x02}) == 2);
    CHECK(sleb({0x7e}) == -2);
    CHECK(sleb({0xff, 0x00}) == 127);
    CHECK(sleb({0x81, 0x7f}) == -127);
    CHECK(sleb({0x80, 0x01}) == 128);
    CHECK(sleb({0x80, 0x7f}) == -128);
    CHECK(sleb({0x78}) == -8);  // x86-64's data alignment
    CHECK(sleb({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f}) == INT64_MIN);
    const std::vector<uint8_t> eleven(11, 0x80);
    Cursor c = cursor(eleven);
    CHECK_THROWS_WITH_AS(read_uleb128(c), doctest::Contains("overlong LEB128"), Error);
    const std::vector<uint8_t> bytes1{0x80, 0x80};
    Cursor cut = cursor(bytes1);
    CHECK_THROWS_AS(read_sleb128(cut), Error);
}

TEST_CASE("dwarf cfi: encoded pointers by format, pc- and data-relative") {
    {
        const std::vector<uint8_t> bytes2{0xf0, 0xff, 0xff, 0xff};  // sdata4 -16
        Cursor c = cursor(bytes2);
        CHECK(read_encoded_pointer(c, 0x1b, 0x401000) == 0x400ff0);  // pcrel|sdata4: what GCC writes
    }
    {
        const std::vector<uint8_t> bytes3{0x10, 0x00, 0x00, 0x00};
        Cursor c = cursor(bytes3);
        CHECK(read_encoded_pointer(c, 0x3b, 0, 0x500000) == 0x500010);  // datarel|sdata4 (.eh_frame_hdr)
    }
    {
        const std::vector<uint8_t> bytes4{0x34, 0x12, 0xe5, 0x8e, 0x26, 0x7e};  // udata2, then uleb128 624485, then sleb128 -2
        Cursor c = cursor(bytes4);
        CHECK(read_encoded_pointer(c, 0x02) == 0x1234);
        CHECK(read_encoded_pointer(c, 0x01) == 624485);
        CHECK(read_encoded_pointer(c, 0x09) == static_cast<uint64_t>(-2));
    }
    {
        const std::vector<uint8_t> bytes5{0x01, 0, 0, 0, 0, 0, 0, 0x80};
        Cursor c = cursor(bytes5);
        CHECK(read_encoded_pointer(c, 0x00) == 0x8000000000000001);  // absptr: 8 bytes on x86-64
    }
    const std::vector<uint8_t> bytes6{0, 0, 0, 0};
    Cursor c = cursor(bytes6);
    CHECK_THROWS_WITH_AS(read_encoded_pointer(c, 0x05), doctest::Contains("unsupported pointer encoding 5"), Error);
}

TEST_CASE("dwarf cfi: CIE headers as compilers and JITs write them") {
    // GCC's: version 1, "zR", code 1, data -8, return address 16, FDEs
    // pcrel|sdata4, then def_cfa rsp 8; offset rip 1; padding.
    const std::vector<uint8_t> gcc{0, 0, 0, 0, 1, 'z', 'R', 0, 0x01, 0x78, 0x10, 0x01, 0x1b,
                                   0x0c, 0x07, 0x08, 0x90, 0x01, 0x00, 0x00};
    Cursor c = cursor(gcc);
    const auto h = read_cie_header(c);
    REQUIRE(h);
    CHECK(h->version == 1);
    CHECK(h->code_align == 1);
    CHECK(h->data_align == -8);
    CHECK(h->ra_reg == 16);
    CHECK(h->z);
    CHECK(h->fde_enc == 0x1b);
    CHECK_FALSE(h->signal_frame);
    CHECK(std::vector<uint8_t>(h->instructions.begin(), h->instructions.end()) ==
          std::vector<uint8_t>{0x0c, 0x07, 0x08, 0x90, 0x01, 0x00, 0x00});

    // C++'s "zPLR": a personality pointer (indirect|pcrel|sdata4), the LSDA's
    // encoding, then R; version 3 with its return address as a uleb128.
    const std::vector<uint8_t> cxx{0, 0, 0, 0, 3, 'z', 'P', 'L', 'R', 0, 0x01, 0x78, 0x10, 0x07,
                                   0x9b, 0x11, 0x22, 0x33, 0x44, 0x1b, 0x1b, 0x0c, 0x07, 0x08};
    Cursor cx = cursor(cxx);
    const auto hx = read_cie_header(cx);
    REQUIRE(hx);
    CHECK(hx->version == 3);
    CHECK(hx->fde_enc == 0x1b);
    CHECK(hx->instructions.size() == 3);

    // A signal frame ("zRS"), and no augmentation at all.
    const std::vector<uint8_t> sig{0, 0, 0, 0, 1, 'z', 'R', 'S', 0, 0x01, 0x78, 0x10, 0x01, 0x1b};
    Cursor cs = cursor(sig);
    const auto hs = read_cie_header(cs);
    REQUIRE(hs);
    CHECK(hs->signal_frame);
    const std::vector<uint8_t> plain{0, 0, 0, 0, 1, 0, 0x01, 0x78, 0x10, 0x0c, 0x07, 0x08};
    Cursor cp = cursor(plain);
    const auto hp = read_cie_header(cp);
    REQUIRE(hp);
    CHECK_FALSE(hp->z);
    CHECK(hp->fde_enc == 0);
    CHECK(hp->instructions.size() == 3);
}

TEST_CASE("dwarf cfi: what is not a CIE this reader takes") {
    const std::vector<std::vector<uint8_t>> refused{
        {0x10, 0, 0, 0, 1, 0, 0x01, 0x78, 0x10},                  // an FDE's CIE pointer, not id 0
        {0, 0, 0, 0, 4, 0, 0x01, 0x78, 0x10},                     // version 4 (.debug_frame's)
        {0, 0, 0, 0, 1, 'e', 'h', 0, 0x01, 0x78, 0x10, 0, 0, 0},  // old GCC's "eh": data of unknown length
        {0, 0, 0, 0, 1, 'z', 'X', 0, 0x01, 0x78, 0x10, 0x00},     // an unknown letter
    };
    for (const auto& b : refused) {
        Cursor c = cursor(b);
        CHECK_FALSE(read_cie_header(c));
    }
    // Augmentation data longer than the CIE: an error naming the file.
    const std::vector<uint8_t> cut{0, 0, 0, 0, 1, 'z', 'R', 0, 0x01, 0x78, 0x10, 0x05, 0x1b};
    Cursor c = cursor(cut);
    CHECK_THROWS_WITH_AS(read_cie_header(c), doctest::Contains(kName.c_str()), Error);
}
