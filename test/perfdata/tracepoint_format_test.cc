#include <doctest/doctest.h>

#include <tuple>

#include "gilscan/sched/sched_events.h"
#include "gilscan/perfdata/tracepoint_format.h"
#include "support/perf_writer.h"
#include "support/test_util.h"

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
    // One of a function's several exits, each a plain probe (exit_sites.h).
    CHECK(gil_probe_kind("gilscan_x:take_gil__return_1") == TpKind::GilTakeReturn);
    CHECK(gil_probe_kind("gilscan_x:drop_gil_1__return_12") == TpKind::GilDropReturn);
    CHECK(gil_probe_kind("gilscan_x:take_gil__returns_1") == TpKind::Other);
    CHECK(gil_probe_kind("sched:sched_switch") == TpKind::Other);
}

TEST_CASE("event kinds: scheduler tracepoints by their format and the fields read, GIL probes by name") {
    const TpFormat sw = parse_tracepoint_format("sched", test::kSchedSwitchFormat);
    const TpFormat wk = parse_tracepoint_format("sched", test::kSchedWakingFormat);
    CHECK(event_kind(&sw, "sched:sched_switch") == TpKind::SchedSwitch);
    CHECK(event_kind(&sw, "renamed") == TpKind::SchedSwitch);  // the format's name decides
    CHECK(event_kind(&wk, "sched:sched_waking") == TpKind::SchedWaking);
    CHECK(event_kind(nullptr, "sched:sched_switch") == TpKind::Other);  // nothing to read its fields by
    CHECK(event_kind(nullptr, "python:take_gil") == TpKind::Other);
    TpFormat no_state = sw;  // without a field the timeline reads: not a switch it can use
    std::erase_if(no_state.fields, [](const TpField& x) { return x.name == "prev_state"; });
    CHECK(event_kind(&no_state, "sched:sched_switch") == TpKind::Other);
    const TpFormat probe = parse_tracepoint_format("python", test::probe_format("take_gil__return", 2002, true));
    CHECK(event_kind(&probe, "python:take_gil__return") == TpKind::GilTakeReturn);
    // The decoder agrees with the kind it decodes by.
    EventInfo ev;
    ev.format = &no_state;
    ev.name = "sched:sched_switch";
    TracepointDecoder dec;
    SchedSwitch out;
    std::vector<uint8_t> raw(64, 0);
    Sample s;
    s.raw = Bytes(raw.data(), raw.size());
    CHECK_FALSE(dec.decode(s, ev, false, out));
    ev.format = &sw;
    ++ev.generation;
    CHECK(dec.decode(s, ev, false, out));
}

TEST_CASE("fixed char[N] strings end at their first NUL, whatever the bytes around it") {
    // comm fields take a word-at-a-time path (N == 16): every position of the
    // first NUL, bytes before it that fool a careless zero-byte test (0x01,
    // 0x80, 0xff), anything after it; other sizes go through strnlen.
    uint64_t seed = 11;
    auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, static_cast<uint8_t>(seed >> 56); };
    const uint8_t tricky[] = {0x01, 0x80, 0xff, 0x7f, 0x81, 'a'};
    size_t checked = 0;
    for (uint32_t size : {16u, 8u, 15u, 17u, 32u}) {
        TpField f;
        f.offset = 4;
        f.size = size;
        f.is_array = true;
        for (uint32_t nul = 0; nul <= size; ++nul) {
            for (int trial = 0; trial < 200; ++trial) {
                std::vector<uint8_t> raw(4 + size + 4);
                for (auto& b : raw) b = rnd();
                for (uint32_t i = 0; i < nul; ++i) {
                    uint8_t b = trial % 2 ? tricky[rnd() % 6] : rnd();
                    raw[4 + i] = b ? b : 1;
                }
                if (nul < size) raw[4 + nul] = 0;
                bool ok = true;
                const std::string_view got = read_str(raw, f, false, &ok);
                CHECK(ok);
                REQUIRE(got.size() == nul);
                CHECK(got.data() == reinterpret_cast<const char*>(raw.data() + 4));
                ++checked;
            }
        }
        // The field running past the record: empty, and reported.
        std::vector<uint8_t> raw(4 + size - 1, 'x');
        bool ok = true;
        CHECK(read_str(raw, f, false, &ok).empty());
        CHECK_FALSE(ok);
    }
    CHECK(checked == 200u * (17 + 9 + 16 + 18 + 33));
}

namespace {
// Formats made from `standard` by changing its fields.
template <class Change>
TpFormat variant_of(const TpFormat& standard, Change change) {
    TpFormat f = standard;
    for (auto& x : f.fields) change(x);
    return f;
}

// The decoder against read_int / read_str on the same bytes: 3000 records
// of random bytes (some too short) per format and byte order. compare(fmt,
// swap, sample, decoder, event) decodes one record both ways, checks they
// agree and returns whether the field reads succeeded. Returns how many
// decoded in the formats before `first_slow` (the fast path's).
template <class Compare>
size_t compare_on_random_records(const std::vector<TpFormat>& formats, size_t first_slow, const char* name,
                                 size_t len, uint64_t seed, Compare compare) {
    size_t fast = 0, checked = 0;
    auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, static_cast<uint8_t>(seed >> 56); };
    for (size_t k = 0; k < formats.size(); ++k)
    for (const bool swap : {false, true}) {
        EventInfo ev;
        ev.format = &formats[k];
        ev.name = name;
        TracepointDecoder dec;
        for (int i = 0; i < 3000; ++i) {
            std::vector<uint8_t> raw(i % 10 == 0 ? rnd() % len : len + rnd() % 8);  // some too short
            for (auto& x : raw) x = rnd() % 3 ? rnd() : 0;
            Sample s;
            s.raw = Bytes(raw.data(), raw.size());
            const bool ok = compare(formats[k], swap, s, dec, ev);
            fast += ok && k < first_slow;
            ++checked;
        }
    }
    CHECK(checked == formats.size() * 2 * 3000);
    return fast;
}
}  // namespace

TEST_CASE("sched_switch decodes at fixed offsets as field by field: int sizes, signedness, byte orders, short and __data_loc records") {
    // The decoder reads a sched_switch whose fields all sit at fixed places
    // with one length test; anything else (a short record, a __data_loc
    // comm) field by field. Both against read_int / read_str on the same bytes.
    const TpFormat standard = parse_tracepoint_format("sched", test::kSchedSwitchFormat);
    auto variant = [&](auto change) { return variant_of(standard, change); };
    const std::vector<TpFormat> formats = {
        standard,
        variant([](TpField& x) { if (x.name == "prev_state") { x.size = 4; x.is_signed = false; } }),
        variant([](TpField& x) { if (x.name == "prev_pid" || x.name == "next_pid") x.is_signed = false; }),
        variant([](TpField& x) { if (x.name == "next_comm") { x.data_loc = true; x.size = 4; } }),  // field by field
        variant([](TpField& x) { if (x.name == "prev_prio") x.size = 2; }),                          // field by field
    };
    const size_t fast = compare_on_random_records(
        formats, 3, "sched:sched_switch", 64, 3,
        [](const TpFormat& fmt, bool swap, const Sample& s, TracepointDecoder& dec, const EventInfo& ev) {
            SchedSwitch got, want;
            bool ok = true;
            want.prev_pid = static_cast<int32_t>(read_int(s.raw, *fmt.field("prev_pid"), swap, &ok));
            want.next_pid = static_cast<int32_t>(read_int(s.raw, *fmt.field("next_pid"), swap, &ok));
            want.prev_state = read_int(s.raw, *fmt.field("prev_state"), swap, &ok);
            want.prev_comm = read_str(s.raw, *fmt.field("prev_comm"), swap);
            want.next_comm = read_str(s.raw, *fmt.field("next_comm"), swap);
            want.prev_prio = static_cast<int32_t>(read_int(s.raw, *fmt.field("prev_prio"), swap));
            want.next_prio = static_cast<int32_t>(read_int(s.raw, *fmt.field("next_prio"), swap));
            REQUIRE(dec.decode(s, ev, swap, got) == ok);
            auto all = [](const SchedSwitch& x) {
                return std::tuple(x.prev_pid, x.next_pid, x.prev_state, x.prev_comm, x.next_comm, x.prev_prio, x.next_prio);
            };
            CHECK(all(got) == all(want));
            return ok;
        });
    CHECK(fast > 4000);
}

TEST_CASE("sched_waking decodes at fixed offsets as field by field: int sizes, signedness, byte orders, short and __data_loc records") {
    // Linux 6.1's layout (comm a char[16]); the test writer's has comm as a
    // __data_loc string (newer kernels), read field by field.
    const TpFormat standard = parse_tracepoint_format(
        "sched",
        "name: sched_waking\nID: 375\nformat:\n"
        "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
        "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
        "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
        "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
        "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
        "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n"
        "\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;\n"
        "\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;\n\n"
        "print fmt: \"comm=%s pid=%d prio=%d target_cpu=%03d\", REC->comm, REC->pid, REC->prio, REC->target_cpu\n");
    auto variant = [&](auto change) { return variant_of(standard, change); };
    const std::vector<TpFormat> formats = {
        standard,
        variant([](TpField& x) { if (x.name == "pid") x.is_signed = false; }),
        variant([](TpField& x) { if (x.name == "target_cpu") { x.size = 8; } }),
        parse_tracepoint_format("sched", test::kSchedWakingFormat),                // __data_loc comm: field by field
        variant([](TpField& x) { if (x.name == "target_cpu") x.size = 2; }),       // field by field
    };
    const size_t fast = compare_on_random_records(
        formats, 3, "sched:sched_waking", 40, 5,
        [](const TpFormat& fmt, bool swap, const Sample& s, TracepointDecoder& dec, const EventInfo& ev) {
            SchedWake got, want;
            bool ok = true;
            want.pid = static_cast<int32_t>(read_int(s.raw, *fmt.field("pid"), swap, &ok));
            want.target_cpu = static_cast<int32_t>(read_int(s.raw, *fmt.field("target_cpu"), swap));
            want.comm = read_str(s.raw, *fmt.field("comm"), swap);
            REQUIRE(dec.decode(s, ev, swap, got) == ok);
            CHECK(std::tuple(got.pid, got.target_cpu, got.comm) == std::tuple(want.pid, want.target_cpu, want.comm));
            return ok;
        });
    CHECK(fast > 4000);
}
