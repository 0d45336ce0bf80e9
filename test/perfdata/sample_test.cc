#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "gilscan/perfdata/sample.h"
#include "support/perf_writer.h"

using namespace gilscan;

namespace {

constexpr uint64_t kAllBits =
    PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR |
    PERF_SAMPLE_ID | PERF_SAMPLE_STREAM_ID | PERF_SAMPLE_CPU | PERF_SAMPLE_PERIOD | PERF_SAMPLE_READ |
    PERF_SAMPLE_CALLCHAIN | PERF_SAMPLE_RAW | PERF_SAMPLE_BRANCH_STACK | PERF_SAMPLE_REGS_USER |
    PERF_SAMPLE_STACK_USER | PERF_SAMPLE_WEIGHT | PERF_SAMPLE_DATA_SRC | PERF_SAMPLE_TRANSACTION |
    PERF_SAMPLE_REGS_INTR | PERF_SAMPLE_PHYS_ADDR | PERF_SAMPLE_CGROUP | PERF_SAMPLE_DATA_PAGE_SIZE |
    PERF_SAMPLE_CODE_PAGE_SIZE | PERF_SAMPLE_AUX;

void check_all_bits(bool swap) {
    test::PerfWriter w;
    w.swap = swap;
    PerfEventAttr a;
    a.sample_type = kAllBits;
    a.read_format = PERF_FORMAT_ID | PERF_FORMAT_LOST;
    a.branch_sample_type = PERF_SAMPLE_BRANCH_HW_INDEX;
    a.sample_regs_user = 0xff0fff;  // what --call-graph dwarf asks for on x86-64
    a.sample_regs_intr = 0x3;
    int i = w.add_event(a, "cycles", {42});
    test::TestSample s;
    s.ip = 0x1234;
    s.pid = 10;
    s.tid = 11;
    s.time = 999;
    s.addr = 0xad0;
    s.stream_id = 7;
    s.cpu = 3;
    s.period = 5;
    s.read_values = {100, 42, 9};  // value, id, lost
    s.callchain = {PERF_CONTEXT_USER, 0x1, 0x2};
    s.raw = {1, 2, 3, 4};
    s.branch = {1, 2, 3, 4, 5, 6};
    s.regs_user.assign(20, 0);  // popcount(0xff0fff) == 20
    s.regs_user[8] = 0xdead;    // IP is the ninth register in bit order
    s.stack = {9, 8, 7, 6};
    s.stack_reserved = 16;      // kernel reserved 16, copied 4: only 4 are valid
    s.weight = 11;
    s.data_src = 12;
    s.transaction = 13;
    s.regs_intr = {21, 22};
    s.phys_addr = 14;
    s.cgroup = 15;
    s.data_page_size = 4096;
    s.code_page_size = 8192;
    s.aux = {1, 1, 1, 1, 1, 1, 1, 1};
    auto body = w.sample_body(i, s);
    Sample out;
    parse_sample(Cursor(body, swap, nullptr, 0), w.attrs[i].attr, out);
    CHECK(out.id == 42);
    CHECK(out.ip == 0x1234);
    CHECK(out.pid == 10);
    CHECK(out.tid == 11);
    CHECK(out.time == 999);
    CHECK(out.stream_id == 7);
    CHECK(out.cpu == 3);
    CHECK(out.period == 5);
    CHECK(out.lost == 9);
    REQUIRE(out.callchain.size() == 3);
    CHECK(out.callchain[0] == PERF_CONTEXT_USER);
    CHECK(out.callchain[2] == 0x2);
    CHECK(out.raw.size() == 4);
    CHECK(out.branch_nr == 2);
    CHECK(out.regs_user_abi == 2);
    REQUIRE(out.regs_user.size() == 20);
    CHECK(out.regs_user[8] == 0xdead);
    CHECK(out.stack_user.size() == 4);
    CHECK(out.stack_user_size == 16);
    CHECK(out.weight == 11);
    CHECK(out.data_src == 12);
    CHECK(out.transaction == 13);
    CHECK(out.regs_intr.size() == 2);
    CHECK(out.phys_addr == 14);
    CHECK(out.cgroup == 15);
    CHECK(out.data_page_size == 4096);
    CHECK(out.code_page_size == 8192);
    CHECK(out.aux.size() == 8);
}

}  // namespace

TEST_CASE("every PERF_SAMPLE_* bit in kernel order") { check_all_bits(false); }
TEST_CASE("every PERF_SAMPLE_* bit in a byte-swapped sample") { check_all_bits(true); }

TEST_CASE("group read_format and REGS_USER with ABI none") {
    test::PerfWriter w;
    PerfEventAttr a;
    a.sample_type = PERF_SAMPLE_TIME | PERF_SAMPLE_READ | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_PERIOD;
    a.read_format = PERF_FORMAT_GROUP | PERF_FORMAT_ID | PERF_FORMAT_TOTAL_TIME_ENABLED;
    a.sample_regs_user = 0xff;
    int i = w.add_event(a, "g");
    test::TestSample s;
    s.time = 5;
    s.read_values = {2, /*enabled*/ 77, 10, 1, 20, 2};  // nr, time_enabled, {value,id} x2
    s.period = 3;
    auto body = w.sample_body(i, s);
    Sample out;
    parse_sample(Cursor(body, false, nullptr, 0), a, out);
    CHECK(out.regs_user_abi == 0);
    CHECK(out.regs_user.size() == 0);
    CHECK(out.period == 3);
}

TEST_CASE("counts larger than the record are refused") {
    test::PerfWriter w;
    PerfEventAttr a;
    a.sample_type = PERF_SAMPLE_CALLCHAIN;
    int i = w.add_event(a, "c");
    test::TestSample s;
    s.callchain = {1, 2};
    auto body = w.sample_body(i, s);
    body[0] = 0xff;  // nr = 255 with 16 bytes behind it
    Sample out;
    CHECK_THROWS_AS(parse_sample(Cursor(body, false, nullptr, 0), a, out), Error);

    PerfEventAttr b;
    b.sample_type = PERF_SAMPLE_STACK_USER;
    int j = w.add_event(b, "s");
    test::TestSample t;
    t.stack = {1, 2, 3, 4, 5, 6, 7, 8};
    auto sb = w.sample_body(j, t);
    sb[1] = 0x10;  // size = 4104
    CHECK_THROWS_AS(parse_sample(Cursor(sb, false, nullptr, 0), b, out), Error);
}

TEST_CASE("id position and sample_id_all trailer") {
    PerfEventAttr a;
    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID | PERF_SAMPLE_CPU;
    a.flags = 1ull << ATTR_BIT_sample_id_all;
    IdLayout l = id_layout(a);
    CHECK(l.sample_index == 3);
    CHECK(l.trailer_index == 2);  // id, then cpu, from the end
    a.sample_type |= PERF_SAMPLE_IDENTIFIER;
    l = id_layout(a);
    CHECK(l.sample_index == 0);
    CHECK(l.trailer_index == 1);
    CHECK(sample_time_index(a.sample_type) == 3);

    test::PerfWriter w;
    test::Out o;
    o.put<int32_t>(0);  // some body
    o.put<int32_t>(0);
    int i = w.add_event(a, "x", {77});
    w.trailer(o, i, 5, 6, 1234, 1);
    SampleId sid;
    REQUIRE(parse_sample_id_trailer(o.b, w.attrs[i].attr, false, sid));
    CHECK(sid.pid == 5);
    CHECK(sid.tid == 6);
    CHECK(sid.time == 1234);
    CHECK(sid.cpu == 1);
    CHECK(sid.id == 77);
}

// The fixed-offset fast path against parse_sample: every combination of the
// fixed fields with and without RAW, both byte orders, bodies of every length
// around the fields' size and RAW sizes that fit or run past the body. Where
// parse_sample reads a sample, the fast path reads the same fields (and writes
// no others); where it throws, the fast path declines.
TEST_CASE("parse_sample_fixed reads what parse_sample reads, and declines what it refuses") {
    const uint64_t fixed_bits[] = {PERF_SAMPLE_IDENTIFIER, PERF_SAMPLE_IP, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
                                   PERF_SAMPLE_ADDR, PERF_SAMPLE_ID, PERF_SAMPLE_STREAM_ID, PERF_SAMPLE_CPU,
                                   PERF_SAMPLE_PERIOD, PERF_SAMPLE_RAW};
    uint64_t state = 0x9e3779b97f4a7c15ull;
    auto rnd = [&] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    };
    // Every field set to something neither parser writes.
    auto sentinel = [] {
        Sample s;
        s.id = 0x5151;
        s.ip = s.addr = s.period = s.stream_id = 0x7777;
        s.pid = s.tid = -9;
        s.time = 0x1234;
        s.has_time = false;
        s.cpu = 77;
        return s;
    };
    size_t fast = 0, declined = 0, shaped = 0;
    for (bool swap : {false, true}) {
        for (uint32_t m = 0; m < (1u << 10); ++m) {
            PerfEventAttr a;
            for (int b = 0; b < 10; ++b)
                if (m & (1u << b)) a.sample_type |= fixed_bits[b];
            const SampleLayout l = sample_layout(a);
            REQUIRE(l.fixed);
            // perf record's two tracepoint layouts take paths of their own.
            constexpr uint64_t kTp = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU |
                                     PERF_SAMPLE_PERIOD | PERF_SAMPLE_RAW;
            const bool tp_id = a.sample_type == (kTp | PERF_SAMPLE_ID);
            const bool tp_identifier = a.sample_type == (kTp | PERF_SAMPLE_IDENTIFIER);
            CHECK((l.shape == SampleLayout::Shape::TpId) == tp_id);
            CHECK((l.shape == SampleLayout::Shape::TpIdentifier) == tp_identifier);
            shaped += tp_id || tp_identifier;
            const size_t fields = 8u * static_cast<size_t>(std::popcount(m & 0x1ffu));
            CHECK(l.size == fields);
            for (size_t len = fields > 12 ? fields - 12 : 0; len <= fields + 24; len += 4) {
                std::vector<uint8_t> body(len);
                for (auto& byte : body) byte = static_cast<uint8_t>(rnd());
                if ((m & (1u << 9)) && len >= fields + 4) {
                    // RAW's size: fitting exactly, short of the end, or past it by one.
                    const uint32_t left = static_cast<uint32_t>(len - fields - 4);
                    const uint32_t size = std::vector<uint32_t>{left, left / 2, left + 1}[rnd() % 3];
                    uint32_t stored = swap ? __builtin_bswap32(size) : size;
                    std::memcpy(body.data() + fields, &stored, 4);
                }
                Sample want = sentinel(), got = sentinel();
                bool ok = true;
                try {
                    parse_sample(Cursor(Bytes(body.data(), body.size()), swap, nullptr, 0), a, want);
                } catch (const Error&) {
                    ok = false;
                }
                const bool read = parse_sample_fixed(Bytes(body.data(), body.size()), swap, l, got);
                REQUIRE(read == ok);
                if (!ok) {
                    ++declined;
                    continue;
                }
                ++fast;
                CHECK(got.id == want.id);
                CHECK(got.ip == want.ip);
                CHECK(got.pid == want.pid);
                CHECK(got.tid == want.tid);
                CHECK(got.time == want.time);
                CHECK(got.has_time == want.has_time);
                CHECK(got.addr == want.addr);
                CHECK(got.stream_id == want.stream_id);
                CHECK(got.cpu == want.cpu);
                CHECK(got.period == want.period);
                CHECK(got.raw.data() == want.raw.data());
                CHECK(got.raw.size() == want.raw.size());
            }
        }
    }
    CHECK(fast > 10000);
    CHECK(declined > 5000);
    CHECK(shaped == 4);  // two layouts, two byte orders
}

TEST_CASE("sample_layout: any field past RAW or of variable size leaves the fast path") {
    for (uint64_t other : {PERF_SAMPLE_READ, PERF_SAMPLE_CALLCHAIN, PERF_SAMPLE_BRANCH_STACK, PERF_SAMPLE_REGS_USER,
                           PERF_SAMPLE_STACK_USER, PERF_SAMPLE_WEIGHT, PERF_SAMPLE_DATA_SRC, PERF_SAMPLE_TRANSACTION,
                           PERF_SAMPLE_REGS_INTR, PERF_SAMPLE_PHYS_ADDR, PERF_SAMPLE_CGROUP, PERF_SAMPLE_DATA_PAGE_SIZE,
                           PERF_SAMPLE_CODE_PAGE_SIZE, PERF_SAMPLE_AUX, PERF_SAMPLE_WEIGHT_STRUCT}) {
        PerfEventAttr a;
        a.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_RAW | other;
        CHECK_FALSE(sample_layout(a).fixed);
    }
    PerfEventAttr sched;  // what perf record -e sched:... asks for
    sched.sample_type = PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
                        PERF_SAMPLE_CPU | PERF_SAMPLE_PERIOD | PERF_SAMPLE_RAW;
    const SampleLayout l = sample_layout(sched);
    CHECK(l.fixed);
    CHECK(l.raw);
    CHECK(l.time == 24);
    CHECK(l.cpu == 32);
    CHECK(l.size == 48);
}
