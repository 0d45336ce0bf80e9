#include "gilscan/perf_map.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "gilscan/error.h"
#include "gilscan/mapped_file.h"

namespace gilscan {

namespace {

// Hex digits at the front of s (an optional 0x first), consumed. False when
// there are none, or more than 16 (a u64 cannot hold them).
bool take_hex(std::string_view& s, uint64_t& out) {
    if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
    size_t n = 0;
    uint64_t v = 0;
    for (; n < s.size(); ++n) {
        const char c = s[n];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else break;
        if (n == 16) return false;
        v = v << 4 | static_cast<uint64_t>(d);
    }
    if (n == 0) return false;
    s.remove_prefix(n);
    out = v;
    return true;
}

bool take_space(std::string_view& s) {
    if (s.empty() || s[0] != ' ') return false;
    s.remove_prefix(1);
    return true;
}

// The whole of a file into text; false (errno in err) when it cannot be
// opened. failed: a read error part way.
bool read_whole(const std::string& path, std::string& text, bool& failed, int& err) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        err = errno;
        return false;
    }
    text.clear();
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    failed = std::ferror(f);
    std::fclose(f);
    return true;
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

bool is_jit_mapping(std::string_view path) {
    // perf 6.1's is_anon_memory() and is_no_dso_memory() (util/map.c): the
    // mappings map__new names /tmp/perf-PID.map instead, when executable.
    auto starts = [path](std::string_view p) { return path.substr(0, p.size()) == p; };
    return path == "//anon" || starts("/dev/zero") || starts("/anon_hugepage") || starts("[anon:") ||
           starts("[stack") || starts("/SYSV") || path == "[heap]";
}

std::shared_ptr<const PerfMap> PerfMaps::of_pid(int32_t pid) {
    std::lock_guard<std::mutex> l(mu_);
    auto& slot = by_pid_[pid];
    if (slot) return slot;
    auto map = std::make_shared<PerfMap>();
    if (!dir_.empty() && pid > 0) {
        const std::string name = "perf-" + std::to_string(pid) + ".map";
        const std::string path = dir_ + "/" + name;
        const std::string dump_name = "jit-" + std::to_string(pid) + ".dump";
        const std::string dump_path = dir_ + "/" + dump_name;
        std::string text;
        bool failed = false;
        int map_errno = 0;
        if (read_whole(path, text, failed, map_errno)) {
            *map = PerfMap::parse(text);
            map->set_source(name);
            if (failed)
                problems_.push_back(path + ": read error: the perf map may be incomplete");
            if (map->skipped_lines())
                problems_.push_back(path + ": " + std::to_string(map->skipped_lines()) +
                                    (map->skipped_lines() == 1 ? " line is not \"START SIZE NAME\" and was skipped"
                                                               : " lines are not \"START SIZE NAME\" and were skipped"));
        } else if (std::FILE* probe = std::fopen(dump_path.c_str(), "rb")) {
            std::fclose(probe);
            // Mapped, not copied: a JIT that dumps its code too (a JVM's
            // agent) writes hundreds of megabytes, most of them code bytes
            // never read here.
            JitDump d;
            std::error_code ec;
            if (std::filesystem::file_size(dump_path, ec) == 0 && !ec) {
                d = parse_jitdump(Bytes(), dump_path);  // nothing to map: "0 bytes, shorter than a jitdump header"
            } else {
                try {
                    const MappedFile f(dump_path);
                    d = parse_jitdump(f.bytes(), dump_path);
                } catch (const Error& e) {
                    d.problem = e.what();  // a directory, not mappable
                }
            }
            *map = PerfMap::from_jitdump(d);
            map->set_source(dump_name);
            if (!d.problem.empty())
                problems_.push_back(d.problem + (d.codes.empty() ? "" : " (the " + std::to_string(d.codes.size()) +
                                                                            " code loads before it are used)"));
        } else {
            missing_[pid] = "no perf map " + path + " (" + std::strerror(map_errno) + ") or jitdump " + dump_name +
                            ": process " + std::to_string(pid) +
                            "'s frames in anonymous memory (JIT code, Python's -X perf trampolines) stay unnamed";
        }
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
