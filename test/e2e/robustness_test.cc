// Damaged inputs: every one yields correct partial results with a warning or
// a one-line gilscan::Error — never a crash, a hang or an unbounded allocation
// (the ASan/UBSan build runs these too).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <zstd.h>

#include "gilscan/perfdata/header.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Offsets of the record boundaries of a pipe-mode file (after the 16-byte header).
std::vector<size_t> pipe_boundaries(const std::vector<uint8_t>& b) {
    std::vector<size_t> out;
    size_t pos = 16;
    while (pos + 8 <= b.size()) {
        out.push_back(pos);
        uint32_t type = load<uint32_t>(b.data() + pos, false);
        uint16_t size = load<uint16_t>(b.data() + pos + 6, false);
        size_t next = pos + size;
        if (type == PERF_RECORD_HEADER_TRACING_DATA) next += load<uint32_t>(b.data() + pos + 8, false);
        if (size < 8) break;
        pos = next;
    }
    return out;
}

// A pipe-mode recording with `from` replaced by `to` inside its tracing data:
// the format file's length and the record's payload length follow.
std::vector<uint8_t> with_format_text(const std::vector<uint8_t>& b, const std::string& from, const std::string& to) {
    std::vector<uint8_t> out = b;
    auto at = std::search(out.begin(), out.end(), from.begin(), from.end());
    REQUIRE(at != out.end());
    const size_t i = static_cast<size_t>(at - out.begin());
    const std::string name = "name: ";
    size_t start = i;
    while (start > 0 && std::memcmp(out.data() + start, name.data(), name.size()) != 0) --start;
    REQUIRE(start >= 8);
    const int64_t grow = static_cast<int64_t>(to.size()) - static_cast<int64_t>(from.size());
    const uint64_t len = load<uint64_t>(out.data() + start - 8, false) + static_cast<uint64_t>(grow);
    std::memcpy(out.data() + start - 8, &len, 8);
    for (size_t pos : pipe_boundaries(out)) {
        if (load<uint32_t>(out.data() + pos, false) != PERF_RECORD_HEADER_TRACING_DATA) continue;
        const uint32_t size = load<uint32_t>(out.data() + pos + 8, false) + static_cast<uint32_t>(grow);
        std::memcpy(out.data() + pos + 8, &size, 4);
    }
    out.erase(out.begin() + static_cast<long>(i), out.begin() + static_cast<long>(i + from.size()));
    out.insert(out.begin() + static_cast<long>(i), to.begin(), to.end());
    return out;
}

bool any_warning(const Analysis& a, const std::string& what) {
    return std::any_of(a.stats.warnings.begin(), a.stats.warnings.end(),
                       [&](const std::string& w) { return w.find(what) != std::string::npos; });
}

}  // namespace

TEST_CASE("a real pipe-mode recording cut at every record boundary and mid-record") {
    auto full = read_all(fs::path(GILSCAN_TESTDATA) / "pipe.data");
    auto bounds = pipe_boundaries(full);
    REQUIRE(bounds.size() > 100);
    uint64_t last_records = 0;
    for (size_t k = 1; k < bounds.size(); ++k) {
        for (size_t extra : {size_t{0}, size_t{3}}) {
            size_t cut = bounds[k] + extra;
            CAPTURE(cut);
            std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<long>(cut));
            Analysis a = analyse_bytes(part);
            CHECK(a.stats.records == k);  // exactly the records before the cut
            if (extra) CHECK(a.stats.truncated);
            CHECK(a.stats.records >= last_records);
            last_records = a.stats.records;
        }
    }
}

TEST_CASE("a real file-mode recording cut at record boundaries: partial results, a warning naming the byte") {
    auto full = read_all(fs::path(GILSCAN_TESTDATA) / "plain.data");
    FileHeader h = read_file_header(full, "plain.data");
    std::vector<size_t> bounds;
    for (size_t pos = h.data.offset; pos + 8 <= h.data.offset + h.data.size;) {
        bounds.push_back(pos);
        pos += load<uint16_t>(full.data() + pos + 6, false);
    }
    REQUIRE(bounds.size() > 100);
    for (size_t k = 1; k < bounds.size(); k += 37) {
        size_t cut = bounds[k] + 5;  // mid-record
        CAPTURE(cut);
        Analysis a = analyse_bytes(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(cut)));
        CHECK(a.stats.records == k);
        CHECK(any_warning(a, "at byte " + std::to_string(bounds[k])));
    }
}

TEST_CASE("attr sizes 0 or huge") {
    SchedRecording r;
    r.switch_(10, 0, 1, 2, 1, 0);
    auto base = r.w.build();
    uint64_t attrs = load<uint64_t>(base.data() + 24, false);
    for (uint32_t size : {0u, 8u, 0xffffffffu, 200u}) {
        CAPTURE(size);
        auto b = base;
        std::memcpy(b.data() + attrs + 4, &size, 4);
        try {
            Analysis a = analyse_bytes(b);
            (void)a;
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("at byte") != std::string::npos);
        }
    }
    auto b = base;
    uint64_t huge = 1ull << 40;
    std::memcpy(b.data() + 16, &huge, 8);  // header attr_size
    CHECK_THROWS_AS(analyse_bytes(b), Error);
}

TEST_CASE("a broken format file is skipped with a warning; the others still decode") {
    SchedRecording r;
    r.w.attrs[r.wk].format = "this is not a format file";  // sched_waking's format is garbage
    r.switch_(10, 0, 1, 2, 1, 0);
    TestSample s;
    s.pid = 1;
    s.tid = 3;
    s.time = 20;
    s.raw = std::vector<uint8_t>(28, 0);
    r.w.sample(r.wk, s);
    r.switch_(30, 0, 1, 3, 1, 0);
    Analysis a = analyse_bytes(r.w.build());
    CHECK(any_warning(a, "broken format file"));
    CHECK(a.thread(2)->sleep_count == 1);
}

TEST_CASE("tracing data whose lengths lie: a warning, no formats, no crash") {
    SchedRecording r;
    r.switch_(10, 0, 1, 2, 1, 0);
    auto b = r.w.build();
    // Find the format text of sched_switch inside the tracing data and make its u64 size huge.
    std::string needle = "name: sched_switch";
    auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
    REQUIRE(it != b.end());
    size_t at = static_cast<size_t>(it - b.begin()) - 8;
    uint64_t huge = 1ull << 50;
    std::memcpy(b.data() + at, &huge, 8);
    Analysis a = analyse_bytes(b);
    CHECK(any_warning(a, "tracing data unreadable"));
    CHECK(a.stats.records > 0);
}

TEST_CASE("sample counts larger than the record: the record is skipped and counted") {
    PerfWriter w;
    int i = add_group_read_event(w);
    TestSample s;
    s.time = 5;
    s.read_values = {0xffffffffffull};  // group nr with nothing behind it
    w.sample(i, s);
    TestSample ok;
    ok.time = 6;
    ok.read_values = {1, 10, 100};
    ok.callchain = {PERF_CONTEXT_USER, 1};
    w.sample(i, ok);
    Analysis a = analyse_bytes(w.build());
    CHECK(a.stats.malformed == 1);
    CHECK(a.stats.samples_by_event.at(0) == 1);
    CHECK(any_warning(a, "malformed record"));
}

TEST_CASE("pipe mode: tracing data sent again mid-stream replaces the formats the decoders use") {
    // perf sends HEADER_TRACING_DATA once, first; a stream spliced from two
    // (or a damaged one) can send it again after samples were decoded. The
    // formats are parsed afresh then, and whatever cached a field's position
    // in the old ones must not read them (ASan catches a use after free).
    SchedRecording r;
    r.switch_(50, 0, 10, 12, 1, 11);
    r.switch_(100, 0, 10, 11, 1, 0);
    r.waking(150, 1, 10, 12, 11);
    r.switch_(170, 1, 10, 12, 1, 11);
    r.switch_(400, 1, 10, 11, 1, 0);
    r.waking(500, 1, 10, 12, 11);
    auto b = r.w.build_pipe();
    auto at = pipe_boundaries(b);
    size_t td = 0, first_data = 0;
    for (size_t i = 0; i + 1 < at.size(); ++i) {
        uint32_t type = load<uint32_t>(b.data() + at[i], false);
        if (type == PERF_RECORD_HEADER_TRACING_DATA) td = i;
        if (type == PERF_RECORD_SAMPLE && !first_data) first_data = i;
    }
    REQUIRE(first_data > td);
    REQUIRE(first_data + 3 < at.size());
    // The tracing data again after the first three samples, which a
    // second FINISHED_ROUND releases to the stages before it (a round
    // releases what was queued before the round ahead of it).
    std::vector<uint8_t> spliced(b.begin(), b.begin() + static_cast<long>(at[first_data + 3]));
    const uint8_t round[8] = {PERF_RECORD_FINISHED_ROUND, 0, 0, 0, 0, 0, 8, 0};
    spliced.insert(spliced.end(), round, round + 8);
    spliced.insert(spliced.end(), round, round + 8);
    spliced.insert(spliced.end(), b.begin() + static_cast<long>(at[td]), b.begin() + static_cast<long>(at[td + 1]));
    spliced.insert(spliced.end(), b.begin() + static_cast<long>(at[first_data + 3]), b.end());
    Analysis plain = analyse_bytes(b);
    Analysis again = analyse_bytes(spliced);
    CHECK(again.stats.malformed == 0);
    const ThreadStats* t = again.thread(11);
    REQUIRE(t);
    CHECK(t->sleep_count == plain.thread(11)->sleep_count);
    CHECK(t->sleep_ns == plain.thread(11)->sleep_ns);
    CHECK(t->running_ns == plain.thread(11)->running_ns);
    CHECK(again.spans.of(11, SpanKind::Sleep).size() == 2);
}

TEST_CASE("a real recording whose format puts a field at offset + size past 2^32: no crash, the records counted") {
    // 4294967292 + 4 wraps to 0 in 32 bits: the fixed-layout test passed and
    // the decoder read 4 GiB past the record (SIGSEGV).
    auto full = read_all(fs::path(GILSCAN_TESTDATA) / "pipe.data");
    Analysis plain = analyse_bytes(full);
    for (const char* field : {"next_prio", "prev_pid", "next_pid"}) {
        CAPTURE(field);
        const std::string f = std::string("field:") + (std::string(field) == "next_prio" ? "int " : "pid_t ") + field + ";";
        auto b = full;
        auto at = std::search(b.begin(), b.end(), f.begin(), f.end());
        REQUIRE(at != b.end());
        const std::string line(at, std::find(at, b.end(), '\n'));
        const std::string offset = line.substr(line.find("offset:"), line.find(';', line.find("offset:")) - line.find("offset:"));
        auto mutated = with_format_text(b, line, std::string(line).replace(line.find(offset), offset.size(), "offset:4294967292"));
        Analysis a = analyse_bytes(mutated);
        CHECK(a.stats.records == plain.stats.records);
        // The priority is not used: the same threads; a pid out of the record
        // is a field error (the command line's test reads its warning).
        if (std::string(field) == "next_prio") CHECK(a.threads.size() == plain.threads.size());
    }
}

TEST_CASE("zstd: every record compressed alone and no FINISHED_ROUND: the buffers held stay bounded") {
    // Each COMPRESSED record's events live in a buffer of their own until
    // ordered; without rounds every one was kept (2 MiB each: a 567 KB file
    // reached 11.7 GB). The window now releases by the bytes it holds.
    auto full = read_all(fs::path(GILSCAN_TESTDATA) / "pipe.data");
    const auto at = pipe_boundaries(full);
    std::vector<uint8_t> out(full.begin(), full.begin() + static_cast<long>(at.front()));
    std::vector<std::vector<uint8_t>> data;
    for (size_t k = 0; k < at.size(); ++k) {
        const size_t end = k + 1 < at.size() ? at[k + 1] : full.size();
        const uint32_t type = load<uint32_t>(full.data() + at[k], false);
        if (type == PERF_RECORD_FINISHED_ROUND) continue;
        std::vector<uint8_t> rec(full.begin() + static_cast<long>(at[k]), full.begin() + static_cast<long>(end));
        if (type < 64) data.push_back(rec);  // the kernel's records: what perf -z compresses
        else out.insert(out.end(), rec.begin(), rec.end());  // attrs, tracing data, features: as perf leaves them
    }
    const int copies = 4;
    size_t compressed = 0;
    for (int c = 0; c < copies; ++c)
        for (const auto& rec : data) {
            std::vector<uint8_t> z(ZSTD_compressBound(rec.size()));
            const size_t n = ZSTD_compress(z.data(), z.size(), rec.data(), rec.size(), 1);
            REQUIRE(!ZSTD_isError(n));
            const uint16_t size = static_cast<uint16_t>(8 + n);
            const uint8_t hdr[8] = {PERF_RECORD_COMPRESSED, 0, 0, 0, 0, 0, static_cast<uint8_t>(size & 0xff),
                                    static_cast<uint8_t>(size >> 8)};
            out.insert(out.end(), hdr, hdr + 8);
            out.insert(out.end(), z.begin(), z.begin() + static_cast<long>(n));
            ++compressed;
        }
    REQUIRE(compressed > 2000);
    Analysis a = analyse_bytes(out);
    CHECK(a.stats.compressed_records == compressed);
    CHECK(a.stats.records > compressed);
    // Without the bound: 2 MiB per compressed record, every one alive at the end.
    CHECK(a.stats.peak_buffer_bytes <= kWindowBytes + (64u << 20));
    CHECK(a.stats.peak_buffer_bytes >= (256u << 20));  // the case does reach the bound
}
