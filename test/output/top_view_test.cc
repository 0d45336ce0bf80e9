// gilscan top's view: an interval's figures are two moments' difference.
#include <doctest/doctest.h>

#include "gilscan/output/top_view.h"

using namespace gilscan;

namespace {

constexpr uint64_t kS = 1'000'000'000;

LiveThreadFigures thread(int32_t tid, const char* comm, uint64_t first, uint64_t run, uint64_t hold, uint64_t wait,
                         bool alive = true) {
    LiveThreadFigures t;
    t.pid = 10;
    t.tid = tid;
    t.comm = comm;
    t.first_seen = first;
    t.running_ns = run;
    t.gil_hold_ns = hold;
    t.gil_wait_ns = wait;
    t.alive = alive;
    return t;
}

BlameRow blamed(const char* function, uint64_t on, uint64_t off) {
    BlameRow r;
    r.pid = 10;
    r.function = function;
    r.native = "native_" + std::string(function);
    r.on_cpu_ns = on;
    r.off_cpu_ns = off;
    return r;
}

LiveFigures moment(uint64_t t) {
    LiveFigures f;
    f.time = t;
    f.start = kS / 2;
    f.gil_probes = true;
    f.blame = true;
    return f;
}

}  // namespace

TEST_CASE("top view: an interval is the difference of two moments, threads by GIL wait first") {
    LiveFigures a = moment(kS);
    a.threads = {thread(11, "spinner", 0, kS / 2, 3 * kS / 10, kS / 10), thread(12, "old", 0, 5, 0, 0, false),
                 thread(13, "lagging", 0, 900, 900, 900)};
    a.gils = {{10, 0, 4 * kS / 10, 2 * kS / 10, 3 * kS / 10, 11, 1}};
    a.blame_rows = {blamed("spin", kS / 10, 0), blamed("idle", 5, 0)};
    LiveFigures b = moment(2 * kS);
    b.threads = {thread(11, "spinner", 0, 12 * kS / 10, 7 * kS / 10, 5 * kS / 10), thread(12, "old", 0, 5, 0, 0, false),
                 thread(13, "lagging", 0, 800, 900, 1000), thread(14, "new", 15 * kS / 10, kS / 4, kS / 5, 9 * kS / 10),
                 thread(12, "reused", 18 * kS / 10, 10, 0, 0)};
    b.gils = {{10, 0, 12 * kS / 10, 8 * kS / 10, 11 * kS / 10, 14, 2}};
    b.blame_rows = {blamed("spin", 5 * kS / 10, 2 * kS / 10), blamed("idle", 5, 0), blamed("read", 0, kS / 10)};

    TopView v(10);
    v.update(a);
    CHECK(v.interval_ns() == kS / 2);  // the first interval: from the recording's start
    v.update(b);
    CHECK(v.interval_ns() == kS);
    const auto rows = v.thread_rows();
    REQUIRE(rows.size() == 4);  // "old" was gone before the interval: not shown again
    CHECK(rows[0].t->tid == 14);  // the most GIL wait first
    CHECK(rows[0].wait_ns == 9 * kS / 10);  // new in the interval: all of it
    CHECK(rows[1].t->tid == 11);
    CHECK(rows[1].running_ns == 7 * kS / 10);
    CHECK(rows[1].hold_ns == 4 * kS / 10);
    CHECK(rows[1].wait_ns == 4 * kS / 10);
    const auto lag = std::find_if(rows.begin(), rows.end(), [](const TopView::ThreadRow& r) { return r.t->tid == 13; });
    REQUIRE(lag != rows.end());
    CHECK(lag->running_ns == 0);  // went down (an open state counted ahead): 0, never negative
    CHECK(lag->wait_ns == 100);
    CHECK(std::any_of(rows.begin(), rows.end(), [](const TopView::ThreadRow& r) { return r.t->comm == "reused"; }));

    const auto gils = v.gil_rows();
    REQUIRE(gils.size() == 1);
    CHECK(gils[0].held_ns == 8 * kS / 10);
    CHECK(gils[0].contended_ns == 6 * kS / 10);
    CHECK(gils[0].waiting_ns == 8 * kS / 10);
    CHECK(gils[0].thread_wait_ns == 9 * kS / 10 + 4 * kS / 10 + 100);  // mean waiters x interval

    const auto blame = v.blame_lines();
    REQUIRE(blame.size() == 2);  // "idle" charged nothing in the interval: left out
    CHECK(blame[0].row->function == "spin");
    CHECK(blame[0].contended_ns == 6 * kS / 10);
    CHECK(blame[0].off_cpu_ns == 2 * kS / 10);
    CHECK(blame[1].row->function == "read");

    const nlohmann::json j = v.json();
    CHECK(j["start_ns"] == kS);
    CHECK(j["end_ns"] == 2 * kS);
    CHECK(j["threads"][1]["cpu_pct"] == 70.0);
    CHECK(j["threads"][1]["gil_held_pct"] == 40.0);
    CHECK(j["gils"][0]["load_pct"] == 80.0);
    CHECK(j["gils"][0]["waiters_now"] == 2);
    CHECK(j["gil_blame"][0]["total_contended_us"] == 700000.0);

    const std::string screen = v.text(80, 0, "pid 10");
    CHECK(screen.find("GIL of 10: load  80.0%  contended  60.0%  waiters 1.3 mean, 2 now, held by 14") != std::string::npos);
    INFO(screen);
    CHECK(screen.find("     11  spinner           70.0       40.0       40.0") != std::string::npos);
    CHECK(screen.find("spin") != std::string::npos);
}

TEST_CASE("top view: a screen fits its height and width, the blame table kept") {
    LiveFigures a = moment(kS), b = moment(2 * kS);
    for (int i = 0; i < 40; ++i) {
        a.threads.push_back(thread(100 + i, "worker-with-a-long-name", 0, 0, 0, 0));
        b.threads.push_back(thread(100 + i, "worker-with-a-long-name", 0, kS / 100, 0, static_cast<uint64_t>(i)));
    }
    b.blame_rows = {blamed("spin", kS / 10, 0)};
    TopView v(10);
    v.update(a);
    v.update(b);
    const std::string screen = v.text(60, 24, "a very long command line that does not fit in sixty columns at all");
    size_t lines = 0, widest = 0;
    for (size_t at = 0, nl; at < screen.size(); at = nl + 1) {
        nl = screen.find('\n', at);
        widest = std::max(widest, nl - at);
        ++lines;
    }
    CHECK(lines <= 24);
    CHECK(widest <= 60 + 2);  // an ellipsis is 3 bytes, one column
    CHECK(screen.find("more threads") != std::string::npos);
    CHECK(screen.find("GIL blame") != std::string::npos);
    CHECK(screen.find("worker-with-a-l\xe2\x80\xa6") != std::string::npos);  // cut with an ellipsis
}

TEST_CASE("top view: the last moment from a finished run's summary") {
    FileSummary fs;
    fs.first_time = 5;
    fs.last_time = 3 * kS;
    fs.gil_probes = true;
    ThreadSummary t;
    t.st.tid = 11;
    t.st.tgid = 10;
    t.st.comm = "spinner";
    t.st.running_ns = 2 * kS;
    t.st.exited = true;
    t.gil_wait_ns = kS;
    t.gil_hold_ns = kS / 2;
    fs.threads.push_back(t);
    GilProcessStats g;
    g.pid = 10;
    g.held_ns = kS;
    fs.gil_processes.push_back(g);
    const LiveFigures f = live_figures_of(fs);
    CHECK(f.time == 3 * kS);
    CHECK(f.start == 5);
    REQUIRE(f.threads.size() == 1);
    CHECK(f.threads[0].gil_wait_ns == kS);
    CHECK(f.threads[0].gil_hold_ns == kS / 2);
    CHECK_FALSE(f.threads[0].alive);
    REQUIRE(f.gils.size() == 1);
    CHECK(f.gils[0].holder == -1);
}
