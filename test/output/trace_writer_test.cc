// JSON string escaping, shared by the trace's events and the cached frame
// names: what the kernel and binaries hand us (comm bytes, symbol names) must
// come out as valid JSON in UTF-8 that reads back to the same text, with
// ill-formed UTF-8 replaced by U+FFFD exactly as the summary JSON
// (nlohmann's error_handler_t::replace) replaces it.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gilscan/gil/gil_probes.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/trace_writer.h"
#include "gilscan/output/utf8.h"
#include "support/perf_writer.h"

using namespace gilscan;

namespace {

// The trace file's event lines, one per line after the opening one, against
// the expected text.
void check_event_lines(const std::string& path, const std::vector<std::string>& expect) {
    std::ifstream in(path);
    std::string l;
    std::getline(in, l);
    REQUIRE(l == "{\"traceEvents\":[");
    size_t mismatches = 0, n = 0;
    for (; n < expect.size() && std::getline(in, l); ++n) {
        if (!l.empty() && l.back() == ',') l.pop_back();
        if (l != expect[n] && mismatches++ < 3) CHECK(l == expect[n]);
    }
    CHECK(n == expect.size());
    CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("append_json_string escapes what JSON needs and keeps the rest") {
    std::string out = "x";
    append_json_string(out, "plain take_gil+0x1f (libpython3.11.so)");
    CHECK(out == "x\"plain take_gil+0x1f (libpython3.11.so)\"");

    out.clear();
    const std::string raw = std::string("a\"b\\c\nd\te\rf") + '\x01' + '\x7f' + "\xc3\xa9";
    append_json_string(out, raw);
    CHECK(out == "\"a\\\"b\\\\c\\nd\\te\\rf\\u0001\x7f\xc3\xa9\"");  // é kept as UTF-8
    CHECK(nlohmann::json::parse(out).get<std::string>() == raw);

    // A Latin-1 byte alone is not UTF-8: U+FFFD, as in the summary.
    out.clear();
    append_json_string(out, "caf\xe9");
    CHECK(out == "\"caf\xef\xbf\xbd\"");

    out.clear();
    append_json_string(out, "");
    CHECK(out == "\"\"");
}

// The escaping checks strings 8 (or 4) bytes at a time: every byte value at
// every position of strings of 1-40 bytes (word boundaries, the overlapping
// last word, the 1-3 byte tail), against escaping byte by byte.
TEST_CASE("append_json_string: any byte at any position of short strings, against a byte-by-byte reference") {
    auto reference = [](std::string_view s) {
        std::string o = "\"";
        for (unsigned char ch : s) {
            char buf[8];
            switch (ch) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\t': o += "\\t"; break;
            case '\r': o += "\\r"; break;
            default:
                if (ch >= 0x80) {
                    o += "\xef\xbf\xbd";  // alone among 'a's, no byte from 0x80 up is UTF-8
                } else if (ch < 0x20) {
                    std::snprintf(buf, sizeof buf, "\\u00%02x", ch);
                    o += buf;
                } else {
                    o += static_cast<char>(ch);
                }
            }
        }
        return o + "\"";
    };
    size_t checked = 0, escaped = 0;
    for (size_t n = 1; n <= 40; ++n) {
        for (size_t at = 0; at < n; ++at) {
            for (int b = 0; b < 256; ++b) {
                // In a buffer of its own, so that reading past the string would be caught by ASan.
                std::vector<char> buf(n, 'a');
                buf[at] = static_cast<char>(b);
                const std::string_view s(buf.data(), n);
                std::string out;
                append_json_string(out, s);
                const std::string want = reference(s);
                if (out != want) {
                    FAIL_CHECK("length " << n << ", byte " << b << " at " << at << ": " << out << " != " << want);
                    return;
                }
                ++checked;
                escaped += out.size() != n + 2;
            }
        }
    }
    CHECK(checked == 40 * 41 / 2 * 256);
    CHECK(escaped == 40 * 41 / 2 * (256 - 94));  // all but 0x20-0x7f, less the quote and the backslash
}

// What the kernel hands over: a comm is cut at 15 bytes, in a character
// if it must; thread and function names may be any script.
TEST_CASE("append_json_string: UTF-8 names kept, a comm cut inside a character ends in U+FFFD") {
    const std::string name = "ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xe7\xba\xbf";  // ab数据处理线
    std::string out;
    append_json_string(out, name);
    CHECK(out == "\"" + name + "\"");
    CHECK(nlohmann::json::parse(out).get<std::string>() == name);
    out.clear();
    append_json_string(out, name.substr(0, 15));  // the kernel's TASK_COMM_LEN - 1
    CHECK(out == "\"ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xef\xbf\xbd\"");
    out.clear();
    append_json_string(out, name.substr(0, 16));  // two bytes of the last character: one U+FFFD
    CHECK(out == "\"ab\xe6\x95\xb0\xe6\x8d\xae\xe5\xa4\x84\xe7\x90\x86\xef\xbf\xbd\"");
    // 4-byte characters, and what is not UTF-8 though it looks close: an
    // overlong '/', a surrogate (CESU-8), above U+10FFFF.
    out.clear();
    append_json_string(out, "\xf0\x9f\x90\x8d py");
    CHECK(out == "\"\xf0\x9f\x90\x8d py\"");
    for (const char* bad : {"\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
        CAPTURE(bad);
        out.clear();
        append_json_string(out, bad);
        CHECK(nlohmann::json::parse(out).get<std::string>().find("\xef\xbf\xbd") == 0);
    }
}

// The trace and the summary must show the same name for the same bytes:
// every string over an alphabet of UTF-8's edge bytes (lead bytes of each
// length, the limits of each second-byte range, never-valid bytes) up to 4
// bytes long, and random longer ones, against nlohmann's replace.
TEST_CASE("append_json_string and valid_utf8 replace ill-formed UTF-8 exactly as nlohmann's replace does") {
    const std::vector<unsigned char> abc = {'A', '"', 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
                                            0xdf, 0xe0, 0xe1, 0xed, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff};
    auto check = [&](const std::string& s) {
        const std::string want = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        std::string out;
        append_json_string(out, s);
        const std::string plain = valid_utf8(s);
        const bool same = out == want && nlohmann::json(plain).dump() == want;
        if (!same) {
            std::string hex;
            for (unsigned char c : s) hex += std::to_string(c) + " ";
            FAIL_CHECK("bytes " << hex << ": " << out << " != " << want);
        }
        return same;
    };
    size_t n = 0;
    std::vector<size_t> idx;
    for (size_t len = 1; len <= 4; ++len) {
        idx.assign(len, 0);
        for (;;) {
            std::string s;
            for (size_t k : idx) s += static_cast<char>(abc[k]);
            if (!check(s)) return;
            ++n;
            size_t k = 0;
            while (k < len && ++idx[k] == abc.size()) idx[k++] = 0;
            if (k == len) break;
        }
    }
    CHECK(n == 21 + 21 * 21 + 21 * 21 * 21 + 21 * 21 * 21 * 21);
    uint64_t x = 12345;
    for (int i = 0; i < 20000; ++i) {
        std::string s;
        const size_t len = 5 + (x >> 33) % 28;
        for (size_t k = 0; k < len; ++k) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            s += static_cast<char>(abc[(x >> 33) % abc.size()]);
        }
        if (!check(s)) return;
    }
}

TEST_CASE("TraceWriter: cached track and timestamp text matches plain formatting, event by event") {
    // Tracks colliding in the caches (more tids than slots, pids sharing a
    // slot), negative ids, timestamps crossing the cached digits' 10 ms
    // boundary, below 10 ms and past 2^32 microseconds.
    test::TempDir dir("gilscan-trace-writer");
    const std::string path = (dir.path / "t.json").string();
    std::vector<std::string> expect;
    {
        OutputFile out(path, false);
        TraceWriter tw(out, {});
        uint64_t seed = 42;
        auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
        uint64_t ts = 0;
        char line[256];
        for (int i = 0; i < 20000; ++i) {
            const int32_t pid = i % 97 == 0 ? -1 : static_cast<int32_t>(2000000 + rnd() % 3000);
            const int32_t tid = i % 89 == 0 ? -1 : static_cast<int32_t>(2000000 + rnd() % 5000);
            ts = i == 10000 ? (uint64_t{5} << 32) * 1000 : ts + rnd() % 3'000'000;  // up to 3 ms apart
            const uint64_t dur = rnd() % 100'000'000;
            const auto us = [](uint64_t ns) {
                char b[40];
                std::snprintf(b, sizeof b, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                              static_cast<unsigned long long>(ns % 1000));
                return std::string(b);
            };
            if (i % 3 == 0) {
                tw.gil_waiters(pid, 0, ts, 1);
                std::snprintf(line, sizeof line, "{\"ph\":\"C\",\"name\":\"GIL waiters\",\"pid\":%d,\"ts\":%s,\"args\":{\"waiting\":1}}",
                              pid, us(ts).c_str());
            } else if (i % 3 == 1) {
                tw.gil_span(pid, tid, TraceSink::GilSpan::Wait, 0, ts, ts + dur, false);
                std::snprintf(line, sizeof line, "{\"ph\":\"X\",\"cat\":\"GIL state\",\"name\":\"GIL wait\",\"cname\":\"terrible\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s}",
                              pid, gil_row_tid(tid), us(ts).c_str(), us(dur).c_str());
            } else {
                Span s;
                s.tgid = pid;
                s.tid = tid;
                s.start = ts;
                s.end = ts + dur;
                s.kind = SpanKind::Sleep;
                s.name = "S";
                s.state = "S";
                tw.span(s);
                std::snprintf(line, sizeof line, "{\"ph\":\"X\",\"cat\":\"process state\",\"name\":\"S\",\"cname\":\"thread_state_sleeping\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s,\"args\":{\"state\":\"S\"}}",
                              pid, tid, us(ts).c_str(), us(dur).c_str());
            }
            if (i % 3 != 0 && dur == 0) continue;  // a span of no length is not written
            expect.push_back(line);
        }
        tw.finish({}, {});
        out.commit();
    }
    check_event_lines(path, expect);
}

TEST_CASE("TraceWriter: the GIL tracker's typed events, line by line against printf") {
    // Each typed event against its line formatted independently: through the
    // track and timestamp caches, negative and extreme ids, zero and reversed
    // intervals, with a --pid filter too.
    for (const bool filtered : {false, true}) {
        test::TempDir dir("gilscan-trace-writer-gil");
        const std::string path = (dir.path / "typed.json").string();
        TraceOptions opt;
        if (filtered) opt.pids = {7, -1, 2147483647};
        std::vector<std::string> expect;
        {
            OutputFile out(path, false);
            TraceWriter tw(out, opt);
            uint64_t seed = 5;
            auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
            const int32_t ids[] = {7, 8, -1, 0, 1, 2147483647, -2147483647 - 1, 4194303, 123456};
            const auto us = [](uint64_t ns) {
                char b[40];
                std::snprintf(b, sizeof b, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                              static_cast<unsigned long long>(ns % 1000));
                return std::string(b);
            };
            uint64_t ts = 999'999;
            char line[320];
            for (int i = 0; i < 30000; ++i) {
                const int32_t pid = ids[rnd() % 9], tid = ids[rnd() % 9];
                ts = i == 15000 ? ~uint64_t{0} / 4 : ts + rnd() % 4'000'000;
                const uint64_t end = rnd() % 17 == 0 ? ts - rnd() % 1000 : ts + rnd() % 50'000'000;  // reversed: dur 0
                const std::string interval = ",\"ts\":" + us(ts) + ",\"dur\":" + us(end >= ts ? end - ts : 0);
                switch (rnd() % 4) {
                case 0:
                case 1: {
                    const bool wait = rnd() % 2, cut = rnd() % 5 == 0;
                    // The process's GIL: the first (no argument) or a later one, numbered from 1.
                    const uint32_t gil = end % 4 == 0 ? static_cast<uint32_t>(end / 4 % 300) : 0;
                    tw.gil_span(pid, tid, wait ? TraceSink::GilSpan::Wait : TraceSink::GilSpan::Lock, gil, ts, end, cut);
                    std::string args;
                    if (gil) args = ",\"args\":{\"gil\":" + std::to_string(gil + 1) + (cut ? ",\"cut_at_end\":true}" : "}");
                    else if (cut) args = ",\"args\":{\"cut_at_end\":true}";
                    std::snprintf(line, sizeof line, "{\"ph\":\"X\",\"cat\":\"GIL state\",\"name\":\"%s\",\"cname\":\"%s\",\"pid\":%d,\"tid\":%d%s%s}",
                                  wait ? "GIL wait" : "LOCK", wait ? "terrible" : "good", pid, gil_row_tid(tid),
                                  interval.c_str(), args.c_str());
                    if (end <= ts) continue;  // no length: not written
                    break;
                }
                case 2: {
                    const int32_t holder = ids[rnd() % 9];
                    tw.gil_holder(pid, tid, holder, ts, end, {});
                    std::snprintf(line, sizeof line,
                                  "{\"ph\":\"X\",\"cat\":\"GIL holder\",\"cname\":\"good\",\"name\":\"GIL held by %d\",\"pid\":%d,\"tid\":%d%s,\"args\":{\"holder\":%d}}",
                                  holder, pid, tid, interval.c_str(), holder);
                    if (end <= ts) continue;  // no length: not written
                    break;
                }
                default: {
                    const uint32_t waiting = rnd() % 3 == 0 ? ~0u - static_cast<uint32_t>(rnd() % 3) : static_cast<uint32_t>(rnd() % 40);
                    const uint32_t gil = rnd() % 4 == 0 ? static_cast<uint32_t>(rnd() % 12) : 0;
                    tw.gil_waiters(pid, gil, ts, waiting);
                    const std::string name = gil ? "GIL waiters (GIL " + std::to_string(gil + 1) + ")" : "GIL waiters";
                    std::snprintf(line, sizeof line, "{\"ph\":\"C\",\"name\":\"%s\",\"pid\":%d,\"ts\":%s,\"args\":{\"waiting\":%u}}",
                                  name.c_str(), pid, us(ts).c_str(), waiting);
                    break;
                }
                }
                if (opt.pids.empty() || opt.pids.count(pid)) expect.push_back(line);
            }
            CHECK(tw.events_written() == expect.size());
            tw.finish({}, {});
            out.commit();
        }
        check_event_lines(path, expect);
        CHECK(expect.size() > (filtered ? 5000u : 28000u));  // of 30000: the reversed spans are left out
        const std::string text = test::slurp(path);
        CHECK(text.find("GIL held by -2147483648") != std::string::npos);
        CHECK(text.find("\"waiting\":4294967295}") != std::string::npos);
    }
}

TEST_CASE("TraceWriter: a GIL wait's function goes in args after its evidence, escaped, and only when it has one") {
    // --gil-functions puts the Python function (a perf map's name: any bytes
    // a JIT wrote) on S(GIL) spans; every other span's args are unchanged.
    test::TempDir dir("gilscan-trace-function");
    const std::string path = (dir.path / "t.json").string();
    const std::string odd = "py::f\"q\\:/a b/\x01\xe9.py";
    {
        OutputFile out(path, false);
        TraceWriter tw(out, {});
        Span s;
        s.tgid = 7;
        s.tid = 8;
        s.start = 1'000'000;
        s.end = 1'500'500;
        s.kind = SpanKind::Sleep;
        s.name = "S(GIL)";
        s.state = "S";
        s.cpu = 3;
        s.waker = 9;
        s.evidence = "take_gil+0x2a (libpython3.12.so)";
        s.function = "py::spin:/app/work.py";
        s.stack_json = R"j(["take_gil+0x2a (libpython3.12.so)"])j";
        s.cut_at_end = true;
        s.woken_before_switch = true;
        tw.span(s);
        s.function = odd;
        s.stack_json = {};
        s.cut_at_end = s.woken_before_switch = false;
        tw.span(s);
        // The longest fixed text with the longest numbers and a function:
        // within the room the writer asked for (a sanitizer build would see
        // a write past it).
        s.tgid = s.tid = s.waker = INT32_MIN;
        s.cpu = 4'000'000'000u;
        s.start = 0;
        s.end = UINT64_MAX;
        s.cut_at_end = s.woken_before_switch = true;
        s.function = "x";
        tw.span(s);
        s.function = {};
        tw.span(s);
        tw.finish({}, {});
        out.commit();
    }
    check_event_lines(path, {
        R"j({"ph":"X","cat":"process state","name":"S(GIL)","cname":"terrible","pid":7,"tid":8,"ts":1000.000,"dur":500.500,"args":{"state":"S","cpu":3,"waker":9,"evidence":"take_gil+0x2a (libpython3.12.so)","function":"py::spin:/app/work.py","stack":["take_gil+0x2a (libpython3.12.so)"],"cut_at_end":true,"woken_before_switch_out":true}})j",
        R"j({"ph":"X","cat":"process state","name":"S(GIL)","cname":"terrible","pid":7,"tid":8,"ts":1000.000,"dur":500.500,"args":{"state":"S","cpu":3,"waker":9,"evidence":"take_gil+0x2a (libpython3.12.so)","function":"py::f\"q\\:/a b/\u0001)j" "\xef\xbf\xbd" R"j(.py"}})j",
    });
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in);
    const auto& ev = j["traceEvents"];
    REQUIRE(ev.size() >= 4);
    CHECK(ev[1]["args"]["function"] == "py::f\"q\\:/a b/\x01\xef\xbf\xbd.py");
    CHECK(ev[2]["args"]["function"] == "x");
    CHECK(ev[2]["args"]["cut_at_end"] == true);
    CHECK_FALSE(ev[3]["args"].contains("function"));
}

namespace {

// The metadata events of a trace written for threads (pid 7: Python, main
// thread 7 with a GIL row and thread 8; pid 20: not Python) and one span of
// thread 8, with or without TraceOptions::viztracer.
struct Rows {
    nlohmann::json spans = nlohmann::json::array();
    std::map<std::pair<int, int>, std::string> names;  // (pid, tid) -> thread_name
    std::map<int, std::string> processes;              // pid -> process_name
    std::map<std::pair<int, int>, int> sort;           // (pid, tid) -> thread_sort_index
};

Rows rows_of(bool viztracer) {
    test::TempDir dir("gilscan-trace-viztracer");
    const std::string path = (dir.path / "t.json").string();
    std::vector<ThreadStats> ts(3);
    ts[0].tid = ts[0].tgid = 7;
    ts[1].tid = 8;
    ts[1].tgid = 7;
    ts[2].tid = ts[2].tgid = 20;
    ts[0].comm = ts[1].comm = "python3";
    ts[2].comm = "sh";
    std::vector<const ThreadStats*> threads;
    for (auto& t : ts) {
        t.monitored = true;
        threads.push_back(&t);
    }
    TraceMeta meta;
    meta.python_pids = {7};
    meta.gil_rows = {{7, 7}};
    {
        OutputFile out(path, false);
        TraceOptions opt;
        opt.viztracer = viztracer;
        TraceWriter tw(out, opt);
        Span s;
        s.tgid = 7;
        s.tid = 8;
        s.start = 1'000;
        s.end = 2'000;
        s.kind = SpanKind::Sleep;
        s.name = s.state = "S";
        tw.span(s);
        tw.finish(threads, meta);
        out.commit();
    }
    std::ifstream in(path);
    const nlohmann::json trace = nlohmann::json::parse(in);
    Rows r;
    for (const auto& e : trace["traceEvents"]) {
        const std::pair<int, int> row{e["pid"].get<int>(), e["tid"].get<int>()};
        if (e["ph"] == "X") r.spans.push_back(e);
        else if (e["name"] == "thread_name") r.names[row] = e["args"]["name"];
        else if (e["name"] == "process_name") r.processes[row.first] = e["args"]["name"];
        else if (e["name"] == "thread_sort_index") r.sort[row] = e["args"]["sort_index"];
    }
    return r;
}

}  // namespace

TEST_CASE("TraceWriter --viztracer: states on rows of their own, no name on the rows VizTracer names") {
    const Rows plain = rows_of(false);
    REQUIRE(plain.spans.size() == 1);
    CHECK(plain.spans[0]["tid"] == 8);
    CHECK(plain.names.at({7, 7}) == "python3 7");
    CHECK(plain.names.at({7, 8}) == "python3 8");
    CHECK(plain.processes.at(7) == "python3");
    CHECK(plain.sort.at({7, 7}) == 0);
    CHECK(plain.sort.at({7, gil_row_tid(7)}) == 1);
    CHECK(plain.sort.at({7, 8}) == 2);

    const Rows viz = rows_of(true);
    REQUIRE(viz.spans.size() == 1);
    CHECK(viz.spans[0]["tid"] == state_row_tid(8));
    CHECK(state_row_tid(8) > (1 << 22));  // above any tid Linux gives
    CHECK(state_row_tid(8) < gil_row_tid(0));
    // The Python process and its threads' own rows: VizTracer's names.
    CHECK_FALSE(viz.processes.count(7));
    CHECK_FALSE(viz.names.count({7, 7}));
    CHECK_FALSE(viz.names.count({7, 8}));
    CHECK(viz.names.at({7, state_row_tid(7)}) == "state \xC2\xB7 python3 7");
    CHECK(viz.names.at({7, state_row_tid(8)}) == "state \xC2\xB7 python3 8");
    CHECK(viz.names.at({7, gil_row_tid(7)}) == "GIL \xC2\xB7 python3 7");
    // Each thread's own row, its state row, its GIL row, in that order.
    CHECK(viz.sort.at({7, 7}) == 0);
    CHECK(viz.sort.at({7, state_row_tid(7)}) == 1);
    CHECK(viz.sort.at({7, gil_row_tid(7)}) == 2);
    CHECK(viz.sort.at({7, 8}) == 3);
    CHECK(viz.sort.at({7, state_row_tid(8)}) == 4);
    // Not Python: VizTracer never names it, gilscan does.
    CHECK(viz.processes.at(20) == "sh");
    CHECK_FALSE(viz.names.count({20, 20}));
    CHECK(viz.names.at({20, state_row_tid(20)}) == "state \xC2\xB7 sh 20");
}
