#include <doctest/doctest.h>

#include "gilscan/perfdata/kernel_records.h"
#include "support/perf_writer.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {
PerfEventAttr trailer_attr() {
    PerfEventAttr a;
    a.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID | PERF_SAMPLE_CPU;
    a.flags = 1ull << ATTR_BIT_sample_id_all;
    return a;
}
}  // namespace

TEST_CASE("COMM with the exec flag, trailer read from the end") {
    PerfWriter w;
    int i = w.add_event(trailer_attr(), "x", {9});
    w.comm(i, 10, 11, "python3.11", 777, true);
    const auto& rec = w.records.back();
    Bytes body(rec.data() + 8, rec.size() - 8);
    CommEvent e;
    decode_comm(body, load<uint16_t>(rec.data() + 4, false), w.attrs[i].attr, false, e);
    CHECK(e.pid == 10);
    CHECK(e.tid == 11);
    CHECK(e.comm == "python3.11");
    CHECK(e.exec);
    CHECK(e.sid.time == 777);
    CHECK(e.sid.id == 9);
}

TEST_CASE("MMAP2 in its inode form and its build-id form") {
    PerfEventAttr a = trailer_attr();
    PerfWriter w;
    int i = w.add_event(a, "x", {9});
    for (bool build_id : {false, true}) {
        CAPTURE(build_id);
        Out o;
        o.put<int32_t>(10);
        o.put<int32_t>(10);
        o.put<uint64_t>(0x7f0000001000);
        o.put<uint64_t>(0x2000);
        o.put<uint64_t>(0x1000);
        if (build_id) {
            o.put<uint8_t>(20);
            o.put<uint8_t>(0);
            o.put<uint16_t>(0);
            for (uint8_t k = 0; k < 20; ++k) o.put<uint8_t>(k);
        } else {
            o.put<uint32_t>(254);
            o.put<uint32_t>(1);
            o.put<uint64_t>(18834);
            o.put<uint64_t>(7);
        }
        o.put<uint32_t>(5);  // PROT_READ|PROT_EXEC
        o.put<uint32_t>(2);
        o.str("/usr/lib/libpython3.11.so.1.0");
        o.pad(8);
        w.trailer(o, i, 10, 10, 55, 1);
        MmapEvent e;
        decode_mmap(o.b, PERF_RECORD_MMAP2, build_id ? PERF_RECORD_MISC_MMAP_BUILD_ID : 0, a, false, e);
        CHECK(e.start == 0x7f0000001000);
        CHECK(e.len == 0x2000);
        CHECK(e.pgoff == 0x1000);
        CHECK(e.executable);
        CHECK(e.filename == "/usr/lib/libpython3.11.so.1.0");
        CHECK(e.sid.time == 55);
        if (build_id) {
            CHECK(e.build_id_size == 20);
            CHECK(e.build_id[19] == 19);
        } else {
            CHECK(e.ino == 18834);
            CHECK(e.maj == 254);
        }
    }
}

TEST_CASE("FORK/EXIT and LOST") {
    PerfEventAttr a = trailer_attr();
    PerfWriter w;
    int i = w.add_event(a, "x", {9});
    w.task(PERF_RECORD_FORK, i, 10, 1, 12, 10, 99);
    TaskEvent t;
    const auto& r = w.records.back();
    decode_task(Bytes(r.data() + 8, r.size() - 8), a, false, t);
    CHECK(t.pid == 10);
    CHECK(t.ppid == 1);
    CHECK(t.tid == 12);
    CHECK(t.ptid == 10);
    CHECK(t.time == 99);
    w.lost(i, 17, 120, 1);
    LostEvent l;
    const auto& lr = w.records.back();
    decode_lost(Bytes(lr.data() + 8, lr.size() - 8), PERF_RECORD_LOST, a, false, l);
    CHECK(l.lost == 17);
    CHECK(l.sid.cpu == 1);
    CHECK(l.sid.time == 120);
    Bytes too_short(lr.data() + 8, 4);
    CHECK_THROWS_AS(decode_lost(too_short, PERF_RECORD_LOST, PerfEventAttr{}, false, l), Error);
}

TEST_CASE("SWITCH in and out, SWITCH_CPU_WIDE with the other task, whose from the trailer") {
    PerfEventAttr a = trailer_attr();
    PerfWriter w;
    int i = w.add_event(a, "x", {9});
    struct Case {
        uint16_t misc;
        bool out, preempt;
    };
    for (Case c : {Case{0, false, false}, Case{PERF_RECORD_MISC_SWITCH_OUT, true, false},
                   Case{PERF_RECORD_MISC_SWITCH_OUT | PERF_RECORD_MISC_SWITCH_OUT_PREEMPT, true, true},
                   Case{PERF_RECORD_MISC_SWITCH_OUT_PREEMPT, false, false}}) {  // preempt means nothing on a switch-in
        CAPTURE(c.misc);
        w.context_switch(i, 10, 12, 500, 3, c.misc);
        const auto& r = w.records.back();
        SwitchEvent e;
        decode_switch(Bytes(r.data() + 8, r.size() - 8), PERF_RECORD_SWITCH, c.misc, a, false, e);
        CHECK(e.out == c.out);
        CHECK(e.preempt == c.preempt);
        CHECK_FALSE(e.cpu_wide);
        CHECK(e.sid.pid == 10);
        CHECK(e.sid.tid == 12);
        CHECK(e.sid.time == 500);
        CHECK(e.sid.cpu == 3);
    }
    w.context_switch(i, 10, 12, 600, 1, 0, true, 20, 21);
    const auto& r = w.records.back();
    SwitchEvent e;
    decode_switch(Bytes(r.data() + 8, r.size() - 8), PERF_RECORD_SWITCH_CPU_WIDE, 0, a, false, e);
    CHECK(e.cpu_wide);
    CHECK(e.next_prev_pid == 20);
    CHECK(e.next_prev_tid == 21);
    CHECK(e.sid.tid == 12);
    CHECK(e.sid.time == 600);
    // A CPU-wide record's two ids are its body: one without them is malformed.
    PerfEventAttr bare;
    CHECK_THROWS_AS(decode_switch(Bytes(r.data() + 8, 4), PERF_RECORD_SWITCH_CPU_WIDE, 0, bare, false, e), Error);
}
