// The shares of gilscan batch --shard: FNV-1a as published, each input in
// exactly one share, the share decided by the path below the directory.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "gilscan/cli/batch_inputs.h"
#include "gilscan/cli/options.h"
#include "support/perf_writer.h"

using namespace gilscan;

TEST_CASE("fnv1a64: the published test values") {
    CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
    CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
    CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
}

TEST_CASE("Shard::parse: K/N with 1 <= K <= N, anything else a usage error") {
    const Shard s = Shard::parse("2/8");
    CHECK(s.k == 2);
    CHECK(s.n == 8);
    CHECK(Shard::parse("1/1").all());
    for (const char* bad : {"0/3", "4/3", "3", "/3", "1/", "a/b", "-1/3", "1/3/4", "1/2000000", "1 /3"})
        CHECK_THROWS_AS(Shard::parse(bad), UsageError);
}

TEST_CASE("shard_of: every input in exactly one share, in order; the share by the path below its directory") {
    namespace fs = std::filesystem;
    test::TempDir dir("gilscan-shards");
    for (int i = 0; i < 60; ++i) {
        const fs::path p = dir.path / ("d" + std::to_string(i % 4)) / ("r" + std::to_string(i) + ".data");
        fs::create_directories(p.parent_path());
        std::ofstream(p) << "x";
    }
    std::ofstream(dir.path / "notes.txt") << "not a recording";
    const std::vector<BatchInput> all = batch_inputs({dir.path.string()});
    REQUIRE(all.size() == 60);
    for (size_t i = 0; i < all.size(); ++i) CHECK(all[i].index == i);
    std::multiset<std::string> seen;
    size_t biggest = 0;
    for (uint32_t k = 1; k <= 7; ++k) {
        const std::vector<BatchInput> mine = shard_of(all, {k, 7});
        biggest = std::max(biggest, mine.size());
        for (size_t i = 0; i < mine.size(); ++i) {
            seen.insert(mine[i].path);
            if (i) CHECK(mine[i - 1].index < mine[i].index);
            CHECK(mine[i].key.rfind("d", 0) == 0);  // below the directory: "d1/r5.data"
        }
    }
    CHECK(seen.size() == 60);
    CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == 60);
    CHECK(biggest < 20);  // spread, not all in one share
    // The same archive under another name: the same shares.
    const fs::path link = dir.path.parent_path() / (dir.path.filename().string() + "-mounted-elsewhere");
    fs::create_directory_symlink(dir.path, link);
    const std::vector<BatchInput> moved = batch_inputs({link.string() + "/"});
    REQUIRE(moved.size() == 60);
    for (uint32_t k = 1; k <= 7; ++k) {
        std::vector<std::string> a, b;
        for (const auto& in : shard_of(all, {k, 7})) a.push_back(in.key);
        for (const auto& in : shard_of(moved, {k, 7})) b.push_back(in.key);
        CHECK(a == b);
    }
    fs::remove(link);
}
