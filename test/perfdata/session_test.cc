#include <doctest/doctest.h>

#include "session_fixtures.h"

using namespace gilscan;
using namespace gilscan::test;

TEST_CASE("synthetic recording: names from EVENT_DESC, fields from the embedded formats") {
    SchedRecording r = small();
    TempFile f(r.w.build());
    Session s(f.path);
    REQUIRE(s.events().size() == 2);
    CHECK(s.events()[0].name == "sched:sched_switch");
    CHECK(s.events()[1].format != nullptr);
    CHECK(s.tracing().saved_cmdlines.count(11) == 1);
    check_small(analyse(f.path));
}

TEST_CASE("byte-swapped (big-endian) file decodes to the same facts") { check_small(analyse_bytes(small(true).w.build())); }

TEST_CASE("pipe mode: attrs, tracing data and features as records, 4-byte aligned data after tracing data") {
    SchedRecording r = small();
    auto bytes = r.w.build_pipe();
    TempFile f(bytes);
    Session s(f.path);
    CHECK(s.header().pipe);
    check_small(analyse(f.path));
    check_small(analyse_bytes(small(true).w.build_pipe()));
}

TEST_CASE("records and the tracing data straddling read chunks: every chunk size decodes the same") {
    SchedRecording r = small();
    for (size_t chunk : {64u, 65u, 100u, 333u, 4096u}) {
        CAPTURE(chunk);
        check_small(analyse_bytes(r.w.build(), chunk));
        check_small(analyse_bytes(r.w.build(), chunk, true));
        check_small(analyse_bytes(r.w.build_pipe(), chunk));  // tracing data is read past header.size
        check_small(analyse_bytes(r.w.build_pipe(), chunk, true));
        check_small(analyse_bytes(small(true).w.build_pipe(), chunk, true));
        PerfWriter::BuildOptions o;
        o.compress_chunk = 50;
        Analysis z = analyse_bytes(r.w.build(o), chunk);
        CHECK(z.stats.compressed_records > 0);
        check_small(z);
    }
}

TEST_CASE("zstd: records straddling compressed chunks, COMPRESSED and COMPRESSED2, file and pipe mode") {
    for (size_t chunk : {7u, 50u, 333u, 100000u}) {
        for (bool c2 : {false, true}) {
            CAPTURE(chunk);
            CAPTURE(c2);
            SchedRecording r = small();
            PerfWriter::BuildOptions o;
            o.compress_chunk = chunk;
            o.compressed2 = c2;
            Analysis a = analyse_bytes(r.w.build(o));
            CHECK(a.stats.compressed_records > 0);
            check_small(a);
            check_small(analyse_bytes(r.w.build_pipe(o)));
        }
    }
}

TEST_CASE("a compressed chunk that does not decompress: warning, partial results, no crash") {
    SchedRecording r = small();
    PerfWriter::BuildOptions o;
    o.compress_chunk = 64;
    auto bytes = r.w.build(o);
    // Find the data section and damage the payload of its second COMPRESSED record.
    uint64_t data_off = load<uint64_t>(bytes.data() + 40, false);
    uint64_t first = load<uint16_t>(bytes.data() + data_off + 6, false);
    uint64_t second = data_off + first;
    for (size_t k = second + 12; k < second + 20; ++k) bytes[k] ^= 0x5a;
    Analysis a = analyse_bytes(bytes);
    bool warned = std::any_of(a.stats.warnings.begin(), a.stats.warnings.end(),
                              [](auto& w) { return w.find("decompress") != std::string::npos; });
    CHECK(warned);
}

TEST_CASE("a malformed sample names its own file offset (its COMPRESSED record's), inline and threaded, any chunk size") {
    // The stages decode samples on their own thread and look up where each
    // came from only for an error (ChunkTable::origin): the offset must be
    // the record's in the file, or that of the COMPRESSED record it was
    // inflated from, wherever the read chunks begin.
    PerfWriter w;
    int ev = add_group_read_event(w);
    constexpr uint64_t kSamples = 3000, kBad = 2345;
    for (uint64_t k = 0; k < kSamples; ++k) {
        TestSample s;
        s.time = 100 + k;
        s.read_values = k == kBad ? std::vector<uint64_t>{0xffffffffffull}  // group nr with nothing behind it
                                  : std::vector<uint64_t>{1, 10, 100};
        s.callchain = {PERF_CONTEXT_USER, 0x1000 + k};
        w.sample(ev, s);
        if (k % 100 == 99) w.finished_round();
    }
    // The bad sample is the only record with a 0xffffffffff u64: its offset in
    // the data section's records (plain), by walking them.
    auto find_bad = [](const std::vector<uint8_t>& d, uint64_t from, uint64_t to) {
        for (uint64_t pos = from; pos + 8 <= to;) {
            const uint16_t size = load<uint16_t>(d.data() + pos + 6, false);
            for (uint64_t i = pos + 8; i + 8 <= pos + size; i += 8)
                if (load<uint64_t>(d.data() + i, false) == 0xffffffffffull) return pos;
            pos += size;
        }
        return ~uint64_t{0};
    };
    for (size_t zchunk : {size_t{0}, size_t{4000}}) {
        PerfWriter::BuildOptions o;
        o.compress_chunk = zchunk;
        const auto bytes = w.build(o);
        const uint64_t data_off = load<uint64_t>(bytes.data() + 40, false);
        const uint64_t data_end = data_off + load<uint64_t>(bytes.data() + 48, false);
        uint64_t want;
        if (!zchunk) {
            want = find_bad(bytes, data_off, data_end);
        } else {
            // The COMPRESSED record whose input holds the bad sample's start and
            // end (the position chosen so that it does not straddle two).
            const auto plain = w.build();
            const uint64_t p_off = load<uint64_t>(plain.data() + 40, false);
            const uint64_t p = find_bad(plain, p_off, p_off + load<uint64_t>(plain.data() + 48, false)) - p_off;
            const uint16_t size = load<uint16_t>(plain.data() + p_off + p + 6, false);
            REQUIRE(p / zchunk == (p + size - 1) / zchunk);
            uint64_t pos = data_off;
            for (uint64_t k = 0; k < p / zchunk; ++k) pos += load<uint16_t>(bytes.data() + pos + 6, false);
            REQUIRE(load<uint32_t>(bytes.data() + pos, false) == PERF_RECORD_COMPRESSED);
            want = pos;
        }
        REQUIRE(want < data_end);
        TempFile f(bytes);
        for (size_t chunk : {size_t{0}, size_t{1000}, size_t{4096}}) {
            for (bool threaded : {false, true}) {
                CAPTURE(zchunk);
                CAPTURE(chunk);
                CAPTURE(threaded);
                Session s(f.path);
                s.set_threaded(threaded);
                if (chunk) s.set_chunk_size(chunk);
                Times t;
                s.run(t);
                CHECK(t.times.size() == kSamples - 1);
                CHECK(s.stats().malformed == 1);
                CHECK(s.stats().first_malformed_offset == want);
            }
        }
    }
}

TEST_CASE("records come out in time order across rounds, equal times in file order") {
    SchedRecording r;
    // Two CPU buffers written one after the other inside each round, as perf does.
    r.switch_(10, 0, 1, 2, 1, 0);
    r.switch_(30, 0, 1, 2, 1, 0);
    r.switch_(20, 1, 1, 3, 1, 0);
    r.switch_(40, 1, 1, 3, 1, 0);
    r.w.finished_round();
    r.switch_(35, 0, 1, 2, 1, 0);  // later than the previous flush limit (0): fine
    r.switch_(50, 1, 1, 3, 1, 0);
    r.w.finished_round();
    TempFile f(r.w.build());
    Session s(f.path);
    Times t;
    s.run(t);
    CHECK(t.times == std::vector<uint64_t>{10, 20, 30, 35, 40, 50});
    CHECK(s.stats().out_of_order == 0);
}

TEST_CASE("a sample written twice (a round's last samples again at the next round's start) is delivered once") {
    SchedRecording r;
    r.switch_(10, 0, 1, 2, 1, 0);
    r.switch_(20, 1, 1, 3, 1, 0);
    r.switch_(30, 0, 1, 2, 1, 0);
    const std::vector<uint8_t> again = r.w.records.back();  // the whole record, header included
    r.w.finished_round();
    r.w.records.push_back(again);  // as perf record 6.1 wrote some uprobe samples
    // Not repeats: the same time on another CPU, from another thread, and
    // one waker's two wake-ups at the same time (only the payload differs).
    r.switch_(30, 1, 1, 3, 1, 0);
    r.switch_(30, 0, 1, 4, 1, 0);
    r.waking(35, 0, 1, 4, 5);
    r.waking(35, 0, 1, 4, 6);
    r.switch_(40, 1, 1, 3, 1, 0);
    r.w.finished_round();
    TempFile f(r.w.build());
    run_both_ways(f.path, [](const Session& s, const Times& t) {
        CHECK(t.times == std::vector<uint64_t>{10, 20, 30, 30, 30, 35, 35, 40});
        CHECK(s.stats().duplicate_samples == 1);
        CHECK(s.stats().out_of_order == 0);
        const auto& w = s.stats().warnings;
        CHECK(std::any_of(w.begin(), w.end(), [](const std::string& x) { return x.find("1 sample(s) skipped that repeat") != std::string::npos; }));
    });
}

TEST_CASE("samples written twice are delivered once where the pair straddles two batches too") {
    // 6000 samples each written twice, after one that is not: batches of
    // the same record count then split some pairs (either parity), so the
    // copy kept of a batch's last sample (its chunk may be reused once the
    // batch is back) is what the next batch's first record is compared with.
    SchedRecording r;
    r.switch_(5, 0, 1, 2, 1, 0);
    constexpr int kPairs = 6000;
    for (int i = 0; i < kPairs; ++i) {
        r.switch_(10 + static_cast<uint64_t>(i), static_cast<uint32_t>(i % 2), 1, 2 + i % 3, 1, 0);
        r.w.records.push_back(r.w.records.back());
        if (i % 1000 == 999) r.w.finished_round();
    }
    r.w.finished_round();
    TempFile f(r.w.build());
    run_both_ways(f.path, [&](const Session& s, const Times& t) {
        CHECK(s.stats().duplicate_samples == kPairs);
        REQUIRE(t.times.size() == size_t{kPairs} + 1);
        for (int i = 0; i < kPairs; ++i) CHECK(t.times[static_cast<size_t>(i) + 1] == 10 + static_cast<uint64_t>(i));
    });
}

TEST_CASE("bounded queue: without rounds the older half is released; chunks are released after delivery") {
    ChunkTable chunks;
    OrderedQueue q(chunks, 8);
    std::vector<uint64_t> out;
    // Records carry their push index in the body, so delivery order is visible.
    const uint32_t id = chunks.acquire(20 * 16, 0, false);
    chunks.bytes(id).resize(20 * 16);
    auto deliver = each_record(chunks, [&](const RawRecord& r) {
        out.push_back(load<uint64_t>(r.body.data(), false));
        chunks.release(r.chunk);  // the queue's reference comes with the record
    });
    for (uint64_t t = 0; t < 20; ++t) push_numbered(q, chunks, id, t, t % 2 ? t : 19 - t, deliver);  // two interleaved runs
    CHECK(q.peak_size() <= 9);
    CHECK(q.half_flushes() > 0);
    q.flush_all(deliver);
    REQUIRE(out.size() == 20);
    // Each record exactly once (the body holds its push index).
    std::vector<uint64_t> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t t = 0; t < 20; ++t) CHECK(sorted[t] == t);
    CHECK(q.size() == 0);
    CHECK(chunks.live() == 1);  // only our own reference is left
    chunks.release(id);
    CHECK(chunks.live() == 0);
}

TEST_CASE("equal timestamps keep file order across runs and rounds") {
    ChunkTable chunks;
    OrderedQueue q(chunks);
    const uint32_t id = chunks.acquire(64 * 16, 0, false);
    chunks.bytes(id).resize(64 * 16);
    std::vector<uint64_t> out;
    auto deliver = each_record(chunks, [&](const RawRecord& r) {
        out.push_back(load<uint64_t>(r.body.data(), false));
        chunks.release(r.chunk);  // the queue's reference comes with the record
    });
    // Four "CPU runs" of (time 5, 5, 7) each, pushed in file order 0..11.
    uint64_t n = 0;
    for (int run = 0; run < 4; ++run)
        for (uint64_t t : {5u, 5u, 7u}) push_numbered(q, chunks, id, n++, t, deliver);
    q.flush_all(deliver);
    CHECK(out == std::vector<uint64_t>{0, 1, 3, 4, 6, 7, 9, 10, 2, 5, 8, 11});
    chunks.release(id);
}

TEST_CASE("a header with data size 0 (perf killed): data read to the end of the file") {
    SchedRecording r = small();
    PerfWriter::BuildOptions o;
    o.zero_data_size = true;
    o.features = false;  // a killed perf never wrote them
    TempFile f(r.w.build(o));
    Session s(f.path);
    Times t;
    s.run(t);
    CHECK(s.header().data_size_was_zero);
    CHECK(s.stats().records == r.w.records.size());
    CHECK(t.comms == std::vector<std::string>{"worker"});
    CHECK(std::any_of(s.stats().warnings.begin(), s.stats().warnings.end(),
                      [](auto& w) { return w.find("data size is 0") != std::string::npos; }));
}

TEST_CASE("record of size < 8 stops framing with a warning; earlier records kept") {
    SchedRecording r = small();
    r.w.record(PERF_RECORD_FINISHED_ROUND, 0, {});
    auto bytes = r.w.build();
    uint64_t data_off = load<uint64_t>(bytes.data() + 40, false);
    uint64_t data_size = load<uint64_t>(bytes.data() + 48, false);
    // The last record is the 8-byte FINISHED_ROUND: make its size 4.
    bytes[data_off + data_size - 2] = 4;
    Analysis a = analyse_bytes(bytes);
    CHECK(a.stats.truncated);
    CHECK(a.stats.samples_by_event.at(0) == 3);
}

TEST_CASE("unknown record types are counted and skipped") {
    SchedRecording r = small();
    r.w.record(200, 0, {1, 2, 3, 4, 5, 6, 7, 8});
    r.w.record(PERF_RECORD_SWITCH, 0, {});
    Analysis a = analyse_bytes(r.w.build());
    CHECK(a.stats.unknown_types == 1);
    check_small(a);
}

TEST_CASE("not a recording: one clear error") {
    CHECK_THROWS_WITH_AS(Session(TempFile(std::vector<uint8_t>(200, 'x')).path), doctest::Contains("not a perf.data file"), Error);
    CHECK_THROWS_AS(Session("/nonexistent/perf.data"), Error);
    std::vector<uint8_t> tiny = {'P', 'E', 'R'};
    CHECK_THROWS_AS(Session(TempFile(tiny).path), Error);
}

TEST_CASE("header sections pointing outside the file are errors, not reads") {
    auto base = small().w.build();
    {
        auto b = base;
        b[24 + 7] = 0x7f;  // attrs.offset huge
        CHECK_THROWS_AS(Session(TempFile(b).path), Error);
    }
    {
        auto b = base;
        b[16] = 8;  // attr_size 8
        b[17] = 0;
        CHECK_THROWS_AS(Session(TempFile(b).path), Error);
    }
    {
        auto b = base;
        b[40 + 6] = 0x7f;  // data.offset past EOF
        CHECK_THROWS_AS(Session(TempFile(b).path), Error);
    }
}

TEST_CASE("every cut of a synthetic recording decodes or errors cleanly") {
    for (bool pipe : {false, true}) {
        SchedRecording r = small();
        PerfWriter::BuildOptions o;
        o.compress_chunk = pipe ? 0 : 40;
        auto full = pipe ? r.w.build_pipe() : r.w.build(o);
        auto samples = [](const Analysis& a) {
            uint64_t n = 0;
            for (uint64_t c : a.stats.samples_by_event) n += c;
            return n;
        };
        const uint64_t all = samples(analyse_bytes(full));
        REQUIRE(all == 4);
        size_t decoded = 0, errors = 0;
        for (size_t cut = 1; cut < full.size(); ++cut) {
            CAPTURE(cut);
            std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<long>(cut));
            try {
                Analysis a = analyse_bytes(part);
                ++decoded;
                CHECK(samples(a) <= all);  // nothing invented from a cut
                if (!pipe) CHECK_FALSE(a.stats.warnings.empty());  // the header says more data: always warned
            } catch (const Error& e) {
                ++errors;  // a one-line error naming the file is acceptable; a crash is not
                CHECK(std::string(e.what()).find("gilscan-test-") != std::string::npos);
            }
        }
        CHECK(decoded > 0);
        CHECK(errors > 0);
    }
}

// GILSCAN_WRITE_SEEDS=DIR writes synthetic seed inputs for the fuzzer
// (test/fuzz/decoder_corpus); otherwise this case only checks they build.
TEST_CASE("fuzz seeds: synthetic edge-case recordings") {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
    seeds.emplace_back("synthetic_plain", small().w.build());
    seeds.emplace_back("synthetic_swapped", small(true).w.build());
    seeds.emplace_back("synthetic_pipe", small().w.build_pipe());
    PerfWriter::BuildOptions z;
    z.compress_chunk = 40;
    seeds.emplace_back("synthetic_zstd", small().w.build(z));
    z.compressed2 = true;
    seeds.emplace_back("synthetic_zstd2_pipe", small().w.build_pipe(z));
    PerfWriter::BuildOptions k;
    k.zero_data_size = true;
    k.features = false;
    seeds.emplace_back("synthetic_killed", small().w.build(k));
    for (auto& [name, bytes] : seeds) CHECK(bytes.size() > 104);
    if (const char* dir = std::getenv("GILSCAN_WRITE_SEEDS")) {
        for (auto& [name, bytes] : seeds) {
            std::ofstream f(std::string(dir) + "/" + name, std::ios::binary);
            f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        }
    }
}

TEST_CASE("EVENT_UPDATE names an event; AUXTRACE's trailing bytes are skipped") {
    SchedRecording r = small();
    // PERF_RECORD_EVENT_UPDATE {u64 type = NAME (2), u64 id, char name[]}
    Out u;
    u.put<uint64_t>(2);
    u.put<uint64_t>(r.w.attrs[r.wk].ids[0]);
    u.str("renamed:waking");
    u.pad(8);
    r.w.record(PERF_RECORD_EVENT_UPDATE, 0, u.b);
    // PERF_RECORD_AUXTRACE: header.size excludes the `size` bytes of trace data after it.
    Out a;
    a.put<uint64_t>(16);  // size of the trailing data
    a.put<uint64_t>(0);
    a.put<uint64_t>(0);
    a.put<uint32_t>(0);
    a.put<uint32_t>(0);
    a.put<uint32_t>(0);
    a.put<uint32_t>(0);
    r.w.record(PERF_RECORD_AUXTRACE, 0, a.b);
    r.w.records.back().insert(r.w.records.back().end(), 16, 0xee);  // the aux data itself
    r.switch_(400, 0, 10, 12, 1, 0);
    TempFile f(r.w.build());
    Session s(f.path);
    Times t;
    s.run(t);
    CHECK(s.events()[r.wk].name == "renamed:waking");
    CHECK(s.stats().malformed == 0);
    CHECK_FALSE(s.stats().truncated);
    CHECK(t.times.back() == 400);  // the record after AUXTRACE was framed correctly
}
