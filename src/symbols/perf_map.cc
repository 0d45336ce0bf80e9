#include "gilscan/symbols/perf_map.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <sys/stat.h>

#include "gilscan/error.h"
#include "gilscan/symbols/live_process.h"
#include "gilscan/perfdata/mapped_file.h"

namespace gilscan {

namespace {

bool take_space(std::string_view& s) {
    if (s.empty() || s[0] != ' ') return false;
    s.remove_prefix(1);
    return true;
}

// Whether two paths name one directory (both there, the same inode).
bool same_directory(const std::string& a, const std::string& b) {
    struct stat sa {}, sb {};
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

PerfMap PerfMap::parse(std::string_view text) {
    PerfMap m;
    while (!text.empty()) {
        const size_t nl = text.find('\n');
        std::string_view line = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        PerfMapSymbol s;
        // perf (util/symbol.c, dso__load_perf_map): START, one space, SIZE,
        // one space, then the name to the end of the line.
        if (!take_hex(line, s.start) || !take_space(line) || !take_hex(line, s.size) || !take_space(line) ||
            line.empty() || s.size == 0 || s.start + s.size < s.start) {
            ++m.skipped_;
            continue;
        }
        s.name.assign(line);
        m.symbols_.push_back(std::move(s));
    }
    // Stable: equal starts stay in file order, so the last written is last.
    std::stable_sort(m.symbols_.begin(), m.symbols_.end(),
                     [](const PerfMapSymbol& a, const PerfMapSymbol& b) { return a.start < b.start; });
    return m;
}

PerfMap PerfMap::from_jitdump(const JitDump& d) {
    PerfMap m;
    m.symbols_.reserve(d.codes.size());
    for (const JitCode& c : d.codes) {
        PerfMapSymbol sym{c.start, c.size, c.name};
        std::vector<JitCfiRow> rows = jit_cfi_rows(c);
        sym.cfi_first = static_cast<uint32_t>(m.cfi_.size());
        sym.cfi_count = static_cast<uint32_t>(rows.size());
        m.cfi_.insert(m.cfi_.end(), rows.begin(), rows.end());
        m.symbols_.push_back(std::move(sym));
    }
    std::stable_sort(m.symbols_.begin(), m.symbols_.end(),
                     [](const PerfMapSymbol& a, const PerfMapSymbol& b) { return a.start < b.start; });
    return m;
}

const PerfMapSymbol* PerfMap::find(uint64_t pc) const {
    auto it = std::upper_bound(symbols_.begin(), symbols_.end(), pc,
                               [](uint64_t v, const PerfMapSymbol& s) { return v < s.start; });
    if (it == symbols_.begin()) return nullptr;
    --it;
    return pc - it->start < it->size ? &*it : nullptr;
}

const CfiRule* PerfMap::cfi_at(uint64_t pc) const {
    const PerfMapSymbol* s = find(pc);
    if (!s || s->cfi_count == 0) return nullptr;
    return jit_cfi_at(std::span<const JitCfiRow>(cfi_).subspan(s->cfi_first, s->cfi_count), pc - s->start);
}

bool PerfMap::names_any(std::span<const std::pair<uint64_t, uint64_t>> ranges) const {
    // Ranges are disjoint and by start: the last one starting before a
    // symbol's end is the only one it can overlap.
    for (const PerfMapSymbol& s : symbols_) {
        const uint64_t end = s.start + s.size;  // parse() and from_jitdump() keep it from wrapping
        auto r = std::upper_bound(ranges.begin(), ranges.end(), end,
                                  [](uint64_t v, const std::pair<uint64_t, uint64_t>& x) { return v <= x.first; });
        if (r != ranges.begin() && std::prev(r)->second > s.start) return true;
    }
    return false;
}

bool is_jit_mapping(std::string_view path) {
    // perf 6.1's is_anon_memory() and is_no_dso_memory() (util/map.c): the
    // mappings map__new names /tmp/perf-PID.map instead, when executable.
    auto starts = [path](std::string_view p) { return path.substr(0, p.size()) == p; };
    return path == "//anon" || starts("/dev/zero") || starts("/anon_hugepage") || starts("[anon:") ||
           starts("[stack") || starts("/SYSV") || path == "[heap]";
}

bool PerfMaps::read_map(const std::string& path, std::string name, PerfMap& out, int& err) {
    std::string why;
    const int fd = open_foreign_file(path, owner_, kMaxMapBytes, &why, &err);
    if (fd < 0) {
        if (!why.empty()) problems_.push_back(why);
        return false;
    }
    std::string text;
    bool failed = false;
    const bool opened = read_small_file("/proc/self/fd/" + std::to_string(fd), text, failed, err);
    ::close(fd);
    if (!opened) return false;
    out = PerfMap::parse(text);
    out.set_source(std::move(name));
    if (failed) problems_.push_back(path + ": read error: the perf map may be incomplete");
    if (out.skipped_lines())
        problems_.push_back(path + ": " + std::to_string(out.skipped_lines()) +
                            (out.skipped_lines() == 1 ? " line is not \"START SIZE NAME\" and was skipped"
                                                      : " lines are not \"START SIZE NAME\" and were skipped"));
    return true;
}

bool PerfMaps::read_dump(const std::string& path, std::string name, PerfMap& out) {
    std::string why;
    int err = 0;
    const int fd = open_foreign_file(path, owner_, kMaxDumpBytes, &why, &err);
    if (fd < 0) {
        if (!why.empty()) problems_.push_back(why);
        return !why.empty();  // there, but not to be read: no other place is tried
    }
    // Mapped, not copied: a JIT that dumps its code too (a JVM's agent)
    // writes hundreds of megabytes, most of them code bytes never read here.
    JitDump d;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {
        d = parse_jitdump(Bytes(), path);  // nothing to map: "0 bytes, shorter than a jitdump header"
    } else {
        try {
            const MappedFile f("/proc/self/fd/" + std::to_string(fd));  // the file checked, not one put there since
            d = parse_jitdump(f.bytes(), path);
        } catch (const Error& e) {
            d.problem = path + ": " + e.what();
        }
    }
    ::close(fd);
    out = PerfMap::from_jitdump(d);
    out.set_source(std::move(name));
    if (!d.problem.empty())
        problems_.push_back(d.problem + (d.codes.empty() ? "" : " (the " + std::to_string(d.codes.size()) +
                                                                    " code loads before it are used)"));
    return true;
}

std::shared_ptr<const PerfMap> PerfMaps::of(const AddressSpace& as) {
    {
        // Read already (the unwinder asks again whenever the pid changes):
        // no walk over the mappings.
        std::lock_guard<std::mutex> l(mu_);
        auto it = by_pid_.find(as.pid);
        if (it != by_pid_.end() && it->second) return it->second;
    }
    // What perf would name from a map (anonymous executable memory), and the
    // jitdump marker: the dump mapped executable so that perf records where
    // it is. Only a process with JIT frames gets here, so it has the former.
    std::string_view marker;
    Ranges jit;
    for (const auto& [start, m] : as.maps) {
        if (m.exec && is_jit_mapping(m.path)) jit.emplace_back(start, m.end);
        else if (marker.empty() && is_jitdump_path(m.path)) marker = m.path;
    }
    return lookup(as.pid, marker, jit);
}

namespace {
uint64_t file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}
}  // namespace

bool PerfMaps::forget_if_grown(int32_t pid) {
    if (dir_.empty() || pid <= 0) return false;
    const std::string p = std::to_string(pid);
    std::lock_guard<std::mutex> l(mu_);
    Seen& s = seen_[pid];
    const auto now = std::chrono::steady_clock::now();
    if (now - s.looked < std::chrono::milliseconds(200)) return false;
    s.looked = now;
    const uint64_t map = file_size(dir_ + "/perf-" + p + ".map"), dump = file_size(dir_ + "/jit-" + p + ".dump");
    if (map == s.map_size && dump == s.dump_size) return false;
    s.map_size = map;
    s.dump_size = dump;
    by_pid_.erase(pid);
    missing_.erase(pid);
    return true;
}

bool PerfMaps::plausible(PerfMap& out, const std::string& path, int32_t pid, const Ranges& jit) {
    if (jit.empty() || out.size() == 0 || out.names_any(jit)) return true;
    problems_.push_back(path + ": none of its " + std::to_string(out.size()) + " symbols lies in process " +
                        std::to_string(pid) + "'s JIT memory; not used (an earlier process's with the same pid?)");
    out = PerfMap{};
    return false;
}

bool PerfMaps::map_at(const std::string& file, std::string name, PerfMap& out, int& err, int32_t pid,
                      const Ranges& jit) {
    if (!read_map(file, std::move(name), out, err)) return false;
    if (plausible(out, file, pid, jit)) return true;
    err = kAnotherProcess;
    return false;
}

bool PerfMaps::dump_at(const std::string& file, std::string name, PerfMap& out, int32_t pid, const Ranges& jit) {
    return read_dump(file, std::move(name), out) && plausible(out, file, pid, jit);
}

bool PerfMaps::in_live_tmp(int32_t pid, const Ranges& jit, PerfMap& out, std::string& also) {
    std::vector<uint64_t> jit_starts;
    for (const auto& r : jit) jit_starts.push_back(r.first);
    const LiveProcess lp = live_process(proc_, pid, jit_starts);
    if (!lp.running) return false;
    const std::string ns = std::to_string(lp.ns_pid), tmp = lp.root + "/tmp/";
    int unused = 0;
    if (map_at(tmp + "perf-" + ns + ".map", "perf-" + ns + ".map", out, unused, pid, jit) ||
        dump_at(tmp + "jit-" + ns + ".dump", "jit-" + ns + ".dump", out, pid, jit))
        return true;
    // Said only where that is not the directory again (the host's own
    // processes, with DIR /tmp).
    if (lp.ns_pid != pid || !same_directory(tmp, dir_))
        also += "; nor in the running process's own /tmp (" + tmp + ") as perf-" + ns + ".map or jit-" + ns + ".dump";
    return false;
}

bool PerfMaps::mapped_dump(std::string_view marker, const std::string& dump_name, int32_t pid, const Ranges& jit,
                           PerfMap& out, std::string& also) {
    // Named by the pid it saw (a pid namespace), or in another directory
    // (as perf inject reads it: by that path).
    const size_t slash = marker.rfind('/');
    const std::string base(marker.substr(slash + 1));
    const std::string in_dir = dir_ + "/" + base;
    bool tried = false;
    if (base != dump_name) {
        tried = true;
        if (dump_at(in_dir, base, out, pid, jit)) return true;
    }
    if (marker != in_dir && !same_directory(std::string(marker.substr(0, slash + 1)), dir_)) {
        tried = true;
        if (dump_at(std::string(marker), base, out, pid, jit)) return true;
    }
    if (tried) also += "; nor the jitdump it mapped, " + std::string(marker) + ", there or in the directory";
    return false;
}

std::shared_ptr<const PerfMap> PerfMaps::lookup(int32_t pid, std::string_view marker, const Ranges& jit) {
    std::lock_guard<std::mutex> l(mu_);
    auto& slot = by_pid_[pid];
    if (slot) return slot;
    auto map = std::make_shared<PerfMap>();
    if (!dir_.empty() && pid > 0) {
        const std::string p = std::to_string(pid);
        const std::string path = dir_ + "/perf-" + p + ".map", dump_name = "jit-" + p + ".dump";
        int map_errno = 0;
        std::string also;  // where else was looked, for the line of a missing map
        // The directory's, then (while it runs) the process's own /tmp's, then the jitdump it mapped.
        const bool found = map_at(path, "perf-" + p + ".map", *map, map_errno, pid, jit) ||
                           dump_at(dir_ + "/" + dump_name, dump_name, *map, pid, jit) ||
                           (!jit.empty() && in_live_tmp(pid, jit, *map, also)) ||
                           (!marker.empty() && mapped_dump(marker, dump_name, pid, jit, *map, also));
        if (!found)
            missing_[pid] = "no perf map " + path + " (" +
                            (map_errno == kAnotherProcess ? "another process's" : std::strerror(map_errno)) +
                            ") or jitdump " + dump_name + also + ": process " + p +
                            "'s frames in anonymous memory (JIT code, Python's -X perf trampolines) stay unnamed";
    }
    slot = std::move(map);
    return slot;
}

std::vector<std::string> PerfMaps::problems() const {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out = problems_;
    std::sort(out.begin(), out.end());  // -j threads read maps in any order
    // A pool of forked workers recorded here and analysed elsewhere misses
    // a map per process: the first few by pid, then how many more.
    size_t shown = 0;
    for (const auto& [pid, line] : missing_) {
        if (shown++ == kMissingShown) {
            out.push_back("and " + std::to_string(missing_.size() - kMissingShown) +
                          " more processes with no perf map or jitdump in " +
                          dir_ + ": their frames in anonymous memory stay unnamed");
            break;
        }
        out.push_back(line);
    }
    return out;
}

}  // namespace gilscan
