// The protobuf encoder byte by byte: the examples of protobuf's encoding
// guide, lengths of one to three varint bytes, negative ints, packed fields,
// and the .pftrace bundles built from them.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gilscan/output/pftrace_sched.h"
#include "gilscan/output/proto_encoder.h"
#include "support/proto_reader.h"

using namespace gilscan;
using gilscan::test::fields_of;
using gilscan::test::packed_varints;
using gilscan::test::proto_fields;

namespace {

std::string hex(std::string_view s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        if (!out.empty()) out += ' ';
        out += d[c >> 4];
        out += d[c & 15];
    }
    return out;
}

}  // namespace

TEST_CASE("proto encoder: scalars as protobuf's encoding guide writes them") {
    ProtoEncoder e;
    e.varint(1, 150);  // the guide's first example
    CHECK(hex(e.view()) == "08 96 01");
    e.clear();
    e.string(2, "testing");
    CHECK(hex(e.view()) == "12 07 74 65 73 74 69 6e 67");
    e.clear();
    e.int64(4, -1);  // int32/int64 -1: ten bytes of two's complement
    CHECK(hex(e.view()) == "20 ff ff ff ff ff ff ff ff ff 01");
    e.clear();
    e.varint(58, 6);  // a two-byte tag (field 58: 58 << 3 = 464)
    CHECK(hex(e.view()) == "d0 03 06");
    e.clear();
    e.boolean(9, true);
    e.fixed64(47, 0x0102030405060708ull);
    CHECK(hex(e.view()) == "48 01 f9 02 08 07 06 05 04 03 02 01");
    e.clear();
    e.dbl(5, 1.0);
    CHECK(hex(e.view()) == "29 00 00 00 00 00 00 f0 3f");
    e.clear();
    e.varint(1, 0);
    e.varint(1, ~uint64_t{0});
    CHECK(hex(e.view()) == "08 00 08 ff ff ff ff ff ff ff ff ff 01");
}

TEST_CASE("proto encoder: nested messages get minimal lengths") {
    ProtoEncoder e;
    size_t m = e.begin(3);  // the guide's embedded message: 1a 03 08 96 01
    e.varint(1, 150);
    e.end(m);
    CHECK(hex(e.view()) == "1a 03 08 96 01");

    e.clear();
    m = e.begin(3);
    e.end(m);
    CHECK(hex(e.view()) == "1a 00");

    // Nested twice, the inner one ending first.
    e.clear();
    m = e.begin(1);
    const size_t inner = e.begin(2);
    e.varint(1, 1);
    e.end(inner);
    e.varint(3, 7);
    e.end(m);
    CHECK(hex(e.view()) == "0a 06 12 02 08 01 18 07");

    // 200 bytes of body: a two-byte length (c8 01); 20000: three (a0 9c 01).
    for (size_t body : {size_t{127}, size_t{128}, size_t{200}, size_t{16383}, size_t{16384}, size_t{20000}}) {
        e.clear();
        m = e.begin(2);
        e.raw(std::string(body, 'x'));
        e.end(m);
        ProtoEncoder w;
        w.bytes(2, std::string(body, 'x'));
        CHECK(e.view() == w.view());
        CHECK(e.size() == 1 + ProtoEncoder::varint_size(body) + body);
    }
}

TEST_CASE("proto encoder: sizes counted before writing are the sizes written") {
    for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{127}, uint64_t{128}, uint64_t{16383}, uint64_t{16384},
                       (uint64_t{1} << 35) - 1, uint64_t{1} << 35, uint64_t{1} << 63, ~uint64_t{0}}) {
        char buf[10];
        CHECK(ProtoEncoder::varint_size(v) == static_cast<size_t>(ProtoEncoder::put_varint(buf, v) - buf));
        for (uint32_t field : {1u, 15u, 16u, 58u, 2047u, 2048u}) {
            ProtoEncoder e;
            e.varint(field, v);
            CHECK(ProtoEncoder::varint_field_size(field, v) == e.size());
        }
    }
    CHECK(ProtoEncoder::varint_size(~uint64_t{0}) == 10);
}

TEST_CASE("proto encoder: the reader of the tests reads back what it wrote") {
    ProtoEncoder e;
    e.varint(8, 123456789012345ull);
    const size_t m = e.begin(11);
    e.varint(9, 1);
    e.string(23, "GIL wait");
    e.end(m);
    const auto f = proto_fields(e.view());
    REQUIRE(f.size() == 2);
    CHECK(f[0].number == 8);
    CHECK(f[0].value == 123456789012345ull);
    CHECK(f[1].number == 11);
    const auto inner = proto_fields(f[1].bytes);
    REQUIRE(inner.size() == 2);
    CHECK(inner[1].bytes == "GIL wait");
}

// One bundle: its packet's fields.
struct Written {
    std::vector<std::string> packets;
    PftraceSched sched{[this](std::string_view p) { packets.emplace_back(p); }};
};

SchedSwitch make_switch(int32_t prev, int64_t state, int32_t next, std::string_view next_comm) {
    SchedSwitch sw;
    sw.prev_pid = prev;
    sw.prev_state = state;
    sw.prev_prio = 120;
    sw.next_pid = next;
    sw.next_prio = 110;
    sw.prev_comm = "prev";
    sw.next_comm = next_comm;
    return sw;
}

TEST_CASE("pftrace sched: compact where Perfetto infers the same, full where it could not") {
    Written w;
    // CPU 3: the first switch has no known previous task (full); the second's
    // prev_pid is the first's next_pid (compact); the third's is not (full).
    w.sched.sched_switch(3, 1000, 10, make_switch(10, 1, 20, "b"));
    w.sched.sched_switch(3, 1500, 20, make_switch(20, 0x100, 30, "c"));
    w.sched.sched_switch(3, 2500, 40, make_switch(40, 2, 20, "b"));
    SchedWake wk;
    wk.pid = 10;
    wk.target_cpu = 1;
    wk.prio = 120;
    wk.comm = "a";
    w.sched.sched_wake(3, 2600, 20, TpKind::SchedWaking, wk);  // fired in the CPU's task: compact
    w.sched.sched_wake(3, 2700, 99, TpKind::SchedWaking, wk);  // in another task: full
    w.sched.sched_wake(3, 2800, 20, TpKind::SchedWakeup, wk);  // after a waking: left out
    w.sched.sched_wake(3, 2900, 20, TpKind::SchedWakeupNew, wk);  // a new task's: full
    CHECK(w.packets.empty());
    w.sched.flush();
    REQUIRE(w.packets.size() == 1);
    CHECK(w.sched.compact_events() == 2);
    CHECK(w.sched.full_events() == 4);
    CHECK(w.sched.dropped_wakeups() == 1);

    const auto bundle = fields_of(w.packets[0], 1);
    REQUIRE(bundle.size() == 1);
    CHECK(fields_of(bundle[0].bytes, 1).at(0).value == 3);  // cpu
    const auto events = fields_of(bundle[0].bytes, 2);
    REQUIRE(events.size() == 4);
    // The first full event: timestamp 1000, pid 10, sched_switch { prev_pid 10, prev_state 1, next 20 }.
    CHECK(fields_of(events[0].bytes, 1).at(0).value == 1000);
    CHECK(fields_of(events[0].bytes, 2).at(0).value == 10);
    const auto sw = fields_of(events[0].bytes, 4).at(0).bytes;
    CHECK(fields_of(sw, 1).at(0).bytes == "prev");
    CHECK(fields_of(sw, 2).at(0).value == 10);
    CHECK(fields_of(sw, 4).at(0).value == 1);
    CHECK(fields_of(sw, 5).at(0).bytes == "b");
    CHECK(fields_of(sw, 6).at(0).value == 20);
    CHECK(fields_of(sw, 7).at(0).value == 110);
    CHECK(fields_of(events[1].bytes, 4).at(0).bytes.size() > 0);  // the third switch, full
    CHECK(fields_of(events[2].bytes, 20).size() == 1);             // waking in another task
    CHECK(fields_of(events[3].bytes, 114).size() == 1);            // sched_wakeup_new

    const auto compact = fields_of(bundle[0].bytes, 4).at(0).bytes;
    CHECK(fields_of(compact, 5).at(0).bytes == "c");                            // intern_table
    CHECK(packed_varints(fields_of(compact, 1).at(0).bytes) == std::vector<uint64_t>{1500});  // absolute first
    CHECK(packed_varints(fields_of(compact, 2).at(0).bytes) == std::vector<uint64_t>{0x100});
    CHECK(packed_varints(fields_of(compact, 3).at(0).bytes) == std::vector<uint64_t>{30});
    CHECK(packed_varints(fields_of(compact, 6).at(0).bytes) == std::vector<uint64_t>{0});
    CHECK(packed_varints(fields_of(compact, 7).at(0).bytes) == std::vector<uint64_t>{2600});
    CHECK(packed_varints(fields_of(compact, 8).at(0).bytes) == std::vector<uint64_t>{10});
    CHECK(packed_varints(fields_of(compact, 9).at(0).bytes) == std::vector<uint64_t>{1});
    CHECK(packed_varints(fields_of(compact, 12).at(0).bytes) == std::vector<uint64_t>{0});
}

TEST_CASE("pftrace sched: a sched_wakeup before any sched_waking is written, in full") {
    Written w;
    SchedWake wk;
    wk.pid = 10;
    wk.comm = "a";
    w.sched.sched_wake(0, 100, 1, TpKind::SchedWakeup, wk);
    w.sched.flush();
    REQUIRE(w.packets.size() == 1);
    const auto events = fields_of(fields_of(w.packets[0], 1).at(0).bytes, 2);
    REQUIRE(events.size() == 1);
    CHECK(fields_of(events[0].bytes, 17).size() == 1);
    CHECK(w.sched.dropped_wakeups() == 0);
}

TEST_CASE("pftrace sched: deltas within a bundle, a new bundle when full or when time goes back") {
    Written w;
    int32_t cur = 2;
    w.sched.sched_switch(0, 100, 1, make_switch(1, 1, 2, "x"));  // full: starts the CPU's sequence
    for (uint64_t i = 0; i < PftraceSched::kMaxEvents - 1; ++i) {
        const int32_t next = cur == 1 ? 2 : 1;
        w.sched.sched_switch(0, 200 + 10 * i, cur, make_switch(cur, 1, next, "x"));
        cur = next;
    }
    REQUIRE(w.packets.size() == 1);  // kMaxEvents reached
    const auto compact = fields_of(fields_of(w.packets[0], 1).at(0).bytes, 4).at(0).bytes;
    const auto ts = packed_varints(fields_of(compact, 1).at(0).bytes);
    REQUIRE(ts.size() == PftraceSched::kMaxEvents - 1);
    CHECK(ts[0] == 200);
    CHECK(ts[1] == 10);
    CHECK(ts.back() == 10);
    CHECK(fields_of(compact, 5).size() == 1);  // "x" interned once

    // After the bundle is written the CPU's task is still known: compact at once.
    w.sched.sched_switch(0, 100000, 0, make_switch(cur, 1, 7, "y"));
    // Time going back on the CPU: the bundle is written first.
    w.sched.sched_switch(0, 90000, 7, make_switch(7, 1, 8, "z"));
    REQUIRE(w.packets.size() == 2);
    w.sched.flush();
    REQUIRE(w.packets.size() == 3);
    CHECK(packed_varints(fields_of(fields_of(fields_of(w.packets[1], 1).at(0).bytes, 4).at(0).bytes, 1).at(0).bytes) ==
          std::vector<uint64_t>{100000});
    CHECK(packed_varints(fields_of(fields_of(fields_of(w.packets[2], 1).at(0).bytes, 4).at(0).bytes, 1).at(0).bytes) ==
          std::vector<uint64_t>{90000});
}

TEST_CASE("pftrace sched: each compact event names its task's comm as it was then") {
    // pid 5 renamed from one switch to the next; pid q on the same
    // recent-comm slot, taking turns with pid 5 after that.
    int32_t q = 6;
    while (PftraceSched::recent_slot(q) != PftraceSched::recent_slot(5)) ++q;
    Written w;
    w.sched.sched_switch(0, 100, 1, make_switch(1, 1, 5, "x"));  // full: starts the CPU's sequence
    w.sched.sched_switch(0, 200, 5, make_switch(5, 1, 5, "b"));
    w.sched.sched_switch(0, 300, 5, make_switch(5, 1, 5, "a"));
    w.sched.sched_switch(0, 400, 5, make_switch(5, 1, q, "c"));
    w.sched.sched_switch(0, 500, q, make_switch(q, 1, 5, "a"));
    w.sched.sched_switch(0, 600, 5, make_switch(5, 1, q, "c"));
    w.sched.sched_switch(0, 700, q, make_switch(q, 1, q, "d"));
    w.sched.flush();
    REQUIRE(w.packets.size() == 1);
    const auto compact = fields_of(fields_of(w.packets[0], 1).at(0).bytes, 4).at(0).bytes;
    std::vector<std::string> table;
    for (const auto& f : fields_of(compact, 5)) table.emplace_back(f.bytes);
    CHECK(table == std::vector<std::string>{"b", "a", "c", "d"});  // each once
    std::vector<std::string> comms;
    for (uint64_t i : packed_varints(fields_of(compact, 6).at(0).bytes)) comms.push_back(table.at(i));
    CHECK(comms == std::vector<std::string>{"b", "a", "c", "a", "c", "d"});
    const auto uq = static_cast<uint64_t>(q);
    CHECK(packed_varints(fields_of(compact, 3).at(0).bytes) == std::vector<uint64_t>{5, 5, uq, 5, uq, uq});
}

TEST_CASE("pftrace sched: without a CPU every event is full, in one bundle said to be CPU 0's") {
    Written w;
    w.sched.sched_switch(PftraceSched::kNoCpu, 10, 1, make_switch(1, 1, 2, "b"));
    w.sched.sched_switch(PftraceSched::kNoCpu, 20, 2, make_switch(2, 1, 1, "a"));
    w.sched.sched_switch(70000, 30, 5, make_switch(5, 1, 6, "f"));  // a file's arbitrary CPU number
    w.sched.flush();
    REQUIRE(w.packets.size() == 2);
    CHECK(w.sched.compact_events() == 0);
    CHECK(w.sched.full_events() == 3);
    std::vector<uint64_t> cpus;
    for (const auto& p : w.packets) cpus.push_back(fields_of(fields_of(p, 1).at(0).bytes, 1).at(0).value);
    std::sort(cpus.begin(), cpus.end());
    CHECK(cpus == std::vector<uint64_t>{0, 70000});
}

TEST_CASE("pftrace sched: a switch-in record the switches did not show becomes a switch from the CPU's task") {
    Written w;
    // CPU 1: nothing seen before: the idle task is named as the previous, in full.
    w.sched.switch_in(1, 100, 7, 120, "py");
    // Thread 7 switched out to another process's task 50 (traced, compact);
    // 50 switched 7 in again unseen: the record becomes 50 -> 7, compact.
    w.sched.sched_switch(1, 200, 7, make_switch(7, 1, 50, "other"));
    w.sched.switch_in(1, 300, 7, 115, "py");
    // A record after a traced switch-in changes nothing.
    w.sched.sched_switch(1, 400, 7, make_switch(7, 0x100, 8, "py2"));
    w.sched.switch_in(1, 401, 8, 120, "py2");
    // Thread 8's switch-out: compact, its previous task the record's thread.
    w.sched.switch_in(1, 500, 7, 115, "py");
    w.sched.sched_switch(1, 600, 7, make_switch(7, 1, 0, "swapper/1"));
    w.sched.switch_in(PftraceSched::kNoCpu, 700, 7, 115, "py");  // no CPU: nothing to put it in
    w.sched.flush();
    CHECK(w.sched.switch_ins() == 3);
    CHECK(w.sched.full_events() == 1);
    CHECK(w.sched.compact_events() == 5);
    REQUIRE(w.packets.size() == 1);
    const auto bundle = fields_of(w.packets[0], 1).at(0).bytes;
    const auto events = fields_of(bundle, 2);
    REQUIRE(events.size() == 1);
    CHECK(fields_of(events[0].bytes, 1).at(0).value == 100);
    CHECK(fields_of(events[0].bytes, 2).at(0).value == 0);  // fired in the idle task
    const auto sw = fields_of(events[0].bytes, 4).at(0).bytes;
    CHECK(fields_of(sw, 1).at(0).bytes == "swapper/1");
    CHECK(fields_of(sw, 2).at(0).value == 0);  // prev_pid
    CHECK(fields_of(sw, 4).at(0).value == 0);  // prev_state R
    CHECK(fields_of(sw, 5).at(0).bytes == "py");
    CHECK(fields_of(sw, 6).at(0).value == 7);
    CHECK(fields_of(sw, 7).at(0).value == 120);
    const auto compact = fields_of(bundle, 4).at(0).bytes;
    CHECK(packed_varints(fields_of(compact, 1).at(0).bytes) == std::vector<uint64_t>{200, 100, 100, 100, 100});
    CHECK(packed_varints(fields_of(compact, 2).at(0).bytes) == std::vector<uint64_t>{1, 0, 0x100, 0, 1});
    CHECK(packed_varints(fields_of(compact, 3).at(0).bytes) == std::vector<uint64_t>{50, 7, 8, 7, 0});
    CHECK(packed_varints(fields_of(compact, 4).at(0).bytes) == std::vector<uint64_t>{110, 115, 110, 115, 110});
}
