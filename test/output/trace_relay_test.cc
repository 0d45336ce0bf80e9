// TraceRelay: events handed over as bytes and formatted later, by another
// thread (format_some) or by the stages' own (queue full, close): the trace
// must be byte for byte what the TraceWriter writes directly, whoever
// formats which block, and an error while formatting must reach the stages.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>


#include "gilscan/error.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/pftrace_writer.h"
#include "gilscan/output/trace_relay.h"
#include "gilscan/output/trace_writer.h"
#include "support/perf_writer.h"

using namespace gilscan;
using gilscan::test::slurp;

namespace {

// A deterministic mix of everything the stages hand over: spans of every
// kind and flag, strings that need escaping, an evidence text and a stack
// larger than a whole block, GIL wait/hold spans (cut or not), holder spans,
// waiter counters, track names of every length up to 40; pids inside and outside a
// --pid filter.
void emit(TraceSink& sink, int n, uint64_t seed = 7) {
    auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
    const std::string huge_stack = "[" + std::string(TraceRelay::kBlock + 1000, 'f') + "]";
    const std::string odd = "a\"b\\c\nd\x01\xe9";
    // A classifier's kept stack texts (Span::stack_stable): the relay hands
    // on their address. Alive until the trace is written.
    static const std::string kept[] = {"[\"take_gil+0x2a (libpython3.11.so)\",\"[kernel]\"]",
                                       "[" + std::string(3000, 'k') + "]", ""};
    const SpanKind kinds[] = {SpanKind::Running, SpanKind::Runnable, SpanKind::Sleep,
                              SpanKind::DiskSleep, SpanKind::Other, SpanKind::Unknown};
    const char* names[] = {"R", "R+", "S", "D", "other", "unknown"};
    uint64_t ts = 1'000'000;
    for (int i = 0; i < n; ++i) {
        const int32_t pid = 100 + static_cast<int32_t>(rnd() % 4);
        const int32_t tid = pid * 10 + static_cast<int32_t>(rnd() % 7);
        ts += rnd() % 50'000;
        const uint64_t dur = rnd() % 2'000'000;
        switch (rnd() % 6) {
        case 0:
        case 1: {
            Span s;
            const unsigned k = static_cast<unsigned>(rnd() % 6);
            s.tgid = pid;
            s.tid = tid;
            s.start = ts;
            s.end = ts + dur;
            s.kind = kinds[k];
            s.name = k == 2 && rnd() % 2 ? "S(GIL)" : names[k];
            s.state = k == 2 ? "S" : "R+";
            s.waker = rnd() % 3 ? static_cast<int32_t>(tid + 1) : -1;
            s.cpu = rnd() % 4 ? static_cast<uint32_t>(rnd() % 64) : ~0u;
            s.cut_at_end = rnd() % 11 == 0;
            s.woken_before_switch = rnd() % 13 == 0;
            s.preempted = rnd() % 2;
            if (rnd() % 9 == 0) {
                s.evidence = odd;
                // A GIL wait's function (--gil-functions): only beside evidence.
                if (rnd() % 2) s.function = rnd() % 2 ? std::string_view(odd) : std::string_view("py::spin:/app/work.py");
            }
            if (i == n / 2) {
                s.stack_json = huge_stack;
            } else if (rnd() % 4 == 0) {
                s.stack_json = kept[rnd() % 3];
                s.stack_stable = true;
            }
            sink.span(s);
            break;
        }
        // The GIL tracker's events.
        case 2:
            sink.gil_span(pid, tid, rnd() % 2 ? TraceSink::GilSpan::Wait : TraceSink::GilSpan::Lock,
                          static_cast<uint32_t>(dur % 3), ts, ts + dur,
                          rnd() % 4 == 0);
            break;
        case 3: {
            // GIL blame's culprit: none, a plain name, or one to escape.
            const uint32_t c = static_cast<uint32_t>(rnd() % 3);
            sink.gil_holder(pid, pid + 0x40000000, tid, ts, ts + dur,
                            c == 0 ? std::string_view() : c == 1 ? std::string_view("hog (app.py)") : std::string_view(odd));
            break;
        }
        case 4: sink.gil_waiters(pid, static_cast<uint32_t>(ts % 3), ts, static_cast<uint32_t>(rnd() % 9)); break;
        default: {
            // Names of every length from 0 to 40 (the relay copies short strings its own way).
            static const std::string alphabet = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH";
            const std::string name = rnd() % 2 ? alphabet.substr(rnd() % 4, rnd() % 41) : "worker";
            sink.name_thread(pid, tid, rnd() % 5 ? name : odd);
            break;
        }
        }
    }
}

// The scheduler's events as a timeline hands them to its tap: switches
// (most from the CPU's current task, as Perfetto infers them, some not) and
// wake-ups of the three kinds, switch-in records, on 8 CPUs and without a
// CPU; comms of every length up to 16.
void emit_sched(SchedTap& tap, int n, uint64_t seed) {
    auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
    static const std::string comms = "python3.11-workr";
    int32_t current[8] = {};
    uint64_t ts = 5'000'000;
    for (int i = 0; i < n; ++i) {
        ts += rnd() % 20'000;
        const uint32_t cpu = rnd() % 16 ? static_cast<uint32_t>(rnd() % 8) : PftraceSched::kNoCpu;
        int32_t& cur = current[cpu % 8];
        const auto tid = static_cast<int32_t>(200 + rnd() % 12);
        const std::string_view comm(comms.data(), rnd() % 17);
        if (rnd() % 8 == 0) {
            tap.switch_in(cpu, ts, tid, static_cast<int32_t>(100 + rnd() % 40), comm);
            if (cpu != PftraceSched::kNoCpu) cur = tid;
        } else if (rnd() % 2) {
            SchedSwitch sw;
            sw.prev_pid = rnd() % 4 ? cur : tid;
            sw.next_pid = static_cast<int32_t>(200 + rnd() % 12);
            sw.prev_prio = 120, sw.next_prio = static_cast<int32_t>(100 + rnd() % 40);
            sw.prev_state = static_cast<int64_t>(rnd() % 3);
            sw.prev_comm = comm, sw.next_comm = std::string_view(comms).substr(0, rnd() % 17);
            tap.sched_switch(cpu, ts, sw.prev_pid, sw);
            cur = sw.next_pid;
        } else {
            const TpKind kinds[] = {TpKind::SchedWaking, TpKind::SchedWakeup, TpKind::SchedWakeupNew};
            SchedWake w;
            w.pid = tid, w.target_cpu = static_cast<int32_t>(rnd() % 8), w.prio = 120, w.comm = comm;
            tap.sched_wake(cpu, ts, rnd() % 3 ? cur : tid, kinds[rnd() % 3], w);
        }
    }
}

// The trace's metadata, as a recording's.
TraceMeta test_meta() {
    TraceMeta m;
    m.source_file = "src.data";
    m.clock = "CLOCK_MONOTONIC";
    m.hostname = "host";
    m.cmdline = "perf record";
    return m;
}

enum class Mode { Direct, Relay, RelayWithHelper };

// The trace file's bytes, written one way or the other.
std::string trace(Mode mode, const TraceOptions& opt, int n, uint64_t* by_others = nullptr) {
    test::TempDir dir("gilscan-relay");
    const std::string path = (dir.path / "t.json").string();
    {
        OutputFile out(path);
        TraceWriter tw(out, opt);
        if (mode == Mode::Direct) {
            emit(tw, n / 2);
            emit(tw, n - n / 2, 99);
        } else {
            TraceRelay relay(tw);
            std::atomic<bool> stop{false};
            std::thread helper;
            if (mode == Mode::RelayWithHelper)
                helper = std::thread([&] {
                    while (!stop.load()) {
                        if (!relay.format_some()) std::this_thread::yield();
                    }
                });
            emit(relay, n / 2);
            // Let the helper take a block or two before the rest comes (on a
            // loaded machine it may not have run at all yet).
            for (int w = 0; w < 60000 && mode == Mode::RelayWithHelper && relay.blocks_formatted_by_others() == 0; ++w)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            emit(relay, n - n / 2, 99);
            stop = true;
            if (helper.joinable()) helper.join();
            relay.close();
            if (by_others) *by_others = relay.blocks_formatted_by_others();
            if (mode == Mode::Relay) {
                CHECK(relay.blocks_formatted_by_others() == 0);
                // Without a filter there are more blocks than may queue: the
                // stages formatted the oldest whenever the queue was full.
                CHECK(relay.blocks_formatted_by_producer() > (opt.pids.empty() ? TraceRelay::kMaxQueued : 0));
            }
            // Some 30 blocks' worth went through at most kMaxQueued + 3 blocks
            // at a time (queued, being filled, one spare): two slabs of 16.
            CHECK(relay.slabs_used() >= 1);
            CHECK(relay.slabs_used() <= 2);
        }
        tw.finish({}, test_meta());
        out.commit();
    }
    return slurp(path);
}

}  // namespace

TEST_CASE("TraceRelay: the trace is byte for byte the TraceWriter's, whoever formats the blocks") {
    TraceOptions all, running, some;
    running.running = true;
    some.pids = {101, 103};
    some.runnable = false;
    for (const TraceOptions* opt : {&all, &running, &some}) {
        CAPTURE(opt->running);
        CAPTURE(opt->pids.size());
        const int n = 60000;  // some 30 blocks
        const std::string direct = trace(Mode::Direct, *opt, n);
        REQUIRE(direct.size() > 4 * TraceRelay::kBlock);
        CHECK(direct.find("S(GIL)") != std::string::npos);
        CHECK(direct.find(R"("function":"py::spin:/app/work.py")") != std::string::npos);
        const std::string relayed = trace(Mode::Relay, *opt, n);
        CHECK(relayed.size() == direct.size());
        CHECK(relayed == direct);
        uint64_t by_others = 0;
        const std::string helped = trace(Mode::RelayWithHelper, *opt, n, &by_others);
        CHECK(by_others > 0);
        CHECK(helped == direct);
    }
}

namespace {

// A .pftrace's bytes: the GIL tracker's and the timeline's events and the
// scheduler's, interleaved, written by the PftraceWriter directly or through
// a relay with a thread of its own (by_others: the blocks that thread
// formatted, when relayed).
std::string pftrace(bool relayed, uint64_t* by_others) {
    test::TempDir dir("gilscan-relay-pf");
    const std::string path = (dir.path / "t.pftrace").string();
    const PftraceSystem sys{"6.1.0-13-amd64", "x86_64", 8};
    {
        OutputFile out(path);
        PftraceWriter pw(out, {}, sys);
        auto feed = [](auto& sink) {
            for (uint64_t i = 0; i < 40; ++i) {
                emit(sink, 1500, 7 + i);
                emit_sched(sink, 3000, 11 + i);
            }
        };
        if (!relayed) {
            feed(pw);
        } else {
            TraceRelay relay(pw, pw.filter(), &pw);
            CHECK_FALSE(relay.wants_plain_spans());  // the writer's answer
            relay.start_thread();
            feed(relay);
            relay.close();
            if (by_others) *by_others = relay.blocks_formatted_by_others();
        }
        CHECK(pw.sched().compact_events() > 0);
        CHECK(pw.sched().full_events() > 0);
        CHECK(pw.sched().switch_ins() > 0);
        pw.finish({}, sys);
        out.commit();
    }
    return slurp(path);
}

}  // namespace

TEST_CASE("TraceRelay with a thread of its own: a .pftrace byte for byte the PftraceWriter's, scheduler events included") {
    const std::string direct = pftrace(false, nullptr);
    REQUIRE(direct.size() > 8 * TraceRelay::kBlock);
    uint64_t by_thread = 0;
    const std::string relayed = pftrace(true, &by_thread);
    CHECK(by_thread > 0);
    CHECK(relayed.size() == direct.size());
    CHECK(relayed == direct);
}

TEST_CASE("TraceRelay: a kept stack text travels by its address, not its bytes") {
    test::TempDir dir("gilscan-relay-ref");
    const std::string path = (dir.path / "t.json").string();
    const std::string stack = "[\"" + std::string(20000, 's') + "\"]";  // 20 kB: a deep stack
    const int n = 1000;                                                   // 20 MB (160 blocks) if copied
    uint64_t blocks = 0;
    {
        OutputFile out(path);
        TraceWriter tw(out, {});
        TraceRelay relay(tw);
        for (int i = 0; i < n; ++i) {
            Span s;
            s.tgid = 1;
            s.tid = 2;
            s.start = 1000u + 10u * static_cast<unsigned>(i);
            s.end = s.start + 5;
            s.kind = SpanKind::Sleep;
            s.name = "S(GIL)";
            s.state = "S";
            s.stack_json = stack;
            s.stack_stable = true;
            relay.span(s);
        }
        relay.close();
        blocks = relay.blocks_formatted_by_producer();
        tw.finish({}, {});
        out.commit();
    }
    CHECK(blocks <= 2);  // the spans' own fields: tens of bytes each
    const std::string text = slurp(path);
    size_t found = 0;
    for (size_t at = text.find(stack); at != std::string::npos; at = text.find(stack, at + stack.size())) ++found;
    CHECK(found == static_cast<size_t>(n));
}

TEST_CASE("TraceRelay: a write that fails while another thread formats is an error on the stages' thread") {
    // RLIMIT_FSIZE: writes past 6 MiB fail with EFBIG (SIGXFSZ ignored so
    // that they return). The OutputFile's writer thread fails, the next
    // buffer handed to it (by whoever formats) throws, and the relay passes
    // that on at the next block or at close().
    test::TempDir dir("gilscan-relay-err");
    const std::string path = (dir.path / "t.json").string();
    bool with_helper = false, own_thread = false;
    SUBCASE("formatted by the stages' thread") {}
    SUBCASE("formatted by another thread") { with_helper = true; }
    SUBCASE("formatted by the relay's own thread") { own_thread = true; }
    std::optional<test::FileSizeLimit> limit(6u << 20);
    std::string error;
    bool from_relay = false;
    try {
        OutputFile out(path);
        TraceWriter tw(out, {});
        TraceRelay relay(tw);
        if (own_thread) relay.start_thread();
        std::atomic<bool> stop{false};
        std::thread helper;
        if (with_helper)
            helper = std::thread([&] {
                while (!stop.load()) {
                    if (!relay.format_some()) std::this_thread::yield();
                }
            });
        try {
            emit(relay, 400000);  // some 50 MB of JSON
            relay.close();
        } catch (const Error&) {
            from_relay = true;  // not only from commit() later
            stop = true;
            if (helper.joinable()) helper.join();
            throw;
        }
        stop = true;
        if (helper.joinable()) helper.join();
        tw.finish({}, {});
        out.commit();
    } catch (const Error& e) {
        error = e.what();
    }
    limit.reset();
    CHECK(error.find("write failed") != std::string::npos);
    CHECK(from_relay);
    // No trace, not even the temporary.
    CHECK(std::filesystem::is_empty(dir.path));
}

TEST_CASE("TraceRelay: blocks are pieces of 2 MiB slabs, reused; a block resized past kBlock gives its piece back") {
    constexpr size_t kSlab = 2u << 20;
    constexpr size_t kPerSlab = kSlab / TraceRelay::kBlock;
    TraceRelay::Slabs slabs;
    CHECK(slabs.slabs() == 0);
    std::vector<uint8_t*> got;
    for (size_t i = 0; i < kPerSlab; ++i) got.push_back(slabs.take());
    CHECK(slabs.slabs() == 1);
    const uintptr_t base = reinterpret_cast<uintptr_t>(*std::min_element(got.begin(), got.end()));
    CHECK(base % kSlab == 0);
    std::sort(got.begin(), got.end());
    for (size_t i = 0; i < got.size(); ++i) CHECK(reinterpret_cast<uintptr_t>(got[i]) == base + i * TraceRelay::kBlock);
    uint8_t* more = slabs.take();  // the first slab is used up
    CHECK(slabs.slabs() == 2);
    CHECK((reinterpret_cast<uintptr_t>(more) < base || reinterpret_cast<uintptr_t>(more) >= base + kSlab));
    slabs.give(got[5]);
    CHECK(slabs.take() == got[5]);  // reused, no third slab
    CHECK(slabs.slabs() == 2);

    TraceRelay::Slabs own;
    TraceRelay::Block b{TraceRelay::SlabAllocator<uint8_t>(&own)};
    b.resize(TraceRelay::kBlock);
    uint8_t* piece = b.data();
    CHECK(own.slabs() == 1);
    b.resize(TraceRelay::kBlock + 1);  // one event larger than a block: an allocation of its own
    CHECK(b.data() != piece);
    CHECK(own.take() == piece);
    CHECK(own.slabs() == 1);
}

// The layout that keeps the two threads off each other's cache lines (see
// TraceFilter in trace_writer.h): not timed here, but held in place.
TEST_CASE("TraceRelay: the writer and the relay take whole cache lines, and the relay filters by its own copy") {
    static_assert(alignof(TraceWriter) >= 128 && sizeof(TraceWriter) % 128 == 0);
    static_assert(alignof(TraceRelay) >= 128 && sizeof(TraceRelay) % 128 == 0);
    test::TempDir dir;
    OutputFile out((dir.path / "t.json").string(), false);
    TraceOptions opt;
    opt.pids = {7};
    auto writer = std::make_unique<TraceWriter>(out, opt);
    auto relay = std::make_unique<TraceRelay>(*writer);
    CHECK(reinterpret_cast<uintptr_t>(writer.get()) % 128 == 0);
    CHECK(reinterpret_cast<uintptr_t>(relay.get()) % 128 == 0);
    // Filtering goes by the relay's copy: an event of another pid is not handed over.
    relay->gil_waiters(8, 0, 1000, 1);
    relay->gil_waiters(7, 0, 2000, 2);
    relay->close();
    CHECK(writer->events_written() == 1);
    writer->finish({}, test_meta());
    out.commit();
}
