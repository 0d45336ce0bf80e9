#include "gilscan/cli/batch_inputs.h"

#include <algorithm>
#include <filesystem>

#include "gilscan/cli/options.h"

namespace gilscan {

namespace fs = std::filesystem;

namespace {

bool wanted(const fs::path& p) {
    const std::string name = p.filename().string();
    return name.ends_with(".data") || name.ends_with(".data.zst") || name.starts_with("perf.data");
}

}  // namespace

uint64_t fnv1a64(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

Shard Shard::parse(const std::string& text) {
    const size_t slash = text.find('/');
    const auto number = [&](const std::string& part) -> uint64_t {
        if (part.empty() || part.size() > 7 || part.find_first_not_of("0123456789") != std::string::npos)
            throw UsageError("--shard takes K/N (share K of N, 1 <= K <= N), not " + text);
        return std::stoull(part);
    };
    if (slash == std::string::npos) throw UsageError("--shard takes K/N (share K of N, 1 <= K <= N), not " + text);
    const uint64_t k = number(text.substr(0, slash)), n = number(text.substr(slash + 1));
    if (k < 1 || k > n || n > (1u << 20))
        throw UsageError("--shard takes K/N with 1 <= K <= N <= 1048576, not " + text);
    return {static_cast<uint32_t>(k), static_cast<uint32_t>(n)};
}

std::vector<BatchInput> batch_inputs(const std::vector<std::string>& paths) {
    std::vector<BatchInput> out;
    for (const auto& p : paths) {
        std::error_code ec;
        if (fs::is_directory(p, ec)) {
            std::vector<std::string> found;
            for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
                 it != fs::recursive_directory_iterator(); it.increment(ec)) {
                if (ec) break;
                if (it->is_regular_file(ec) && wanted(it->path())) found.push_back(it->path().string());
            }
            std::sort(found.begin(), found.end());
            for (auto& f : found) {
                const std::string key = fs::path(f).lexically_relative(p).generic_string();
                out.push_back({std::move(f), key, 0});
            }
        } else {
            out.push_back({p, p, 0});  // named explicitly: analysed whatever its name
        }
    }
    for (size_t i = 0; i < out.size(); ++i) out[i].index = i;
    return out;
}

std::vector<BatchInput> shard_of(const std::vector<BatchInput>& inputs, Shard s) {
    std::vector<BatchInput> mine;
    for (const BatchInput& in : inputs)
        if (fnv1a64(in.key) % s.n == s.k - 1) mine.push_back(in);
    return mine;
}

}  // namespace gilscan
