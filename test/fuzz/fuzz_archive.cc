// libFuzzer target over batch's archive handling (unpack_zstd_archive):
// any input must unpack to at most the bound or throw gilscan::Error, never
// crash, hang, leave a file behind or write past the bound.
//
//   build-fuzz/test/fuzz_archive -max_len=65536 test/fuzz/archive_corpus
//
// Replayed over test/fuzz/archive_corpus by fuzz_replay.cc as an ordinary
// test in every build.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "gilscan/cli/batch.h"
#include "gilscan/error.h"

namespace {
void require(bool ok) {
    if (!ok) __builtin_trap();
}
std::string work_dir() {
    static const std::string d = [] {
        static char t[] = "/tmp/gilscan-fuzz-archive-XXXXXX";
        if (!::mkdtemp(t)) std::abort();
        std::atexit([] { ::rmdir(t); });
        return std::string(t);
    }();
    return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    constexpr uint64_t kBound = 1u << 20;
    const std::string dir = work_dir(), in = dir + "/in.data.zst";
    std::FILE* f = std::fopen(in.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
        const int fd = gilscan::unpack_zstd_archive(in, dir, kBound);
        struct stat st {};
        require(::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) <= kBound);
        ::close(fd);
    } catch (const gilscan::Error&) {
    }
    std::remove(in.c_str());
    // Nothing of the unpacking is left under dir.
    require(std::filesystem::is_empty(dir));
    return 0;
}
