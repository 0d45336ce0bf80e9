// Helpers shared by the session, ordering and reader tests.
#pragma once


#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <sys/mman.h>
#include <sys/resource.h>

#include "gilscan/perfdata/handoff.h"
#include "gilscan/perfdata/session.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;

namespace {

struct Times : EventSink {
    std::vector<uint64_t> times;
    std::vector<std::string> names;
    std::vector<std::string> comms;
    void on_sample(const Sample& s, const EventInfo& ev) override {
        times.push_back(s.time);
        names.push_back(ev.name);
    }
    void on_comm(const CommEvent& e) override { comms.emplace_back(e.comm); }
};

// Reads the recording inline and with the reader thread; check(session, times) after each.
template <class Check>
inline void run_both_ways(const std::string& path, Check check) {
    for (bool threaded : {false, true}) {
        CAPTURE(threaded);
        Session s(path);
        s.set_threaded(threaded);
        Times t;
        s.run(t);
        check(s, t);
    }
}

inline SchedRecording small(bool swap = false) {
    SchedRecording r(swap);
    r.w.comm(r.sw, 10, 11, "worker", 50);
    r.switch_(100, 0, 10, 11, 1, 0);  // 11 sleeps
    r.waking(150, 1, 10, 12, 11);     // 12 wakes 11
    r.switch_(170, 1, 10, 12, 0x100, 11);
    r.w.finished_round();
    r.switch_(300, 1, 10, 11, 1, 12);
    return r;
}

inline void check_small(const Analysis& a) {
    CHECK(a.stats.samples_by_event.at(0) == 3);
    CHECK(a.stats.samples_by_event.at(1) == 1);
    auto sleeps = a.spans.of(11, SpanKind::Sleep);
    REQUIRE(sleeps.size() >= 1);
    CHECK(sleeps[0].start == 100);
    CHECK(sleeps[0].end == 150);
    CHECK(sleeps[0].waker == 12);
    CHECK(sleeps[0].tgid == 10);
    auto runnable = a.spans.of(11, SpanKind::Runnable);
    REQUIRE(runnable.size() == 1);
    CHECK(runnable[0].start == 150);
    CHECK(runnable[0].end == 170);
    const ThreadStats* t = a.thread(11);
    REQUIRE(t);
    CHECK(t->comm == "worker");
    CHECK(t->tgid == 10);
}

// A deliver(OrderedQueue::Run) that hands each record of the run on as a
// RawRecord, its header read as the stages read it, with the queue's
// reference to its chunk (f releases it).
template <class F>
inline auto each_record(ChunkTable& chunks, F f) {
    return [&chunks, f](OrderedQueue::Run run) mutable {
        for (const OrderedQueue::Entry* e = run.first; e != run.last; ++e) {
            const uint32_t c = e->chunk();
            const uint8_t* rec = chunks.data(c) + e->pos;
            RawRecord r;
            read_framed(rec, false, r);
            r.offset = chunks.origin(c, rec);
            r.chunk = c;
            r.event = e->event();
            f(r);
        }
    };
}

// Record k of a chunk of 16-byte records (its body holds k), pushed at time t.
template <class Deliver>
inline void push_numbered(OrderedQueue& q, ChunkTable& chunks, uint32_t id, uint64_t k, uint64_t t, Deliver& deliver) {
    uint8_t* rec = chunks.bytes(id).data() + k * 16;
    std::memset(rec, 0, 16);
    rec[6] = 16;
    std::memcpy(rec + 8, &k, 8);
    RawRecord r;
    r.chunk = id;
    r.body = Bytes(rec + 8, 8);
    q.push(t, r, deliver);
}

// Rounds of one sorted run per CPU buffer, times from time(round, random),
// through an OrderedQueue (ready records drained, or on odd rounds pumped a
// few at a time): delivered in the order of a stable sort by time, as when no
// record is late for its round.
template <class Time>
inline void check_rounds(uint64_t cpus, uint64_t rounds, uint64_t per_cpu, uint64_t seed, bool pump_odd_rounds, Time time) {
    ChunkTable chunks;
    OrderedQueue q(chunks);
    const uint64_t n = rounds * cpus * per_cpu;
    const uint32_t id = chunks.acquire(n * 16, 0, false);
    chunks.bytes(id).resize(n * 16);
    std::vector<std::pair<uint64_t, uint64_t>> expect;  // (time, push index)
    std::vector<uint64_t> out;
    auto deliver = each_record(chunks, [&](const RawRecord& r) {
        out.push_back(load<uint64_t>(r.body.data(), false));
        chunks.release(r.chunk);  // the queue's reference comes with the record
    });
    uint64_t k = 0;
    auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
    for (uint64_t round = 0; round < rounds; ++round) {
        for (uint64_t cpu = 0; cpu < cpus; ++cpu) {
            std::vector<uint64_t> times;
            for (uint64_t i = 0; i < per_cpu; ++i) times.push_back(time(round, rnd()));
            std::sort(times.begin(), times.end());  // one sorted run per CPU buffer
            for (uint64_t t : times) {
                push_numbered(q, chunks, id, k, t, deliver);
                expect.push_back({t, k});
                ++k;
            }
        }
        q.finished_round(deliver);
        if (pump_odd_rounds && round % 2) q.pump(deliver, 7);
    }
    q.flush_all(deliver);
    std::stable_sort(expect.begin(), expect.end(), [](auto& a, auto& b) { return a.first < b.first; });
    REQUIRE(out.size() == expect.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < out.size(); ++i) mismatches += out[i] != expect[i].second;
    CHECK(mismatches == 0);
    CHECK(q.out_of_order() == 0);
    chunks.release(id);
    CHECK(chunks.live() == 0);
}

}  // namespace
