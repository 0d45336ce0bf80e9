#include <doctest/doctest.h>

#include "gilscan/sched_events.h"
#include "gilscan/tracepoint_format.h"
#include "perf_writer.h"

using namespace gilscan;

TEST_CASE("format files parse into named fields with offsets and sizes") {
    TpFormat f = parse_tracepoint_format("sched", test::kSchedSwitchFormat);
    CHECK(f.id == 372);
    CHECK(f.full_name() == "sched:sched_switch");
    const TpField* st = f.field("prev_state");
    REQUIRE(st);
    CHECK(st->offset == 32);
    CHECK(st->size == 8);
    CHECK(st->is_signed);
    const TpField* comm = f.field("prev_comm");
    REQUIRE(comm);
    CHECK(comm->is_array);
    CHECK(comm->type == "char[16]");
    CHECK(f.field("nope") == nullptr);
}

TEST_CASE("__data_loc strings and short records") {
    test::PerfWriter w;
    int i = w.add_tracepoint("sched", test::kSchedWakingFormat, PERF_SAMPLE_RAW);
    auto raw = w.raw(i, {{"pid", 77}, {"comm", 0, "python3", true}, {"target_cpu", 1}});
    TpFormat f = w.format_of(i);
    const TpField* comm = f.field("comm");
    const TpField* pid = f.field("pid");
    REQUIRE(comm != nullptr);
    REQUIRE(pid != nullptr);
    REQUIRE(comm->data_loc);
    CHECK(read_str(raw, *comm, false) == "python3");
    CHECK(read_int(raw, *pid, false) == 77);
    bool ok = true;
    Bytes cut(raw.data(), 10);
    CHECK(read_int(cut, *pid, false, &ok) == 0);
    CHECK_FALSE(ok);
}

TEST_CASE("garbage format text is refused") {
    CHECK_THROWS(parse_tracepoint_format("x", "hello"));
    CHECK_THROWS(parse_tracepoint_format("x", "name: a\nID: 1\nformat:\n\tfield:int;\toffset:0;\tsize:4;\n"));
}

TEST_CASE("prev_state decodes numerically with the masks of kernels >= 4.14") {
    TpFormat f = parse_tracepoint_format("sched", test::kSchedSwitchFormat);
    PrevStateTable t = PrevStateTable::from_print_fmt(f.print_fmt);
    CHECK(t.preempt_bit == 0x100);
    CHECK(t.decode(0).letters == "R");
    CHECK(t.decode(0).cls == StateClass::Runnable);
    PrevState rp = t.decode(0x100);  // TASK_REPORT_MAX: preempted while runnable, "R+"
    CHECK(rp.letters == "R+");
    CHECK(rp.cls == StateClass::Runnable);
    CHECK(rp.preempted);
    CHECK(t.decode(1).cls == StateClass::Sleeping);
    CHECK(t.decode(2).cls == StateClass::DiskSleep);
    CHECK(t.decode(0x80).cls == StateClass::Idle);
    CHECK(t.decode(0x80).letters == "I");
    CHECK(t.decode(0x10).cls == StateClass::Dead);
}

TEST_CASE("prev_state on an old kernel: masks from its print fmt (TASK_STATE_MAX 2048)") {
    const char* fmt =
        "\"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d next_prio=%d\", "
        "REC->prev_comm, REC->prev_pid, REC->prev_prio, REC->prev_state & (2048-1) ? "
        "__print_flags(REC->prev_state & (2048-1), \"|\", { 1, \"S\"} , { 2, \"D\" }, { 4, \"T\" }, { 8, \"t\" }, "
        "{ 16, \"Z\" }, { 32, \"X\" }, { 64, \"x\" }, { 128, \"K\" }, { 256, \"W\" }, { 512, \"P\" }, "
        "{ 1024, \"N\" }) : \"R\", REC->prev_state & 2048 ? \"+\" : \"\", REC->next_comm, REC->next_pid, "
        "REC->next_prio";
    PrevStateTable t = PrevStateTable::from_print_fmt(fmt);
    CHECK(t.preempt_bit == 2048);
    CHECK(t.decode(2048).letters == "R+");
    CHECK(t.decode(0x100).letters == "W");  // 0x100 is not "R+" there
    CHECK(t.decode(16).cls == StateClass::Dead);
    CHECK(t.decode(2 | 128).letters == "D|K");
    CHECK(t.decode(2 | 128).cls == StateClass::DiskSleep);
}

TEST_CASE("GIL uprobe names in any group, with perf's duplicate suffixes") {
    CHECK(gil_probe_kind("python:take_gil") == TpKind::GilTake);
    CHECK(gil_probe_kind("g39:take_gil__return") == TpKind::GilTakeReturn);
    CHECK(gil_probe_kind("probe_libpython3:take_gil_1") == TpKind::GilTake);
    CHECK(gil_probe_kind("python:drop_gil_2__return") == TpKind::GilDropReturn);
    CHECK(gil_probe_kind("python:take_gil_helper") == TpKind::Other);
    CHECK(gil_probe_kind("sched:sched_switch") == TpKind::Other);
}
