// Helpers of the golden and whole-analysis tests: the recordings in
// testdata/ and the facts golden_expect.py stored beside them.
#pragma once


#include <charconv>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gilscan/pipeline.h"
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/mapped_file.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/summary.h"
#include "support/test_util.h"

using namespace gilscan;
using namespace gilscan::test;
namespace fs = std::filesystem;

namespace {

const fs::path kData = GILSCAN_TESTDATA;

inline nlohmann::json load_json(const fs::path& p) {
    std::ifstream f(p);
    REQUIRE_MESSAGE(f.good(), "missing " << p);
    return nlohmann::json::parse(f);
}

inline std::map<std::string, uint64_t> event_counts(const std::string& path) {
    Session s(path);
    struct Null : EventSink {} n;
    s.run(n);
    std::map<std::string, uint64_t> out;
    const auto& by_event = s.stats().samples_by_event;
    for (size_t i = 0; i < by_event.size(); ++i)
        if (by_event[i]) out[s.events()[i].name] += by_event[i];
    return out;
}

inline void check_golden(const std::string& name) {
    CAPTURE(name);
    fs::path data = kData / (name + ".data");
    nlohmann::json exp = load_json(kData / (name + ".expected.json"));
    Analysis a = analyse(data.string());
    CHECK(a.stats.truncated == false);
    CHECK(a.stats.malformed == 0);
    auto counts = event_counts(data.string());
    for (auto& item : exp["event_counts"].items()) {
        const std::string ev = item.key();
        CAPTURE(ev);
        CHECK(counts[ev] == item.value().get<uint64_t>());
    }
    CHECK(counts.size() == exp["event_counts"].size());
    CHECK(a.stats.lost_records == exp["lost_records"].get<uint64_t>());
    CHECK(a.stats.lost_samples == exp["lost_samples"].get<uint64_t>());
    std::map<std::string, uint64_t> per_cpu;
    for (auto& [cpu, n] : a.stats.lost_by_cpu) per_cpu[std::to_string(cpu)] = n;
    CHECK(per_cpu == exp["lost_by_cpu"].get<std::map<std::string, uint64_t>>());
    if (!exp.contains("threads")) return;
    size_t checked = 0;
    for (auto& item : exp["threads"].items()) {
        const std::string tid = item.key();
        const nlohmann::json& e = item.value();
        CAPTURE(tid);
        const ThreadStats* t = a.thread(std::stoi(tid));
        REQUIRE(t);
        CHECK(t->sleep_count == e["sleep_count"].get<uint64_t>());
        CHECK(t->sleep_ns == e["sleep_ns"].get<uint64_t>());
        CHECK(t->disk_count == e["disk_count"].get<uint64_t>());
        CHECK(t->disk_ns == e["disk_ns"].get<uint64_t>());
        ++checked;
    }
    CHECK(checked >= 5);  // the workload's main thread and its four workers at least
}

// GIL wait / held per thread from uprobes, against the same rules applied to
// perf script's text: must agree within 0.5% of the thread's span.
inline void check_golden_gil(const std::string& name, bool with_sleeps) {
    CAPTURE(name);
    nlohmann::json exp = load_json(kData / (name + ".expected.json"));
    REQUIRE(exp.contains("gil"));
    Analysis a = analyse((kData / (name + ".data")).string());
    CHECK(a.gil_anomalies.total() == 0);
    size_t contending = 0;
    for (auto& item : exp["gil"].items()) {
        const std::string tid = item.key();
        const nlohmann::json& e = item.value();
        CAPTURE(tid);
        const GilThreadStats* g = a.gil_thread(std::stoi(tid));
        REQUIRE(g);
        const double tol = 0.005 * e["span_ns"].get<double>();
        CHECK(std::abs(static_cast<double>(g->wait_ns) - e["wait_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g->hold_ns) - e["hold_ns"].get<double>()) <= tol);
        contending += e["wait_ns"].get<uint64_t>() > 0 && e["hold_ns"].get<uint64_t>() > 0;
        uint64_t mask = 0;  // the GILs it took, by index
        for (const auto& k : e["gils"]) mask |= uint64_t{1} << k.get<unsigned>();
        CHECK(g->gil_mask == mask);
        if (with_sleeps) {
            const ThreadStats* t = a.thread(std::stoi(tid));
            REQUIRE(t);
            CHECK(t->gil_sleep_count == e["gil_sleep_count"].get<uint64_t>());
        }
    }
    CHECK(contending >= 3);
    // Per GIL: the process's GILs, told apart by the take_gil probe's gil=
    // address where it has one, in the order perf script's text first names them.
    REQUIRE(exp.contains("gils"));
    REQUIRE(a.gils.size() == exp["gils"].size());
    for (size_t i = 0; i < a.gils.size(); ++i) {
        const nlohmann::json& e = exp["gils"][i];
        const GilProcessStats& g = a.gils[i];
        CAPTURE(i);
        CHECK(g.pid == e["pid"].get<int32_t>());
        if (e["address"].is_null()) {
            CHECK(g.address == 0);
        } else {
            CHECK(g.address == std::stoull(e["address"].get<std::string>(), nullptr, 16));
        }
        const double span = e["span_ns"].get<double>(), tol = 0.005 * span;
        CHECK(std::abs(static_cast<double>(g.last - g.first) - span) <= tol);
        CHECK(std::abs(static_cast<double>(g.held_ns) - e["held_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g.contended_ns) - e["contended_ns"].get<double>()) <= tol);
        CHECK(std::abs(static_cast<double>(g.waiting_ns) - e["waiting_ns"].get<double>()) <= tol);
        CHECK(g.max_waiters == e["max_waiters"].get<uint32_t>());
    }
}

}  // namespace
