#include <doctest/doctest.h>

#include "gilscan/sample.h"
#include "perf_writer.h"

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
