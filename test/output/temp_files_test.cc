// Temporaries and outputs: never through a planted name, gone after a signal,
// never over an input.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gilscan/error.h"
#include "gilscan/output/output_checks.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/temp_files.h"
#include "support/test_util.h"

using namespace gilscan;
namespace fs = std::filesystem;

namespace {

struct ScratchDir {
    fs::path path;
    explicit ScratchDir(const std::string& name) : path(fs::current_path() / name) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~ScratchDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path), {})); }
};

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

}  // namespace

TEST_CASE("temporaries: random names, created exclusively, a planted symlink is never followed") {
    ScratchDir d("temp_files_test.planted");
    const std::string a = random_hex(), b = random_hex();
    CHECK(a.size() == 16);
    CHECK(a != b);
    std::string name;
    const int fd = create_named_temporary(d.path.string(), "out.json", O_WRONLY, 0600, &name);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK(fs::path(name).filename().string().rfind(".out.json.gilscan-", 0) == 0);
    remove_temporary(name);
    CHECK(d.entries() == 0);

    // The name a run used to take (NAME.tmp.PID) planted as a symlink to a
    // file of root's: the output goes where it was asked, the victim unchanged.
    const fs::path victim = d.path / "victim";
    write_text(victim, "precious");
    fs::create_symlink(victim, d.path / ("trace.json.tmp." + std::to_string(::getpid())));
    {
        OutputFile out((d.path / "trace.json").string());
        out.write("{}");
        out.commit();
    }
    CHECK(test::slurp(victim) == "precious");
    CHECK(test::slurp(d.path / "trace.json") == "{}");
    CHECK(d.entries() == 3);  // victim, the symlink, trace.json: no temporary
}

TEST_CASE("temporaries: SIGTERM and SIGINT remove every registered temporary, and the process dies of the signal") {
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
        CAPTURE(sig);
        ScratchDir d("temp_files_test.signal");
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            for (int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_DFL);  // doctest's own handlers off
            remove_temporaries_on_signals();
            std::string n1, n2;
            const int f1 = create_named_temporary(d.path.string(), "a.json", O_WRONLY, 0600, &n1);
            const int f2 = create_named_temporary(d.path.string(), "b.json", O_WRONLY, 0600, &n2);
            if (f1 < 0 || f2 < 0) ::_exit(3);
            std::string kept;  // forgotten: renamed into place, no longer a temporary
            const int f3 = create_named_temporary(d.path.string(), "c.json", O_WRONLY, 0600, &kept);
            if (f3 < 0 || ::rename(kept.c_str(), (d.path / "c.json").c_str()) != 0) ::_exit(4);
            forget_temporary(kept);
            ::raise(sig);
            ::_exit(5);
        }
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        CHECK(WIFSIGNALED(status));
        CHECK(WTERMSIG(status) == sig);
        CHECK(d.entries() == 1);
        CHECK(fs::exists(d.path / "c.json"));
    }
}

TEST_CASE("outputs: one that is an input, by any spelling, or two outputs of one file, are refused") {
    ScratchDir d("temp_files_test.inputs");
    const fs::path in = d.path / "x.data";
    write_text(in, "PERFILE2");
    fs::create_symlink(in, d.path / "link.data");
    fs::create_hard_link(in, d.path / "hard.data");
    const std::vector<std::string> inputs{in.string()};
    for (const std::string& spelling : {in.string(), (d.path / "." / "x.data").string(),
                                        (d.path / "link.data").string(), (d.path / "hard.data").string()}) {
        CAPTURE(spelling);
        CHECK_THROWS_WITH_AS(check_outputs({{"-o", spelling}}, inputs), doctest::Contains("names the input"), Error);
    }
    CHECK_THROWS_WITH_AS(check_outputs({{"-o", (d.path / "t.json").string()},
                                        {"--summary-json", (d.path / "." / "t.json").string()}},
                                       inputs),
                         doctest::Contains("name the same file"), Error);
    CHECK_THROWS_AS(check_outputs({{"-o", "not-yet.json"}, {"--summary-json", "./not-yet.json"}}, inputs), Error);
    CHECK_NOTHROW(check_outputs({{"-o", "-"}, {"--summary-json", "-"}}, inputs));  // stdout is not a file
    CHECK_NOTHROW(check_outputs({{"-o", "/dev/null"}, {"--summary-json", "/dev/null"}}, inputs));
    CHECK_NOTHROW(check_outputs({{"-o", (d.path / "t.json").string()}, {"--summary-json", (d.path / "s.json").string()}},
                                inputs));
    CHECK(test::slurp(in) == "PERFILE2");
}
