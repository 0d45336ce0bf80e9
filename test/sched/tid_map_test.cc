#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <random>

#include "gilscan/sched/tid_map.h"

using namespace gilscan;

TEST_CASE("IdMap: ids of any value, erase, 64-bit values") {
    TidMap m;
    m.set(5, 50);
    m.set(int64_t{1} << 30, 7);  // beyond pid_max (a foreign recording)
    m.set(-3, 9);
    CHECK(m.size() == 3);
    REQUIRE(m.find(5));
    CHECK(*m.find(5) == 50);
    CHECK(*m.find(int64_t{1} << 30) == 7);
    CHECK(*m.find(-3) == 9);
    CHECK_FALSE(m.find(6));
    m.set(5, 51);
    CHECK(m.size() == 3);
    m.erase(5);
    m.erase(-3);
    CHECK_FALSE(m.find(5));
    CHECK(m.size() == 1);
    std::vector<int64_t> keys;
    m.for_each([&](int64_t k, uint32_t) { keys.push_back(k); });
    CHECK(keys == std::vector<int64_t>{int64_t{1} << 30});

    IdMap<uint64_t> times;  // cpu -> time: 0 is a time like any other
    times.set(3, 0);
    times.set(70000, 123456789012345ull);
    REQUIRE(times.find(3));
    CHECK(*times.find(3) == 0);
    CHECK(*times.find(70000) == 123456789012345ull);
    CHECK_FALSE(times.find(2));
}

TEST_CASE("IdMap against std::map: random sets and erases, probe runs that wrap, the INT64_MIN key") {
    // Consecutive tids, tids a table size apart (same home slot), negative
    // and huge keys: the backward-shift erase must keep every probe run whole.
    std::mt19937_64 rng(12345);
    for (int round = 0; round < 4; ++round) {
        IdMap<uint32_t> m;
        std::map<int64_t, uint32_t> ref;
        std::vector<int64_t> keys;
        for (int i = 0; i < 300; ++i) keys.push_back(100000 + i);
        for (int i = 0; i < 100; ++i) keys.push_back(int64_t{i} * 64);      // collide in a 64-slot table
        for (int i = 0; i < 50; ++i) keys.push_back(int64_t{i} * 1024 + 7); // and in larger ones
        keys.push_back(-1);
        keys.push_back(std::numeric_limits<int64_t>::min());
        keys.push_back(std::numeric_limits<int64_t>::max());
        keys.push_back(int64_t{1} << 40);
        for (int op = 0; op < 20000; ++op) {
            const int64_t k = keys[rng() % keys.size()];
            switch (rng() % 3) {
            case 0:
            case 1: {
                const uint32_t v = static_cast<uint32_t>(rng() % 1000);
                m.set(k, v);
                ref[k] = v;
                break;
            }
            default:
                m.erase(k);
                ref.erase(k);
            }
            if (op % 97 == 0) {
                REQUIRE(m.size() == ref.size());
                for (int64_t q : keys) {
                    const uint32_t* got = m.find(q);
                    auto it = ref.find(q);
                    REQUIRE((got != nullptr) == (it != ref.end()));
                    if (got) REQUIRE(*got == it->second);
                }
            }
        }
        std::map<int64_t, uint32_t> seen;
        m.for_each([&](int64_t k, uint32_t v) { CHECK(seen.emplace(k, v).second); });
        CHECK(seen == ref);
    }
}

TEST_CASE("PtrIdMap against std::map: direct pages, ids at and past 2^22, negative ids, erase and reuse") {
    std::mt19937_64 rng(777);
    int values[1000];
    for (int round = 0; round < 3; ++round) {
        PtrIdMap<int> m;
        std::map<int64_t, int*> ref;
        std::vector<int64_t> keys;
        for (int i = 0; i < 300; ++i) keys.push_back(2000000 + i);            // one process's tids
        for (int i = 0; i < 100; ++i) keys.push_back(int64_t(rng() % (1u << 22)));  // scattered over the range
        for (int i = 0; i < 8; ++i) keys.push_back(255 + i * 256);            // page edges
        keys.push_back(0);
        keys.push_back((int64_t{1} << 22) - 1);  // the last direct id
        keys.push_back(int64_t{1} << 22);        // the first that is not
        keys.push_back(int64_t{1} << 40);
        keys.push_back(-1);
        keys.push_back(std::numeric_limits<int64_t>::min());
        for (int op = 0; op < 20000; ++op) {
            const int64_t k = keys[rng() % keys.size()];
            if (rng() % 3) {
                int* v = &values[rng() % 1000];
                m.set(k, v);
                ref[k] = v;
            } else {
                m.erase(k);
                ref.erase(k);
            }
            if (op % 97 == 0) {
                REQUIRE(m.size() == ref.size());
                for (int64_t q : keys) {
                    int* const* got = m.find(q);
                    auto it = ref.find(q);
                    REQUIRE((got != nullptr) == (it != ref.end()));
                    if (got) REQUIRE(*got == it->second);
                }
            }
        }
        CHECK_FALSE(m.find(3));  // never set (its page may exist: id 0 shares it)
        std::map<int64_t, int*> seen;
        m.for_each([&](int64_t k, int* v) { CHECK(seen.emplace(k, v).second); });
        CHECK(seen == ref);
    }
}
