#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "support/perf_writer.h"

namespace gilscan::test {

TempFile::TempFile(const std::vector<uint8_t>& bytes, const std::string& suffix) {
    char tmpl[] = "/tmp/gilscan-test-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    std::remove(tmpl);
    path = std::string(tmpl) + suffix;
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TempFile::~TempFile() { std::remove(path.c_str()); }

}  // namespace gilscan::test
