#include "gilscan/symbols/preload.h"

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

bool is_python_path(std::string_view path) {
    const size_t slash = path.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
    return base.rfind("python", 0) == 0 || base.rfind("libpython", 0) == 0;
}

bool ModulePreloader::on_mmap(const MmapEvent& e) {
    // The kernel's own maps (pid -1), data maps and anonymous ones: nothing to load.
    if (e.pid <= 0 || !e.executable || !names_a_file(e.filename)) return false;
    if (!python_pids_.count(e.pid)) {
        if (!is_python_path(e.filename)) return false;
        python_pids_.insert(e.pid);
    }
    if (queued_ >= kMaxModules) return false;
    Mapping m;
    m.path = std::string(e.filename);
    m.build_id = to_hex(Bytes(e.build_id, e.build_id_size));
    if (!seen_.insert(m.path + '\0' + m.build_id).second) return false;
    m.start = e.start;
    m.end = e.start + e.len;
    m.pgoff = e.pgoff;
    m.ino = e.ino;
    ++queued_;
    std::lock_guard<std::mutex> l(mu_);
    waiting_.push_back(std::move(m));
    return true;
}

bool ModulePreloader::work() {
    Mapping m;
    {
        std::lock_guard<std::mutex> l(mu_);
        if (waiting_.empty()) return false;
        m = std::move(waiting_.front());
        waiting_.pop_front();
    }
    if (modules_.preload(m)) {
        std::lock_guard<std::mutex> l(mu_);
        ++loaded_;
    }
    return true;
}

size_t ModulePreloader::loaded() const {
    std::lock_guard<std::mutex> l(mu_);
    return loaded_;
}

}  // namespace gilscan
