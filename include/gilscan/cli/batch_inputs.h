// The recordings a `gilscan batch` analyses, and this job's share of them.
//
//   std::vector<BatchInput> all = batch_inputs({"archive/", "x.data"});
//   std::vector<BatchInput> mine = shard_of(all, Shard::parse("2/8"));
//
// A directory is searched recursively for *.data, *.data.zst and
// perf.data*, in sorted order; a file named explicitly is taken whatever its
// name. --shard K/N keeps the recordings whose key hashes (FNV-1a, 64 bits)
// to K-1 modulo N: N jobs given the same PATHs (a Slurm array, a Kubernetes
// indexed Job, GNU parallel) split an archive between them, each recording
// in exactly one share, with no coordinator. The key is the path below the
// directory it was found in (a file named explicitly: the path as given), so
// the share does not depend on where each job mounts the archive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gilscan {

struct BatchInput {
    std::string path;  // what is opened
    std::string key;   // what the share is decided by
    size_t index = 0;  // its place among all the inputs (trace names), whatever the share
};

struct Shard {
    uint32_t k = 1, n = 1;  // share k of n, from 1
    // "K/N" with 1 <= K <= N <= 2^20; throws UsageError otherwise.
    static Shard parse(const std::string& text);
    bool all() const { return n == 1; }
};

std::vector<BatchInput> batch_inputs(const std::vector<std::string>& paths);

// The inputs in share s, in their order.
std::vector<BatchInput> shard_of(const std::vector<BatchInput>& inputs, Shard s);

// FNV-1a, 64 bits: stable across machines and builds (the shares depend on it).
uint64_t fnv1a64(const std::string& s);

}  // namespace gilscan
