// The .pftrace writer's packets, read back with the tests' protobuf reader:
// descriptors before the events on their tracks, names interned once per
// sequence, the sequence's flags, slices as begin/end pairs, counters, which
// spans it writes, --pid, and the process tree.
#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
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

struct Written {
    std::vector<std::string> packets;
    // uuid -> descriptor, and the order things appeared in.
    std::vector<std::string> descriptors, events;
};

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
    for (const auto& p : r.packets) {
        if (!fields_of(p, 60).empty()) r.descriptors.emplace_back(fields_of(p, 60)[0].bytes);
        if (!fields_of(p, 11).empty()) r.events.push_back(p);
    }
    return r;
}

}  // namespace

TEST_CASE("pftrace: SystemInfo first, then descriptors before the events on their tracks") {
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

    // Every event's track was described before it; a holder's and a
    // counter's parent is the process's track.
    std::set<uint64_t> described;
    uint64_t process_uuid = 0;
    for (const auto& p : w.packets) {
        for (const auto& d : fields_of(p, 60)) {
            described.insert(field(d.bytes, 1));
            if (!fields_of(d.bytes, 3).empty()) process_uuid = field(d.bytes, 1);
            if (!fields_of(d.bytes, 5).empty()) CHECK(field(d.bytes, 5) == process_uuid);
        }
        for (const auto& e : fields_of(p, 11)) CHECK(described.count(field(e.bytes, 11)) == 1);
    }
    std::vector<std::string> names;
    for (const auto& d : w.descriptors)
        if (!fields_of(d, 2).empty()) names.emplace_back(fields_of(d, 2)[0].bytes);
    CHECK(names == std::vector<std::string>{"GIL waiters", "GIL", "GIL holder (GIL 2)"});
    CHECK(w.descriptors.size() == 4);  // and the process's, unnamed
}

TEST_CASE("pftrace: slices are begin and end packets, names interned once, the sequence's flags") {
    const Written w = write([](PftraceWriter& pw) {
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 1000, 3000, true);
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 5000, 6000, false);
        pw.gil_span(100, 101, TraceSink::GilSpan::Wait, 0, 7000, 7000, false);  // no length: not written
        pw.gil_waiters(100, 0, 1000, 1);
    });
    REQUIRE(w.events.size() == 5);
    std::vector<uint64_t> ts, types, flags;
    size_t interned_names = 0;
    for (const auto& p : w.events) {
        ts.push_back(field(p, 8));
        types.push_back(field(fields_of(p, 11)[0].bytes, 9));
        flags.push_back(field(p, 13));
        CHECK(field(p, 10) == PftraceWriter::kSequence);
        for (const auto& in : fields_of(p, 12)) interned_names += fields_of(in.bytes, 2).size();
    }
    CHECK(ts == std::vector<uint64_t>{1000, 3000, 5000, 6000, 1000});
    CHECK(types == std::vector<uint64_t>{1, 2, 1, 2, 4});
    CHECK(flags == std::vector<uint64_t>{1, 2, 2, 2, 2});
    CHECK(interned_names == 1);  // "GIL wait", in the first packet that uses it
    const auto first = fields_of(w.events[0], 11)[0].bytes;
    CHECK(field(first, 10) == 1);  // name_iid
    const auto ann = fields_of(first, 4);
    REQUIRE(ann.size() == 1);  // cut_at_end
    CHECK(field(ann[0].bytes, 4) == 1);
    CHECK(fields_of(fields_of(w.events[1], 11)[0].bytes, 10).empty());  // an end has no name
    CHECK(field(fields_of(w.events[4], 11)[0].bytes, 30) == 1);         // counter_value
}

TEST_CASE("pftrace: only labelled sleeps of the timeline's spans, --pid, and the process tree") {
    TraceOptions opt;
    opt.pids = {100};
    const Written w = write(
        [](PftraceWriter& pw) {
            Span plain;
            plain.tgid = 100, plain.tid = 101, plain.start = 10, plain.end = 20;
            plain.kind = SpanKind::Sleep, plain.name = "S", plain.state = "S";
            pw.span(plain);  // Perfetto's own, from the scheduler's events
            Span gil = plain;
            gil.name = "S(GIL)", gil.evidence = "inside take_gil (uprobe)", gil.function = "py::spin", gil.waker = 100;
            pw.span(gil);
            gil.tgid = 200;  // not asked for
            pw.span(gil);
            pw.gil_waiters(200, 0, 5, 1);
            pw.name_thread(100, 101, "worker-1");
        },
        opt);
    REQUIRE(w.events.size() == 2);
    const auto begin = fields_of(w.events[0], 11)[0].bytes;
    std::vector<std::string> args;
    for (const auto& a : fields_of(begin, 4))
        args.emplace_back(fields_of(a.bytes, 6).empty() ? std::to_string(field(a.bytes, 4))
                                                        : std::string(fields_of(a.bytes, 6)[0].bytes));
    CHECK(args == std::vector<std::string>{"S", "inside take_gil (uprobe)", "py::spin", "100"});

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

TEST_CASE("pftrace: the file names that ask for it") {
    CHECK(is_pftrace_name("x.pftrace"));
    CHECK(is_pftrace_name("/a/b.perfetto-trace"));
    CHECK(is_pftrace_name("x.pftrace.gz"));
    CHECK(!is_pftrace_name("x.json"));
    CHECK(!is_pftrace_name("x.pftrace.zst"));
    CHECK(!is_pftrace_name("pftrace"));
    CHECK(!is_pftrace_name(""));
}
