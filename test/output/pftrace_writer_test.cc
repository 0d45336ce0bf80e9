// The .pftrace writer's packets, read back with the tests' protobuf reader
// and resolved as Perfetto resolves them (sequence defaults, incremental
// clocks, interned names): descriptors before their sequences, slices as
// begin/end pairs, counters, which spans it writes, --pid, the process tree.
#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "gilscan/gil/gil_probes.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/pftrace_writer.h"
#include "support/proto_reader.h"

using namespace gilscan;
using gilscan::test::fields_of;
using gilscan::test::proto_fields;

namespace {

std::string temp_path() {
    return "/tmp/gilscan-pftrace-test-" + std::to_string(::getpid()) + ".pftrace";
}

// The file's packets (Trace.packet = 1, each length-delimited).
std::vector<std::string> packets_of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> out;
    for (const auto& f : proto_fields(data)) {
        REQUIRE(f.number == 1);
        REQUIRE(f.wire == 2);
        out.emplace_back(f.bytes);
    }
    return out;
}

uint64_t field(std::string_view msg, uint32_t n) {
    const auto f = fields_of(msg, n);
    return f.empty() ? ~uint64_t{0} : f[0].value;
}

// A track event as Perfetto reads it: its sequence's defaults (track),
// clock (incremental from the snapshot) and interned names resolved.
struct Event {
    uint64_t track = 0, ts = 0, type = 0;
    std::string name;
    std::vector<std::pair<std::string, std::string>> args;  // int values as text
    int64_t counter = -1;
};

struct Written {
    std::vector<std::string> packets;
    std::vector<std::string> descriptors;  // TrackDescriptor bodies, in order
    std::vector<Event> events;
    std::vector<uint64_t> raw_ts;  // the events' packets' own timestamp fields
    size_t sequence_starts = 0;
};

struct Sequence {
    uint64_t track = 0, clock = 0;
    std::map<uint64_t, std::string> names, annotation_names, strings;
};

void read_interned(std::string_view in, Sequence& q) {
    for (const auto& f : proto_fields(in)) {
        auto& into = f.number == 2 ? q.names : f.number == 3 ? q.annotation_names : q.strings;
        into[field(f.bytes, 1)] = std::string(fields_of(f.bytes, 2).at(0).bytes);
    }
}

Event resolve(std::string_view packet, Sequence& q, Written& r) {
    Event ev;
    const uint64_t raw = field(packet, 8);
    r.raw_ts.push_back(raw);
    if (fields_of(packet, 58).empty()) {
        q.clock += raw;
        ev.ts = q.clock;
    } else {
        CHECK(field(packet, 58) == PftraceWriter::kBoottime);
        ev.ts = raw;
    }
    const auto te = fields_of(packet, 11).at(0).bytes;
    ev.track = q.track;
    ev.type = field(te, 9);
    if (!fields_of(te, 10).empty()) ev.name = q.names.at(field(te, 10));
    if (!fields_of(te, 30).empty()) ev.counter = static_cast<int64_t>(field(te, 30));
    for (const auto& a : fields_of(te, 4)) {
        const std::string name = q.annotation_names.at(field(a.bytes, 1));
        ev.args.emplace_back(name, fields_of(a.bytes, 17).empty() ? std::to_string(field(a.bytes, 4))
                                                                  : q.strings.at(field(a.bytes, 17)));
    }
    return ev;
}

Written write(const std::function<void(PftraceWriter&)>& body, TraceOptions opt = {}) {
    const std::string path = temp_path();
    {
        OutputFile out(path, false);
        PftraceWriter w(out, opt, {"6.1.0-test", "x86_64", 4});
        body(w);
        ThreadStats a, b;
        a.tid = a.tgid = 100;
        a.comm = "python3";
        b.tid = 101;
        b.tgid = 100;
        b.comm = "worker";
        w.finish({&a, &b}, {"6.1.0-test", "x86_64", 4});
        out.commit();
    }
    Written r;
    r.packets = packets_of(path);
    ::unlink(path.c_str());
    std::map<uint64_t, Sequence> sequences;
    std::set<uint64_t> described;
    for (const auto& p : r.packets) {
        for (const auto& d : fields_of(p, 60)) {
            r.descriptors.emplace_back(d.bytes);
            described.insert(field(d.bytes, 1));
        }
        const uint64_t seq = field(p, 10);
        if (field(p, 13) == 1) {  // SEQ_INCREMENTAL_STATE_CLEARED: defaults, clock, names
            Sequence q;
            const auto defaults = fields_of(p, 59).at(0).bytes;
            CHECK(field(defaults, 58) == PftraceWriter::kTrackClock);
            q.track = field(fields_of(defaults, 11).at(0).bytes, 11);
            CHECK(described.count(q.track) == 1);  // described before its sequence starts
            for (const auto& c : fields_of(fields_of(p, 6).at(0).bytes, 1))
                if (field(c.bytes, 1) == PftraceWriter::kTrackClock) q.clock = field(c.bytes, 2);
            sequences[seq] = q;
            ++r.sequence_starts;
        }
        for (const auto& in : fields_of(p, 12)) read_interned(in.bytes, sequences.at(seq));
        if (!fields_of(p, 11).empty()) r.events.push_back(resolve(p, sequences.at(seq), r));
    }
    return r;
}

}  // namespace

TEST_CASE("pftrace: SystemInfo first, descriptors before their sequences, a child's parent its process") {
    const Written w = write([](PftraceWriter& pw) {
        pw.gil_waiters(100, 0, 1000, 2);
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 1000, 3000, false);
        pw.gil_span(100, 101, TraceSink::GilSpan::Lock, 0, 3000, 4000, false);
        pw.gil_holder(100, gil_track_tid(100, 1), 101, 3000, 4000, "spin (work.py)");
    });
    REQUIRE(!w.packets.empty());
    const auto info = fields_of(w.packets[0], 45);
    REQUIRE(info.size() == 1);
    const auto uts = fields_of(info[0].bytes, 1).at(0).bytes;
    CHECK(fields_of(uts, 3).at(0).bytes == "6.1.0-test");
    CHECK(field(info[0].bytes, 8) == 4);

    std::vector<std::string> names;
    uint64_t process_uuid = 0;
    for (const auto& d : w.descriptors) {
        if (!fields_of(d, 2).empty()) names.emplace_back(fields_of(d, 2)[0].bytes);
        if (!fields_of(d, 3).empty()) process_uuid = field(d, 1);
        if (!fields_of(d, 5).empty()) CHECK(field(d, 5) == process_uuid);
    }
    CHECK(names == std::vector<std::string>{"GIL waiters", "GIL", "GIL holder (GIL 2)"});
    CHECK(w.descriptors.size() == 4);  // and the process's, unnamed
    CHECK(w.sequence_starts == 3);     // one per track with events
    REQUIRE(w.events.size() == 7);
    CHECK(w.events[5].name == "GIL held by 101");
    CHECK(w.events[6].type == 2);
    CHECK(w.events[5].args == std::vector<std::pair<std::string, std::string>>{{"holder", "101"},
                                                                               {"culprit", "spin (work.py)"}});
}

TEST_CASE("pftrace: slices are begin and end packets on an incremental clock; a step back is absolute") {
    const Written w = write([](PftraceWriter& pw) {
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 1000, 3000, true);
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 5000, 6000, false);
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 7000, 7000, false);  // no length: not written
        pw.gil_span(100, 101, TraceSink::GilSpan::Lock, 2, 5500, 5800, false);  // nested, closed later: back in time
        pw.gil_waiters(100, 0, 1000, 1);
    });
    REQUIRE(w.events.size() == 7);
    std::vector<uint64_t> ts, types;
    std::vector<std::string> names;
    for (const Event& e : w.events) {
        ts.push_back(e.ts);
        types.push_back(e.type);
        names.push_back(e.name);
    }
    CHECK(ts == std::vector<uint64_t>{1000, 3000, 5000, 6000, 5500, 5800, 1000});
    CHECK(types == std::vector<uint64_t>{1, 2, 1, 2, 1, 2, 4});
    CHECK(names == std::vector<std::string>{"GIL wait", "", "GIL wait", "", "LOCK", "", ""});
    // On the wire: deltas from the snapshot's 1000, then BOOTTIME for the step back.
    CHECK(w.raw_ts == std::vector<uint64_t>{0, 2000, 2000, 1000, 5500, 5800, 0});
    CHECK(w.events[0].args == std::vector<std::pair<std::string, std::string>>{{"cut_at_end", "1"}});
    CHECK(w.events[4].args == std::vector<std::pair<std::string, std::string>>{{"gil", "3"}});
    CHECK(w.events[6].counter == 1);
    CHECK(w.events[0].track == w.events[5].track);
    CHECK(w.events[0].track != w.events[6].track);
}

TEST_CASE("pftrace: only labelled sleeps of the timeline's spans, strings interned once, --pid, the process tree") {
    TraceOptions opt;
    opt.pids = {100};
    size_t string_entries = 0;
    const Written w = write(
        [](PftraceWriter& pw) {
            Span plain;
            plain.tgid = 100, plain.tid = 101, plain.start = 10, plain.end = 20;
            plain.kind = SpanKind::Sleep, plain.name = "S", plain.state = "S";
            pw.span(plain);  // Perfetto's own, from the scheduler's events
            Span gil = plain;
            gil.name = "S(GIL)", gil.evidence = "inside take_gil (uprobe)", gil.function = "py::spin", gil.waker = 100;
            pw.span(gil);
            gil.start = 30, gil.end = 40;
            pw.span(gil);
            gil.tgid = 200;  // not asked for
            pw.span(gil);
            pw.gil_waiters(200, 0, 5, 1);
            pw.name_thread(100, 101, "worker-1");
        },
        opt);
    REQUIRE(w.events.size() == 4);
    CHECK(w.events[0].name == "S(GIL)");
    CHECK(w.events[2].name == "S(GIL)");
    CHECK(w.events[2].ts == 30);
    CHECK(w.events[0].args == std::vector<std::pair<std::string, std::string>>{
                                  {"state", "S"}, {"evidence", "inside take_gil (uprobe)"}, {"function", "py::spin"},
                                  {"waker", "100"}});
    CHECK(w.events[2].args == w.events[0].args);
    for (const auto& p : w.packets)
        for (const auto& in : fields_of(p, 12)) string_entries += fields_of(in.bytes, 29).size();
    CHECK(string_entries == 3);  // "S", the evidence, the function: once each

    std::string tree;
    for (const auto& p : w.packets)
        if (!fields_of(p, 2).empty()) tree = fields_of(p, 2)[0].bytes;
    REQUIRE(!tree.empty());
    const auto procs = fields_of(tree, 1);
    REQUIRE(procs.size() == 1);
    CHECK(field(procs[0].bytes, 1) == 100);
    CHECK(fields_of(procs[0].bytes, 3).at(0).bytes == "python3");
    const auto threads = fields_of(tree, 2);
    REQUIRE(threads.size() == 2);
    CHECK(fields_of(threads[1].bytes, 2).at(0).bytes == "worker-1");  // name_thread's
    CHECK(field(threads[1].bytes, 3) == 100);
}

// --sleep-stacks: a sleep's stack is its slice's "stack" string (the JSON
// trace's args.stack text), interned once per sequence; a plain sleep with
// a stack gets a slice of its own, without evidence; one without, none.
TEST_CASE("pftrace: sleeps' stacks, plain or labelled, as an interned stack annotation") {
    const std::string stack = R"j(["take_gil+0x12 (libpython3.12.so)","main (python3)"])j";
    const Written w = write([&](PftraceWriter& pw) {
        Span plain;
        plain.tgid = 100, plain.tid = 101, plain.start = 10, plain.end = 20;
        plain.kind = SpanKind::Sleep, plain.name = "S", plain.state = "S";
        pw.span(plain);  // no stack: Perfetto's own
        plain.stack_json = R"j(["do_select (libc.so.6)"])j";
        plain.start = 20, plain.end = 25;
        pw.span(plain);
        Span gil = plain;
        gil.name = "S(GIL)", gil.evidence = "inside take_gil (stack)", gil.stack_json = stack;
        gil.start = 30, gil.end = 40;
        pw.span(gil);
        gil.start = 50, gil.end = 60;
        pw.span(gil);
    });
    REQUIRE(w.events.size() == 6);
    CHECK(w.events[0].name == "S");
    CHECK(w.events[0].ts == 20);
    CHECK(w.events[0].args == std::vector<std::pair<std::string, std::string>>{
                                  {"state", "S"}, {"stack", R"j(["do_select (libc.so.6)"])j"}});
    CHECK(w.events[1].ts == 25);
    CHECK(w.events[2].name == "S(GIL)");
    CHECK(w.events[2].args == std::vector<std::pair<std::string, std::string>>{
                                  {"state", "S"}, {"evidence", "inside take_gil (stack)"}, {"stack", stack}});
    CHECK(w.events[4].args == w.events[2].args);
    size_t stack_entries = 0;
    for (const auto& p : w.packets)
        for (const auto& in : fields_of(p, 12))
            for (const auto& e : fields_of(in.bytes, 29)) stack_entries += fields_of(e.bytes, 2).at(0).bytes == stack;
    CHECK(stack_entries == 1);
}

// Thousands of tracks (the lookup table grows past its first size) and
// more strings on one track than its scanned list holds.
TEST_CASE("pftrace: every event on its own thread's track among thousands; strings past the scanned few interned once") {
    constexpr int kThreads = 3000, kRounds = 3, kCulprits = 40;
    const Written w = write([](PftraceWriter& pw) {
        for (int round = 0; round < kRounds; ++round)
            for (int i = 0; i < kThreads; ++i) {
                const uint64_t t = 1000 + 100 * static_cast<uint64_t>(round);
                pw.gil_span(100 + i % 7, 10000 + i, TraceSink::GilSpan::Wait, 0, t, t + 10, false);
                pw.gil_holder(100, gil_track_tid(100, 0), 10000 + i, t + 10 + i % 50, t + 11 + i % 50,
                              "culprit " + std::to_string(i % kCulprits));
            }
    });
    std::map<uint64_t, int64_t> tid_of;  // a GIL row's uuid -> its thread
    uint64_t holder_track = 0;
    for (const auto& d : w.descriptors) {
        if (!fields_of(d, 4).empty()) {
            CHECK(tid_of.count(field(d, 1)) == 0);
            tid_of[field(d, 1)] = static_cast<int64_t>(field(fields_of(d, 4)[0].bytes, 2));
        }
        if (!fields_of(d, 2).empty() && fields_of(d, 2)[0].bytes == "GIL holder") holder_track = field(d, 1);
    }
    CHECK(tid_of.size() == kThreads);
    size_t checked = 0, on_holder = 0;
    for (size_t k = 0; k < w.events.size(); ++k) {
        const Event& e = w.events[k];
        if (e.track == holder_track) {
            ++on_holder;
            if (e.type == PftraceWriter::kSliceBegin) {
                const auto tid = std::stoi(e.args.at(0).second);
                CHECK(e.name == "GIL held by " + std::to_string(tid));
                CHECK(e.args.at(1).second == "culprit " + std::to_string((tid - 10000) % kCulprits));
            }
            continue;
        }
        REQUIRE(tid_of.count(e.track) == 1);
        if (e.type == PftraceWriter::kSliceBegin) {
            // The events of thread i's wait, in order: the wait's begin and end, then the holder's two.
            CHECK(e.name == "GIL wait");
            CHECK(tid_of.at(e.track) == 10000 + static_cast<int64_t>((checked / 2) % kThreads));
        }
        ++checked;
    }
    CHECK(checked == 2 * kThreads * kRounds);
    CHECK(on_holder == 2 * kThreads * kRounds);
    size_t string_entries = 0, name_entries = 0;
    for (const auto& p : w.packets)
        for (const auto& in : fields_of(p, 12)) {
            string_entries += fields_of(in.bytes, 29).size();
            name_entries += fields_of(in.bytes, 2).size();
        }
    CHECK(string_entries == kCulprits);  // each culprit once, in the holder track's sequence
    // The fixed names in each sequence's first packet, and each holder's once.
    CHECK(name_entries == (kThreads + 1) * PftraceWriter::kEventNames.size() + kThreads);
}

TEST_CASE("pftrace: packets of a one-byte length, a longer one, and one larger than half the output buffer") {
    // Culprits of 10 bytes, 300 (a two-byte packet length: the fields are
    // moved forward) and 3 MiB (the packet made aside), each interned in
    // the packet that uses it first, and used again after.
    for (size_t size : {size_t{10}, size_t{300}, size_t{3} << 20}) {
        CAPTURE(size);
        const std::string culprit(size, 'c');
        const Written r = write([&](PftraceWriter& w) {
            w.gil_holder(100, gil_track_tid(100, 0), 101, 1000, 2000, culprit);
            w.gil_holder(100, gil_track_tid(100, 0), 101, 3000, 4000, culprit);
        });
        REQUIRE(r.events.size() == 4);
        for (size_t i : {size_t{0}, size_t{2}}) {
            CHECK(r.events[i].type == PftraceWriter::kSliceBegin);
            REQUIRE(r.events[i].args.size() == 2);
            CHECK(r.events[i].args[1].first == "culprit");
            CHECK(r.events[i].args[1].second == culprit);
        }
        CHECK(r.events[1].ts == 2000);
        CHECK(r.events[3].ts == 4000);
    }
}

TEST_CASE("pftrace: the file names that ask for it") {
    CHECK(is_pftrace_name("x.pftrace"));
    CHECK(is_pftrace_name("/a/b.perfetto-trace"));
    CHECK(is_pftrace_name("x.pftrace.gz"));
    CHECK(!is_pftrace_name("x.json"));
    CHECK(!is_pftrace_name("x.pftrace.zst"));
    CHECK(!is_pftrace_name("pftrace"));
    CHECK(!is_pftrace_name(""));
}
