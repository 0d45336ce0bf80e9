// ModulePreloader: which maps it queues (a Python process's executable file
// maps, each once), and that its work loads them into the module cache
// without recording anything there until the stages ask.
#include <doctest/doctest.h>

#include "gilscan/symbols/preload.h"

using namespace gilscan;

namespace {

MmapEvent map_of(int32_t pid, std::string_view path, bool exec = true) {
    MmapEvent e;
    e.pid = pid;
    e.tid = pid;
    e.start = 0x7f0000000000;
    e.len = 0x1000;
    e.executable = exec;
    e.filename = path;
    return e;
}

}  // namespace

TEST_CASE("is_python_path: the interpreter and its library, by the file's name") {
    CHECK(is_python_path("/usr/bin/python3.11"));
    CHECK(is_python_path("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"));
    CHECK(is_python_path("python3.12d"));
    CHECK_FALSE(is_python_path("/usr/lib/python3.11/lib-dynload/_struct.cpython-311-x86_64-linux-gnu.so"));
    CHECK_FALSE(is_python_path("/usr/bin/bash"));
    CHECK_FALSE(is_python_path("/opt/python/bin/ls"));
}

TEST_CASE("ModulePreloader: a Python process's executable maps from its Python on, each path once") {
    ModuleCache modules({});
    ModulePreloader pre(modules);
    CHECK_FALSE(pre.on_mmap(map_of(10, "/usr/lib/x86_64-linux-gnu/libc.so.6")));  // not (yet) a Python process
    CHECK_FALSE(pre.on_mmap(map_of(-1, "/usr/bin/python3.11")));                  // the kernel's maps
    CHECK(pre.on_mmap(map_of(20, "/nonexistent/bin/python3.11")));
    CHECK(pre.on_mmap(map_of(20, "/nonexistent/lib/libc.so.6")));
    CHECK_FALSE(pre.on_mmap(map_of(20, "/nonexistent/lib/libc.so.6")));            // once
    CHECK_FALSE(pre.on_mmap(map_of(20, "/nonexistent/lib/data.bin", false)));      // not executable
    CHECK_FALSE(pre.on_mmap(map_of(20, "//anon")));
    CHECK_FALSE(pre.on_mmap(map_of(20, "[vdso]")));
    CHECK_FALSE(pre.on_mmap(map_of(30, "/nonexistent/lib/libm.so.6")));           // another process, no Python
    CHECK(pre.on_mmap(map_of(30, "/nonexistent/lib/libpython3.11.so.1.0")));
    CHECK(pre.on_mmap(map_of(30, "/nonexistent/lib/libm.so.6")));                  // now it is one
    CHECK_FALSE(pre.on_mmap(map_of(30, "/nonexistent/lib/libc.so.6")));            // queued for pid 20 already
    CHECK(pre.queued() == 4);
    int pieces = 0;
    while (pre.work()) ++pieces;
    CHECK(pieces == 4);
    CHECK(pre.loaded() == 4);
    CHECK(modules.preloaded_unused() == 4);
    CHECK(modules.problems().empty());  // recorded when the stages ask, not before
    Mapping m;
    m.path = "/nonexistent/lib/libc.so.6";
    CHECK(modules.get(m) == nullptr);
    REQUIRE(modules.problems().size() == 1);
    CHECK(modules.problems()[0] == "/nonexistent/lib/libc.so.6: not found");
    CHECK(modules.preloaded_unused() == 3);
}

TEST_CASE("ModulePreloader: at most kMaxModules maps in all") {
    ModuleCache modules({});
    ModulePreloader pre(modules);
    std::vector<std::string> paths;
    for (size_t i = 0; i < ModulePreloader::kMaxModules + 10; ++i) paths.push_back("/nonexistent/lib" + std::to_string(i) + ".so");
    CHECK(pre.on_mmap(map_of(5, "/nonexistent/python3")));
    size_t queued = 1;
    for (const auto& p : paths) queued += pre.on_mmap(map_of(5, p)) ? 1 : 0;
    CHECK(queued == ModulePreloader::kMaxModules);
    CHECK(pre.queued() == ModulePreloader::kMaxModules);
}
