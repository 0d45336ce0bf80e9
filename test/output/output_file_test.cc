// OutputFile: all-or-nothing, buffered through a writer thread (or not), O_DIRECT in
// whole blocks where the filesystem allows it, compressed by name.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>


#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zstd.h>

#include "gilscan/error.h"
#include "gilscan/output/output_file.h"
#include "support/perf_writer.h"

using namespace gilscan;
using gilscan::test::slurp;
namespace fs = std::filesystem;

namespace {

// Next to the build: a real disk filesystem (O_DIRECT works there), unlike
// tmpfs. Every test removes its files; the directory goes when the tests end
// (only if empty: what a failed test left stays to be looked at).
fs::path scratch(const std::string& name) {
    struct Dir {
        fs::path path = fs::current_path() / "output_file_test.tmp";
        ~Dir() {
            std::error_code ec;
            fs::remove(path, ec);
        }
    };
    static const Dir d;
    fs::create_directories(d.path);
    return d.path / name;
}

// Whether the scratch directory takes O_DIRECT (then OutputFile without a
// writer thread must write asynchronously).
bool direct_io_works() {
    const fs::path p = scratch("probe");
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0666);
    if (fd >= 0) ::close(fd);
    fs::remove(p);
    return fd >= 0;
}

// The file holds exactly `expect`; then it is removed.
void check_and_remove(const fs::path& p, const std::string& expect) {
    REQUIRE(fs::exists(p));
    CHECK(fs::file_size(p) == expect.size());
    CHECK(slurp(p) == expect);
    fs::remove(p);
}

// Neither the file nor a temporary of it (".NAME.gilscan-*") is left.
void check_nothing_left(const fs::path& p) {
    CHECK(!fs::exists(p));
    const std::string name = p.filename().string();
    for (const auto& e : fs::directory_iterator(p.parent_path()))
        CHECK(e.path().filename().string().find(name) == std::string::npos);
}

}  // namespace

TEST_CASE("output: many buffers of odd-sized writes and room()/advance() come out byte for byte") {
    // With the writer thread, and without (-j 1: written on the caller's thread).
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("big.json");
    std::string expect;
    std::mt19937 rng(7);
    {
        OutputFile out(p.string(), writer_thread);
        // The largest room() there is, asked for just short of the fill
        // level (half a buffer, below 64 MiB) and just past it.
        for (size_t before : {size_t{(2u << 20) - 1}, size_t{4097}}) {
            out.write(std::string(before, 'p'));
            char* at = out.room(OutputFile::kBufferSize / 2);
            std::memset(at, 'q', OutputFile::kBufferSize / 2);
            out.advance(OutputFile::kBufferSize / 2);
            expect += std::string(before, 'p') + std::string(OutputFile::kBufferSize / 2, 'q');
        }
        // ~75 MiB: many buffers, block-aligned hand-offs with carried
        // tails, written plainly and then (from 64 MiB, no writer thread)
        // asynchronously, and an unaligned end written after leaving direct I/O.
        while (expect.size() < (72u << 20) + 1234) {
            std::string piece(1 + rng() % 5000, static_cast<char>('a' + rng() % 26));
            if (rng() % 2) {
                out.write(piece);
            } else {
                char* at = out.room(piece.size());
                std::memcpy(at, piece.data(), piece.size());
                out.advance(piece.size());
            }
            expect += piece;
        }
        out.write(std::string(3u << 20, 'z'));  // one write larger than half a buffer
        expect += std::string(3u << 20, 'z');
        CHECK(!fs::exists(p));  // nothing under the final name before commit
        // -j 1 on a disk that takes direct I/O: past 64 MiB the buffers go out by io_submit.
        CHECK(expect.size() > OutputFile::kAsyncFrom + (4u << 20));
        CHECK(out.async_io() == (!writer_thread && direct_io_works()));
        out.commit();
        CHECK(out.bytes_written() == expect.size());
    }
    check_and_remove(p, expect);
}

namespace {

// In a child process (a seccomp filter cannot be removed again): the system
// call `nr` fails with EINVAL from now on, as on a kernel or filesystem
// without Linux AIO. Returns false if the filter could not be installed.
bool refuse_syscall(long nr) {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace

TEST_CASE("output: Linux AIO refused (io_setup or io_submit fails): the rest is written plainly, byte for byte") {
#if !defined(__x86_64__)
    MESSAGE("seccomp filter written for x86-64 only");
    return;
#else
    if (!direct_io_works()) {
        MESSAGE("the scratch directory takes no O_DIRECT: no asynchronous writes to refuse");
        return;
    }
    long nr = SYS_io_setup;
    SUBCASE("io_setup refused") {}
    SUBCASE("io_submit refused") { nr = SYS_io_submit; }
    CAPTURE(nr);
    const fs::path p = scratch("refused.json");
    std::string expect;
    for (int i = 0; expect.size() < (72u << 20) + 777; ++i) expect += static_cast<char>('a' + i % 23);
    // Child's exit codes: 0 written plainly and committed, 1 no filter,
    // 2 still asynchronous, 3 an exception.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        if (!refuse_syscall(nr)) ::_exit(1);
        try {
            OutputFile out(p.string(), false);
            for (size_t at = 0; at < expect.size(); at += 1u << 20) out.write(std::string_view(expect).substr(at, 1u << 20));
            const bool async = out.async_io();
            out.commit();
            ::_exit(async ? 2 : 0);
        } catch (...) {
            ::_exit(3);
        }
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    check_and_remove(p, expect);
#endif
}

TEST_CASE("output: whole buffers and nothing after them: the file is cut to its size") {
    // Asynchronous writes extend the file 64 MiB ahead; commit() cuts it back
    // even when no unaligned tail is left to append.
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("aligned.json");
    std::string expect;
    for (int i = 0; expect.size() < (72u << 20); ++i) expect += static_cast<char>('a' + i % 26);
    {
        OutputFile out(p.string(), writer_thread);
        out.write(expect);
        CHECK(out.async_io() == (!writer_thread && direct_io_works()));
        out.commit();
    }
    check_and_remove(p, expect);
}

TEST_CASE("output: a write the system refuses is an error, and no file is left") {
    // RLIMIT_FSIZE makes writes (and the asynchronous path's ftruncate ahead,
    // from 64 MiB) past 68 MiB fail with EFBIG; SIGXFSZ is ignored so that
    // they return.
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("toolarge.json");
    std::optional<test::FileSizeLimit> limit(68u << 20);
    bool threw = false;
    try {
        OutputFile out(p.string(), writer_thread);
        for (int i = 0; i < 80; ++i) out.write(std::string(1u << 20, 'x'));
        out.commit();
    } catch (const Error& e) {
        threw = true;
        CHECK(std::string(e.what()).find("write failed") != std::string::npos);
    }
    limit.reset();
    CHECK(threw);
    check_nothing_left(p);
}

TEST_CASE("output: no commit, no file (not even the temporary)") {
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("abandoned.json");
    {
        OutputFile out(p.string(), writer_thread);
        out.write(std::string(9u << 20, 'x'));
    }
    check_nothing_left(p);
}

TEST_CASE("output: .zst by name decompresses to what was written") {
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("t.json.zst");
    std::string expect;
    {
        OutputFile out(p.string(), writer_thread);
        for (int i = 0; i < 200000; ++i) {
            std::string line = "{\"i\":" + std::to_string(i) + "},\n";
            out.write(line);
            expect += line;
        }
        out.commit();
    }
    const std::string z = slurp(p);
    const unsigned long long n = ZSTD_getFrameContentSize(z.data(), z.size());
    std::string got;
    if (n != ZSTD_CONTENTSIZE_UNKNOWN && n != ZSTD_CONTENTSIZE_ERROR) {
        got.resize(n);
        got.resize(ZSTD_decompress(got.data(), got.size(), z.data(), z.size()));
    } else {
        ZSTD_DCtx* d = ZSTD_createDCtx();
        ZSTD_inBuffer in{z.data(), z.size(), 0};
        std::vector<char> buf(1 << 16);
        while (in.pos < in.size) {
            ZSTD_outBuffer o{buf.data(), buf.size(), 0};
            REQUIRE(!ZSTD_isError(ZSTD_decompressStream(d, &o, &in)));
            got.append(buf.data(), o.pos);
        }
        ZSTD_freeDCtx(d);
    }
    CHECK(got == expect);
    fs::remove(p);
}

TEST_CASE("output: a directory that does not exist is an error at open") {
    CHECK_THROWS_AS(OutputFile("/nonexistent-dir/x.json"), Error);
}

namespace {

// A private character device equal to /dev/null (1,3), in the scratch
// directory: if OutputFile renamed over it, only this node is lost, never the
// machine's /dev/null (the tests run as root). Empty if mknod is not allowed.
std::optional<fs::path> private_null(const std::string& name) {
    const fs::path p = scratch(name);
    if (::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) return std::nullopt;
    const int fd = ::open(p.c_str(), O_WRONLY);  // a nodev mount makes the node but refuses it
    if (fd < 0) {
        fs::remove(p);
        return std::nullopt;
    }
    ::close(fd);
    return p;
}

bool is_char_device(const fs::path& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

}  // namespace

TEST_CASE("output: a character device (/dev/null) is written as it is, never replaced by a file") {
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const auto dev = private_null("null");
    if (!dev) {
        MESSAGE("no usable device node here (not root, or a nodev mount): the FIFO case below covers writing in place");
        return;
    }
    {
        OutputFile out(dev->string(), writer_thread);
        out.write(std::string(9u << 20, 'x'));  // several buffers through the writer
        out.commit();
        CHECK(out.bytes_written() == (9u << 20));
    }
    CHECK(is_char_device(*dev));
    for (const auto& e : fs::directory_iterator(dev->parent_path()))  // no temporary beside it
        CHECK(e.path().filename().string().find("null.tmp.") == std::string::npos);
    {
        OutputFile out(dev->string(), writer_thread);  // abandoned: the device stays
        out.write(std::string(100, 'y'));
    }
    CHECK(is_char_device(*dev));
    fs::remove(*dev);
}

TEST_CASE("output: a FIFO gets every byte in order and stays a FIFO") {
    bool writer_thread = true;
    SUBCASE("writer thread") {}
    SUBCASE("no writer thread") { writer_thread = false; }
    const fs::path p = scratch("pipe");
    REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    std::string got;
    std::thread reader([&] {
        std::ifstream in(p, std::ios::binary);
        std::ostringstream all;
        all << in.rdbuf();
        got = all.str();
    });
    // The test keeps a write end of its own open until the output is done:
    // the reader then always reaches end-of-file, with the bytes if they went
    // into the FIFO, with none if they went elsewhere (a temporary renamed over
    // its name), so a wrong OutputFile fails the test instead of hanging it.
    int ours = ::open(p.c_str(), O_WRONLY);  // waits for the reader's open
    // On every way out (an OutputFile that throws too): our end closed, the
    // reader joined, so a failure is this test's, not std::terminate's.
    struct Finish {
        int& fd;
        std::thread& t;
        void operator()() {
            if (fd >= 0) ::close(fd);
            fd = -1;
            if (t.joinable()) t.join();
        }
        ~Finish() { (*this)(); }
    } finish{ours, reader};
    REQUIRE(ours >= 0);
    std::string expect;
    {
        OutputFile out(p.string(), writer_thread);
        for (int i = 0; expect.size() < (10u << 20) + 77; ++i) {
            std::string line = "{\"i\":" + std::to_string(i) + "},\n";
            out.write(line);
            expect += line;
        }
        out.commit();
    }
    finish();
    CHECK(got.size() == expect.size());
    CHECK((got == expect));  // not decomposed: doctest would print 10 MiB twice
    struct stat st {};
    CHECK((::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)));
    fs::remove(p);
}
