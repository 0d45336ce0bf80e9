// EventIds: the reader's fused lookup (event_and_time) against event_for and
// time_of, on records of every type and length, known and unknown ids, with
// and without sample_id_all, in both byte orders.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "gilscan/perfdata/event_ids.h"
#include "gilscan/perfdata/perf_abi.h"

using namespace gilscan;

TEST_CASE("event_and_time gives what event_for and time_of give, record by record") {
    const uint64_t kTypes[] = {PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU | PERF_SAMPLE_RAW,
                               PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID | PERF_SAMPLE_CPU,
                               PERF_SAMPLE_TID | PERF_SAMPLE_ID | PERF_SAMPLE_PERIOD,          // no TIME
                               PERF_SAMPLE_IP | PERF_SAMPLE_TIME | PERF_SAMPLE_PERIOD};        // no id
    size_t compared = 0, with_time = 0, unknown = 0;
    for (const uint64_t st : kTypes)
    for (const int nevents : {1, 3})
    for (const bool id_all : {false, true})
    for (const bool swap : {false, true}) {
        EventIds ids;
        for (int e = 0; e < nevents; ++e) {
            PerfEventAttr a;
            a.sample_type = st;
            if (id_all) a.flags |= uint64_t{1} << ATTR_BIT_sample_id_all;
            REQUIRE(ids.add_event(a, {100u + static_cast<uint64_t>(e), 200u + static_cast<uint64_t>(e)}));
        }
        uint64_t seed = 77;
        auto rnd = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull, seed >> 33; };
        for (int i = 0; i < 4000; ++i) {
            std::vector<uint8_t> body(rnd() % 72);
            for (auto& b : body) b = static_cast<uint8_t>(rnd());
            // Ids the attrs have, most of the time, in every word.
            const uint64_t known = (rnd() % 2 ? 100 : 200) + rnd() % nevents;
            for (size_t w = 0; w + 8 <= body.size(); w += 8)
                if (rnd() % 3) {
                    const uint64_t v = swap ? __builtin_bswap64(known) : known;
                    std::memcpy(body.data() + w, &v, 8);
                }
            RawRecord r;
            r.type = rnd() % 4 ? PERF_RECORD_SAMPLE : (rnd() % 2 ? PERF_RECORD_COMM : PERF_RECORD_MMAP2);
            r.body = Bytes(body.data(), body.size());
            const int want_ev = ids.event_for(r, swap);
            const uint8_t* want_time = want_ev >= 0 ? ids.time_of(r, want_ev) : nullptr;
            const uint8_t* time = reinterpret_cast<const uint8_t*>(&seed);  // must be overwritten
            const int ev = ids.event_and_time(r, swap, time);
            REQUIRE(ev == want_ev);
            if (ev >= 0) REQUIRE(time == want_time);
            ++compared;
            with_time += ev >= 0 && time != nullptr;
            unknown += ev < 0;
        }
    }
    CHECK(compared == 4u * 2 * 2 * 2 * 4000);
    CHECK(with_time > compared / 4);
    CHECK(unknown > compared / 50);
}
