// Session::run's reader thread: pumping, idle work, the handoff, MMAP hooks.
#include <doctest/doctest.h>

#include "session_fixtures.h"

using namespace gilscan;
using namespace gilscan::test;
TEST_CASE("a threaded run pumps a round while reading the next: the same records, in the same order, as inline") {
    // Rounds far larger than what may be in flight between the threads
    // (4 MiB). Without sample_id_all the COMM records carry no time: they are
    // delivered where they are read, after everything released before them.
    SchedRecording r;
    for (auto& a : r.w.attrs) a.attr.flags &= ~(1ull << ATTR_BIT_sample_id_all);
    constexpr int kRounds = 4, kCpus = 4, kPerCpu = 12000;  // some 5 MB per round
    uint64_t t = 1000;
    for (int round = 0; round < kRounds; ++round) {
        for (int cpu = 0; cpu < kCpus; ++cpu) {
            for (int i = 0; i < kPerCpu; ++i) {
                r.switch_(t + static_cast<uint64_t>(i * kCpus + cpu), static_cast<uint32_t>(cpu), 10, 11, 1, 0);
                if (i % 5000 == 0) r.w.comm(r.sw, 10, 11, "c" + std::to_string(round * 100 + cpu * 10 + i / 5000), 0);
            }
        }
        r.w.finished_round();
        t += kPerCpu * kCpus;
    }
    struct Sequence : EventSink {
        std::vector<std::string> seen;
        size_t samples = 0;
        void on_sample(const Sample& s, const EventInfo&) override {
            seen.push_back(std::to_string(s.time));
            ++samples;
        }
        void on_comm(const CommEvent& e) override { seen.emplace_back(e.comm); }
    };
    TempFile f(r.w.build());
    Sequence got[2];
    for (int threaded = 0; threaded < 2; ++threaded) {
        Session s(f.path);
        s.set_threaded(threaded == 1);
        s.run(got[threaded]);
        CHECK(s.stats().out_of_order == 0);
        CHECK(s.stats().malformed == 0);
    }
    REQUIRE(got[0].samples == size_t{kRounds} * kCpus * kPerCpu);
    REQUIRE(got[0].seen.size() == got[0].samples + size_t{kRounds} * kCpus * 3);
    CHECK(got[0].seen.front() == "c0");  // read before anything was released
    CHECK(got[1].seen == got[0].seen);
}

TEST_CASE("the reader's idle work runs on its thread while the stages' queue is full, and changes nothing delivered") {
    SchedRecording r;
    constexpr int kCpus = 2, kPerCpu = 30000;  // some 6 MB: more than may be in flight
    for (int cpu = 0; cpu < kCpus; ++cpu)
        for (int i = 0; i < kPerCpu; ++i)
            r.switch_(1000 + static_cast<uint64_t>(i * kCpus + cpu), static_cast<uint32_t>(cpu), 10, 11, 1, 0);
    r.w.finished_round();
    TempFile f(r.w.build());
    // The stages stall at their first sample until the reader has found the
    // queue full and run out of idle work (not for a fixed time: on a loaded
    // machine, under a sanitizer, the reader may take longer than any sleep
    // to fill the queue).
    struct Slow : Times {
        const std::atomic<int>* calls = nullptr;  // null: inline, nobody to wait for
        bool waited = false;
        void on_sample(const Sample& s, const EventInfo& ev) override {
            if (!waited && calls) {
                waited = true;
                const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                while (calls->load() < 4 && std::chrono::steady_clock::now() < give_up)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            Times::on_sample(s, ev);
        }
    };
    Slow got[2];
    for (int threaded = 0; threaded < 2; ++threaded) {
        CAPTURE(threaded);
        Session s(f.path);
        s.set_threaded(threaded == 1);
        std::atomic<int> calls{0}, on_main{0};
        const auto main_id = std::this_thread::get_id();
        s.set_reader_idle([&] {
            on_main += std::this_thread::get_id() == main_id;
            return ++calls <= 3;  // some work three times, then nothing left
        });
        if (threaded) got[threaded].calls = &calls;
        s.run(got[threaded]);
        CHECK(on_main == 0);
        if (threaded)
            CHECK(calls >= 4);  // until it had nothing left, then it waited
        else
            CHECK(calls == 0);  // nobody to wait for inline
    }
    REQUIRE(got[0].times.size() == size_t{kCpus} * kPerCpu);
    CHECK(got[1].times == got[0].times);
}

TEST_CASE("after its last record the reader does the stages' idle work until they are done") {
    SchedRecording r;
    constexpr int kRecords = 2000;
    for (int i = 0; i < kRecords; ++i) r.switch_(1000 + static_cast<uint64_t>(i), 0, 10, 11, 1, 0);
    r.w.finished_round();
    TempFile f(r.w.build());
    // At the last record the stages wait until the reader has asked for
    // idle work three more times: it has read everything by then, and
    // still works for the stages (the trace's last blocks, at -j 2) while
    // they finish. A reader that stopped at the end would never ask again
    // (the wait gives up after 60 s, and the check fails).
    struct Last : Times {
        std::atomic<int>* calls = nullptr;
        int left = kRecords;
        bool saw_more = false;
        void on_sample(const Sample& s, const EventInfo& ev) override {
            if (--left == 0) {
                const int at = calls->load();
                const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                while (calls->load() < at + 3 && std::chrono::steady_clock::now() < give_up)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                saw_more = calls->load() >= at + 3;
            }
            Times::on_sample(s, ev);
        }
    };
    for (bool has_work : {false, true}) {
        CAPTURE(has_work);  // no work left (it looks again), or always some (it stops when the stages are done)
        Session s(f.path);
        s.set_threaded(true);
        std::atomic<int> calls{0};
        s.set_reader_idle([&] {
            ++calls;
            return has_work;
        });
        Last got;
        got.calls = &calls;
        s.run(got);  // returns: the reader stopped once the stages were done
        CHECK(got.saw_more);
        CHECK(got.times.size() == size_t{kRecords});
    }
}

TEST_CASE("Handoff: batches arrive in order, come back, and an abort stops the producer") {
    Handoff<std::vector<int>> h(2);
    std::vector<int> got;
    std::thread producer([&] {
        for (int b = 0; b < 50; ++b) {
            std::vector<int> batch{b * 2, b * 2 + 1};
            REQUIRE(h.push(std::move(batch)));
            if (b == 25) CHECK(h.wait_idle());
        }
        h.close();
    });
    std::vector<int> batch;
    while (h.pop(batch)) {
        got.insert(got.end(), batch.begin(), batch.end());
        h.done(std::move(batch));
    }
    producer.join();
    REQUIRE(got.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(got[static_cast<size_t>(i)] == i);
    std::vector<int> back;
    CHECK(h.take_done(back));

    Handoff<std::vector<int>> g(1);
    std::thread p2([&] {
        int pushed = 0;
        while (g.push(std::vector<int>{pushed})) ++pushed;
        CHECK(pushed < 1000);
    });
    std::vector<int> one;
    CHECK(g.pop(one));
    g.abort();
    p2.join();
}

TEST_CASE("Handoff: a byte budget holds the producer back, and a batch larger than it still goes") {
    Handoff<std::vector<int>> h(64, 100);
    std::atomic<int> pushed{0};
    std::thread producer([&] {
        REQUIRE(h.push(std::vector<int>{0}, 60));
        ++pushed;
        REQUIRE(h.push(std::vector<int>{1}, 60));  // 120 > 100: waits for the first to be taken
        ++pushed;
        REQUIRE(h.push(std::vector<int>{2}, 500));  // over the budget alone: goes once the queue is empty
        ++pushed;
        h.close();
    });
    // Up to a minute for the first push (a loaded machine, a sanitizer), then
    // time for a second push that must not happen.
    for (int i = 0; i < 12000 && pushed.load() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(pushed.load() == 1);  // the second batch is held back
    std::vector<int> b;
    std::vector<int> got;
    while (h.pop(b)) {
        got.insert(got.end(), b.begin(), b.end());
        h.done(std::move(b));
    }
    producer.join();
    CHECK(got == std::vector<int>{0, 1, 2});
}

TEST_CASE("Handoff: pop() with idle work does it while nothing is queued, and wakes for a nudge or a batch") {
    Handoff<std::vector<int>> h(4);
    std::mutex mu;
    std::vector<int> work;  // idle work: numbers to move to done
    std::vector<int> done;
    auto idle = [&] {
        std::lock_guard<std::mutex> l(mu);
        if (work.empty()) return false;
        done.push_back(work.back());
        work.pop_back();
        return true;
    };
    std::atomic<int> stage{0};
    std::thread producer([&] {
        {
            std::lock_guard<std::mutex> l(mu);
            work = {1, 2, 3};
        }
        h.nudge();
        // Until the consumer has done it all (up to a minute on a loaded machine).
        for (int i = 0; i < 12000; ++i) {
            {
                std::lock_guard<std::mutex> l(mu);
                if (done.size() == 3) break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        stage = 1;
        REQUIRE(h.push(std::vector<int>{7}));
        h.close();
    });
    std::vector<int> b;
    REQUIRE(h.pop(b, idle));  // the idle work first (nothing is queued until it is done), then the batch
    CHECK(stage.load() == 1);
    CHECK(b == std::vector<int>{7});
    {
        std::lock_guard<std::mutex> l(mu);
        CHECK(done == std::vector<int>{3, 2, 1});
    }
    CHECK_FALSE(h.pop(b, idle));  // closed
    producer.join();

    // A batch already queued goes first; the idle work left waits for the next pop.
    Handoff<std::vector<int>> g(4);
    REQUIRE(g.push(std::vector<int>{5}));
    {
        std::lock_guard<std::mutex> l(mu);
        work = {9};
        done.clear();
    }
    g.nudge();
    REQUIRE(g.pop(b, idle));
    CHECK(b == std::vector<int>{5});
    {
        std::lock_guard<std::mutex> l(mu);
        CHECK(done.empty());
    }
    std::thread p2([&] {
        for (int i = 0; i < 12000; ++i) {
            {
                std::lock_guard<std::mutex> l(mu);
                if (!done.empty()) break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        REQUIRE(g.push(std::vector<int>{6}));
        g.close();
    });
    REQUIRE(g.pop(b, idle));  // the work left over, without a new nudge; then the batch
    CHECK(b == std::vector<int>{6});
    p2.join();
    std::lock_guard<std::mutex> l(mu);
    CHECK(done == std::vector<int>{9});
}

TEST_CASE("with a reader thread, MMAP records reach set_mmap_seen as read, and its work the stages' idle function") {
    SchedRecording r;
    r.w.mmap2(r.sw, 10, 0x400000, 0x2000, 0, 5, "/usr/bin/python3.11", 1);  // PROT_READ|PROT_EXEC
    r.w.mmap2(r.sw, 10, 0x7f0000000000, 0x2000, 0, 5, "/usr/lib/x86_64-linux-gnu/libc.so.6", 2);
    r.w.mmap2(r.sw, 10, 0x7f0000100000, 0x2000, 0, 1, "/tmp/data.bin", 3);  // PROT_READ: data
    for (uint64_t t = 1; t <= 20000; ++t) {
        r.switch_(10 + t * 10, static_cast<uint32_t>(t % 4), 10, 10, 1, 0);
        if (t % 1000 == 0) r.w.finished_round();
    }
    TempFile f(r.w.build());
    Session s(f.path);
    s.set_threaded(true);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> seen;
    bool idle_ran = false;
    std::atomic<uint64_t> samples{0};
    s.set_mmap_seen([&](const MmapEvent& e) {
        std::unique_lock<std::mutex> l(mu);
        seen.emplace_back(e.filename);
        if (seen.size() == 1) return true;  // work for the stages: they are nudged
        // The stages' thread, woken by that nudge, does it before any record
        // reaches it (none has been handed over yet): wait for it here.
        CHECK(cv.wait_for(l, std::chrono::seconds(60), [&] { return idle_ran; }));
        return false;
    });
    s.set_stages_idle([&] {
        std::lock_guard<std::mutex> l(mu);
        if (idle_ran || seen.empty()) return false;
        CHECK(samples.load() == 0);
        idle_ran = true;
        cv.notify_all();
        return true;
    });
    struct Count : EventSink {
        std::atomic<uint64_t>* n;
        void on_sample(const Sample&, const EventInfo&) override { ++*n; }
    } count;
    count.n = &samples;
    s.run(count);
    CHECK(samples.load() == 20000);
    std::lock_guard<std::mutex> l(mu);
    // The piece of work ran, before any record reached the stages. Whether
    // they ask again ("no more") is the reader's pace: a batch queued while
    // the work ran is taken first, and with the reader ahead the queue may
    // never run dry again before the end.
    CHECK(idle_ran);
    CHECK(seen == std::vector<std::string>{"/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/tmp/data.bin"});
}

// A stage that fails at its 5000th sample, as a full disk would.
struct ThrowsAt5000 : EventSink {
    int n = 0;
    void on_sample(const Sample&, const EventInfo&) override {
        if (++n == 5000) throw Error("stage", Error::no_offset, "disk full");
    }
};

TEST_CASE("a stage that throws stops the run, with or without the reader thread, and nothing hangs") {
    SchedRecording r;
    for (uint64_t t = 1; t <= 20000; ++t) r.switch_(t * 10, static_cast<uint32_t>(t % 4), 1, 2, 1, 0);
    TempFile f(r.w.build());
    for (bool threaded : {false, true}) {
        CAPTURE(threaded);
        Session s(f.path);
        s.set_threaded(threaded);
        ThrowsAt5000 t;
        CHECK_THROWS_WITH_AS(s.run(t), doctest::Contains("disk full"), Error);
        CHECK(t.n == 5000);
    }
}

TEST_CASE("a stage that throws while the reader hands over a long run of ready records: the reader stops too") {
    // No FINISHED_ROUND: every record waits in the ordering queue until the
    // end of the data, then goes out as one run of 300,000 ready records,
    // far more than the 64 batches the queue to the stages holds. When the
    // stages throw, the reader must stop handing that run over: a batch that
    // nothing can take would otherwise be filled for ever.
    SchedRecording r;
    for (uint64_t t = 1; t <= 300000; ++t) r.switch_(t * 10, static_cast<uint32_t>(t % 4), 1, 2, 1, 0);
    TempFile f(r.w.build());
    Session s(f.path);
    s.set_threaded(true);
    ThrowsAt5000 t;
    auto done = std::async(std::launch::async, [&] {
        try {
            s.run(t);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    });
    // A hang cannot be failed and then left behind: the reader thread would
    // keep the test binary alive.
    if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
        std::fprintf(stderr, "session_test: Session::run did not return after a stage threw (the reader hangs)\n");
        std::abort();
    }
    CHECK(done.get().find("disk full") != std::string::npos);
    CHECK(t.n == 5000);
}

