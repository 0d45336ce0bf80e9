// A pipe-mode recording read as a stream (MappedFile::Stream: gilscan top
// reads perf record -o - as perf writes it): the same records as the file,
// whatever pieces the writer writes, and each round delivered at its end.
#include <fcntl.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include "session_fixtures.h"

namespace {

// Writes bytes into a pipe in pieces of `piece` bytes, a short pause
// between them; `hold_at`: stops there until `go` is set (or a timeout).
struct PipeWriter {
    int fds[2] = {-1, -1};
    std::thread t;
    std::atomic<bool> go{false};
    PipeWriter(std::vector<uint8_t> bytes, size_t piece, size_t hold_at = SIZE_MAX) {
        REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
        t = std::thread([this, bytes = std::move(bytes), piece, hold_at] {
            for (size_t at = 0; at < bytes.size();) {
                if (at >= hold_at) {
                    for (int i = 0; i < 500 && !go; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                }
                size_t n = std::min(piece, bytes.size() - at);
                if (at < hold_at) n = std::min(n, hold_at - at);
                const ssize_t w = ::write(fds[1], bytes.data() + at, n);
                if (w <= 0) break;
                at += static_cast<size_t>(w);
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
            ::close(fds[1]);
        });
    }
    ~PipeWriter() { t.join(); }
};

Times read_file(const std::vector<uint8_t>& bytes) {
    TempFile f(bytes);
    Session s(f.path);
    Times t;
    s.run(t);
    return t;
}

}  // namespace

TEST_CASE("a pipe-mode stream: the file's records, whatever pieces it arrives in, any chunk size") {
    for (bool swap : {false, true}) {
        const std::vector<uint8_t> bytes = small(swap).w.build_pipe();
        const Times want = read_file(bytes);
        REQUIRE(want.times.size() == 4);
        for (size_t piece : {1u, 7u, 64u, 100000u}) {
            for (size_t chunk : {0u, 65u, 333u}) {
                CAPTURE(swap);
                CAPTURE(piece);
                CAPTURE(chunk);
                PipeWriter w(bytes, piece);
                int waits = 0;
                Session s("stream", MappedFile::Stream{w.fds[0], [&waits](uint64_t) { ++waits; }});
                CHECK(s.header().pipe);
                if (chunk) s.set_chunk_size(chunk);
                Times got;
                s.run(got);
                CHECK(got.times == want.times);
                CHECK(got.names == want.names);
                CHECK(got.comms == want.comms);
                CHECK(s.stats().warnings.empty());
                CHECK_FALSE(s.stats().truncated);
                CHECK(waits > 0);
            }
        }
    }
}

TEST_CASE("a stream's rounds reach the sink at their end, before the writer has written more") {
    SchedRecording r;
    r.switch_(100, 0, 10, 11, 1, 0);
    r.w.finished_round();
    r.switch_(200, 1, 10, 12, 1, 0);
    r.w.finished_round();
    const std::vector<uint8_t> head = r.w.build_pipe();
    r.switch_(300, 0, 10, 11, 1, 0);
    r.w.finished_round();
    const std::vector<uint8_t> bytes = r.w.build_pipe();
    REQUIRE(std::equal(head.begin(), head.end(), bytes.begin()));
    // Held after the second round's end: perf's rule releases the first
    // round's records (up to the previous round's latest time) there.
    PipeWriter w(bytes, 1 << 20, head.size());
    struct Watch : Times {
        PipeWriter* w;
        size_t seen_while_held = 0;
        void on_sample(const Sample& s, const EventInfo& ev) override {
            Times::on_sample(s, ev);
            if (!w->go) ++seen_while_held;
            w->go = true;
        }
    } watch;
    watch.w = &w;
    Session s("stream", MappedFile::Stream{w.fds[0], nullptr});
    s.run(watch);
    CHECK(watch.seen_while_held == 1);  // the first round's sample, while the writer held the rest back
    CHECK(watch.times == std::vector<uint64_t>{100, 200, 300});
}

TEST_CASE("a stream that is not pipe mode, or is empty, is an error") {
    {
        const std::vector<uint8_t> file = small().w.build();
        PipeWriter w(file, 4096);
        CHECK_THROWS_WITH_AS(Session("stream", MappedFile::Stream{w.fds[0], nullptr}),
                             doctest::Contains("not a pipe-mode recording"), Error);
    }
    {
        PipeWriter w({}, 1);
        CHECK_THROWS_WITH_AS(Session("stream", MappedFile::Stream{w.fds[0], nullptr}),
                             doctest::Contains("ended before any data"), Error);
    }
}

TEST_CASE("a stream cut inside a record: the records before it, and a warning") {
    const std::vector<uint8_t> bytes = small().w.build_pipe();
    std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 10);
    PipeWriter w(cut, 50);
    Session s("stream", MappedFile::Stream{w.fds[0], nullptr});
    Times got;
    s.run(got);
    CHECK(got.times.size() == 3);
    CHECK(s.stats().truncated);
}

TEST_CASE("a stream found empty: the records waiting to be ordered go to the sink up to perf's flushed time") {
    // 100 ends a round, 200 does not: both wait for the next round's end
    // (perf's rule) while the writer holds. perf's flushed time (gilscan
    // top's pings) lets those up to it go once a wait finds the stream empty.
    struct Case {
        uint64_t flushed;       // what the pings proved (0: nothing yet)
        size_t while_held;      // records delivered before the writer goes on
    };
    for (const Case c : {Case{0, 0}, Case{150, 1}, Case{250, 2}}) {
        CAPTURE(c.flushed);
        SchedRecording r;
        r.switch_(100, 0, 10, 11, 1, 0);
        r.w.finished_round();
        r.switch_(200, 1, 10, 12, 1, 0);
        const std::vector<uint8_t> head = r.w.build_pipe();
        r.switch_(300, 0, 10, 11, 1, 0);
        r.w.finished_round();
        PipeWriter w(r.w.build_pipe(), 1 << 20, head.size());
        Times got;
        size_t idle_waits = 0, while_held = SIZE_MAX;
        uint64_t delivered_while_held = 0;
        Session* session = nullptr;
        Session s("stream", MappedFile::Stream{w.fds[0], [&](uint64_t idle) {
                      // Three empty waits while held (the first may find the
                      // writer's last bytes still coming): then it goes on.
                      if (idle == 0 || w.go || ++idle_waits < 3) return;
                      while_held = got.times.size();
                      delivered_while_held = session->delivered_to();
                      w.go = true;
                  }},
                  [&c] { return c.flushed; });
        session = &s;
        s.run(got);
        CHECK(while_held == c.while_held);
        CHECK(delivered_while_held == c.flushed);
        CHECK(got.times == std::vector<uint64_t>{100, 200, 300});
        CHECK(s.stats().out_of_order == 0);
    }
}
