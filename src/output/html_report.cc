#include "gilscan/output/html_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gilscan/output/output_file.h"
#include "gilscan/symbols/process_maps.h"
#include "report_assets.h"

namespace gilscan {

// ---- TimeBins ------------------------------------------------------------------

void TimeBins::add(uint64_t start, uint64_t end, double weight) {
    if (end <= start || weight == 0) return;
    if (bins_.empty()) origin_ = start - start % width_;
    // Each thread's spans come in time order, not all threads' together: a
    // span may begin before the first bin, which then moves back.
    const uint64_t lo = std::min(start, origin_);
    while ((end - lo) / width_ >= kMaxBins - 1) grow();
    if (start < origin_) {
        const uint64_t o = start - start % width_;
        bins_.insert(bins_.begin(), static_cast<size_t>((origin_ - o) / width_), 0.0);
        origin_ = o;
    }
    const size_t last = static_cast<size_t>((end - 1 - origin_) / width_);
    if (bins_.size() <= last) bins_.resize(last + 1, 0.0);
    for (size_t i = static_cast<size_t>((start - origin_) / width_); i <= last; ++i) {
        const uint64_t a = std::max(start, origin_ + i * width_), b = std::min(end, origin_ + (i + 1) * width_);
        bins_[i] += weight * static_cast<double>(b - a);
    }
}

void TimeBins::grow() {
    // Twice as wide, from an origin the new width divides.
    const uint64_t w = width_ * 2, o = origin_ - origin_ % w;
    std::vector<double> merged((bins_.size() + 2) / 2 + 1, 0.0);
    for (size_t i = 0; i < bins_.size(); ++i) merged[(origin_ + i * width_ - o) / w] += bins_[i];
    while (!merged.empty() && merged.back() == 0.0) merged.pop_back();
    bins_ = std::move(merged);
    width_ = w;
    origin_ = o;
}

// ---- ReportCollector -------------------------------------------------------------

namespace {

ReportCollector::Kind kind_of(const Span& s) {
    switch (s.kind) {
    case SpanKind::Running: return ReportCollector::kRunning;
    case SpanKind::Runnable: return ReportCollector::kRunnable;
    case SpanKind::Sleep:
        if (s.name == "S(GIL)") return ReportCollector::kGilWait;
        if (s.name == "S(GIL handoff)") return ReportCollector::kGilHandoff;
        return ReportCollector::kSleep;
    case SpanKind::DiskSleep: return ReportCollector::kDisk;
    default: return ReportCollector::kOther;
    }
}

ReportCollector::Kind heaviest(const std::array<uint64_t, ReportCollector::kKinds>& ns) {
    return static_cast<ReportCollector::Kind>(std::max_element(ns.begin(), ns.end()) - ns.begin());
}

}  // namespace

void ReportCollector::span(const Span& s) {
    if (s.end <= s.start) return;
    const Kind k = kind_of(s);
    add(lanes_[{s.tgid, s.tid}], s.start, s.end, k);
    if (k == kGilWait && !probe_waits_) waiting_[s.tgid].add(s.start, s.end, 1.0);
}

void ReportCollector::gil_span(int32_t pid, int32_t, GilSpan what, uint32_t, uint64_t start_ns, uint64_t end_ns,
                               bool) {
    if (what != GilSpan::Wait) return;
    if (!probe_waits_) {  // the uprobes' waits from now on: the sleeps' are a part of them
        probe_waits_ = true;
        waiting_.clear();
    }
    waiting_[pid].add(start_ns, end_ns, 1.0);
}

void ReportCollector::gil_holder(int32_t pid, int32_t, int32_t, uint64_t start_ns, uint64_t end_ns,
                                 std::string_view) {
    held_[pid].add(start_ns, end_ns, 1.0);
}

// A state is merged into the lane's last stretch while both fit within the
// resolution; the stretch then shows the state it holds most of.
void ReportCollector::add(Lane& l, uint64_t start, uint64_t end, Kind k) {
    if (!l.segs.empty()) {
        Segment& last = l.segs.back();
        if (resolution_ && end - std::min(last.start, start) <= resolution_) {
            last.start = std::min(last.start, start);
            last.end = std::max(last.end, end);
            l.open_ns[k] += end - start;
            last.kind = heaviest(l.open_ns);
            return;
        }
        if (last.kind == k && last.end == start) {
            last.end = end;
            l.open_ns[k] += end - start;
            return;
        }
    }
    l.segs.push_back({start, end, k});
    l.open_ns.fill(0);
    l.open_ns[k] = end - start;
    if (++segments_ > kMaxSegments) coarsen();
}

void ReportCollector::coarsen() {
    while (segments_ > kMaxSegments / 2) {
        resolution_ = resolution_ ? resolution_ * 2 : 10'000;  // from 10 µs
        segments_ = 0;
        for (auto& [key, l] : lanes_) {
            std::vector<Segment> out;
            std::array<uint64_t, kKinds> ns{};
            for (const Segment& s : l.segs) {
                if (!out.empty() && s.end - out.back().start <= resolution_) {
                    out.back().end = std::max(out.back().end, s.end);
                    ns[s.kind] += s.end - s.start;
                    out.back().kind = heaviest(ns);
                    continue;
                }
                out.push_back(s);
                ns.fill(0);
                ns[s.kind] = s.end - s.start;
            }
            l.segs = std::move(out);
            l.open_ns = ns;
            segments_ += l.segs.size();
        }
    }
}

// ---- the page's data ---------------------------------------------------------------

namespace {

using nlohmann::json;

constexpr size_t kMaxLanes = 256;
constexpr size_t kMaxRows = 5000;      // of the table
constexpr size_t kLoadBins = 2000;     // of each GIL load row
constexpr size_t kMaxLoadRows = 32;    // the processes that waited longest
constexpr size_t kMaxFlameDepth = 64;  // frames from the root

double us(uint64_t ns) { return std::round(static_cast<double>(ns) / 100.0) / 10.0; }  // µs, 0.1 µs steps
double pct(uint64_t part, uint64_t whole) {
    return whole ? std::round(1000.0 * static_cast<double>(part) / static_cast<double>(whole)) / 10.0 : 0.0;
}

// Python processes first, each main thread first: the table's and the lanes' order.
std::vector<const ThreadSummary*> thread_order(const FileSummary& fs) {
    std::set<int32_t> python;  // ran the probed Python, waited for a GIL, or is named python*
    for (const auto& p : fs.gil_processes) python.insert(p.pid);
    for (const auto& t : fs.threads)
        if (t.gil_sleep_count.value_or(0) || t.st.comm.starts_with("python")) python.insert(t.st.tgid);
    std::vector<const ThreadSummary*> order;
    for (const auto& t : fs.threads) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(), [&](const ThreadSummary* a, const ThreadSummary* b) {
        const bool pa = python.count(a->st.tgid), pb = python.count(b->st.tgid);
        if (pa != pb) return pa;
        if (a->st.tgid != b->st.tgid) return a->st.tgid < b->st.tgid;
        return a->main_thread > b->main_thread;
    });
    return order;
}

json facts(const ReportInputs& in) {
    const FileSummary& fs = in.summary;
    json f = json::array();
    auto add = [&](const char* k, const std::string& v) {
        if (!v.empty()) f.push_back({k, v});
    };
    add("file", fs.file);
    add("command", fs.cmdline);
    add("date", fs.date);
    add("host", fs.hostname);
    add("perf", fs.perf_version);
    char d[64];
    std::snprintf(d, sizeof d, "%.1f ms", static_cast<double>(fs.last_time - fs.first_time) / 1e6);
    add("duration", d);
    if (fs.window)
        add("window", fs.window->text + " (" + std::to_string((fs.window->stop_ns - fs.window->start_ns) / 1000000) +
                          " ms); every figure is of it");
    if (in.cpus) add("CPUs", std::to_string(in.cpus));
    add("Python", in.python.empty() ? std::string("not named by the recording's mappings") : in.python);
    add("GIL evidence", !fs.gil_sleep_source.empty() ? fs.gil_sleep_source
                        : fs.gil_probes             ? std::string("uprobes")
                                                    : std::string("none (no GIL wait can be told)"));
    add("events", [&] {
        std::string s;
        for (const auto& [name, n] : fs.event_counts) s += (s.empty() ? "" : ", ") + name + " " + std::to_string(n);
        return s;
    }());
    if (fs.lost_events || fs.lost_samples)
        add("lost", std::to_string(fs.lost_events) + " events, " + std::to_string(fs.lost_samples) + " samples");
    return f;
}

void table(const FileSummary& fs, json& d) {
    const bool uprobes = std::any_of(fs.threads.begin(), fs.threads.end(), [](auto& t) { return t.gil_wait_ns.has_value(); });
    json cols = json::array({{{"label", "PID"}, {"num", true}, {"digits", 0}},
                             {{"label", "TID"}, {"num", true}, {"digits", 0}},
                             {{"label", "comm"}, {"num", false}},
                             {{"label", "total ms"}, {"num", true}},
                             {{"label", "run%"}, {"num", true}},
                             {{"label", "runnable%"}, {"num", true}},
                             {{"label", "sleep%"}, {"num", true}},
                             {{"label", "sleeps"}, {"num", true}, {"digits", 0}},
                             {{"label", "D%"}, {"num", true}},
                             {{"label", "?%"}, {"num", true}, {"title", "unknown after lost events"}}});
    if (fs.gil_sleep_known) cols.push_back({{"label", "S(GIL)%"}, {"num", true}, {"title", "asleep waiting for the GIL"}});
    if (uprobes)
        for (const char* c : {"no-GIL%", "GIL%", "GIL-wait%", "GIL ms", "wait ms"}) cols.push_back({{"label", c}, {"num", true}});
    json rows = json::array();
    for (const ThreadSummary* tp : thread_order(fs)) {
        if (rows.size() == kMaxRows) break;
        const ThreadSummary& t = *tp;
        const uint64_t span = t.span_ns;
        json r = {t.st.tgid, t.st.tid, t.st.comm + (t.main_thread ? " *" : ""), us(span) / 1000,
                  pct(t.st.running_ns, span), pct(t.st.runnable_ns, span), pct(t.st.sleep_ns, span), t.st.sleep_count,
                  pct(t.st.disk_ns, span), pct(t.st.unknown_ns, span)};
        if (fs.gil_sleep_known) r.push_back(pct(t.gil_sleep_ns.value_or(0), span));
        if (uprobes) {
            if (t.gil_wait_ns) {
                for (double v : {pct(t.no_gil_ns.value_or(0), span), pct(t.gil_hold_ns.value_or(0), span),
                                 pct(*t.gil_wait_ns, span), us(t.gil_hold_ns.value_or(0)) / 1000, us(*t.gil_wait_ns) / 1000})
                    r.push_back(v);
            } else {
                for (int i = 0; i < 5; ++i) r.push_back(nullptr);
            }
        }
        rows.push_back(std::move(r));
    }
    d["rows_left_out"] = fs.threads.size() - rows.size();
    d["columns"] = std::move(cols);
    d["rows"] = std::move(rows);
}

void lanes(const ReportInputs& in, uint64_t t0, json& d) {
    const std::vector<const ThreadSummary*> order = thread_order(in.summary);
    json out = json::array();
    for (const ThreadSummary* t : order) {
        if (out.size() == kMaxLanes) break;
        auto it = in.collector.lanes().find({t->st.tgid, t->st.tid});
        if (it == in.collector.lanes().end()) continue;
        json segs = json::array();
        for (const auto& s : it->second.segs) {
            segs.push_back(us(s.start - std::min(s.start, t0)));
            segs.push_back(us(s.end - s.start));
            segs.push_back(static_cast<int>(s.kind));
        }
        out.push_back({{"label", t->st.comm + " " + std::to_string(t->st.tid)}, {"pid", t->st.tgid},
                       {"tid", t->st.tid}, {"segs", std::move(segs)}});
    }
    d["lanes_left_out"] = order.size() > out.size() ? order.size() - out.size() : 0;
    d["lanes"] = std::move(out);
}

// One process's load: `held` in thousandths of each bin, mean waiters in hundredths.
json load_row(int32_t pid, const TimeBins* held, const TimeBins* waiting, uint64_t t0, uint64_t t1) {
    const uint64_t span = t1 > t0 ? t1 - t0 : 1;
    const uint64_t bin = std::max<uint64_t>((span + kLoadBins - 1) / kLoadBins, 1000);
    const size_t n = static_cast<size_t>((span + bin - 1) / bin);
    std::vector<double> h(n, 0.0), w(n, 0.0);
    auto spread = [&](const TimeBins* b, std::vector<double>& into) {
        if (!b) return;
        for (size_t i = 0; i < b->bins().size(); ++i) {
            const uint64_t at = b->origin() + i * b->width();
            if (at < t0) continue;
            const size_t k = static_cast<size_t>((at - t0) / bin);
            if (k < n) into[k] += b->bins()[i];
        }
    };
    spread(held, h);
    spread(waiting, w);
    json hj = json::array(), wj = json::array();
    double most = 0;
    for (size_t i = 0; i < n; ++i) {
        hj.push_back(std::lround(std::min(1000.0, 1000.0 * h[i] / static_cast<double>(bin))));
        const double mean = w[i] / static_cast<double>(bin);
        most = std::max(most, mean);
        wj.push_back(std::lround(100.0 * mean));
    }
    return {{"label", "GIL of " + std::to_string(pid)}, {"pid", pid}, {"bin_us", us(bin)}, {"held", std::move(hj)},
            {"waiters", std::move(wj)}, {"max_waiters", std::ceil(most)}};
}

void gil_load(const ReportInputs& in, uint64_t t0, uint64_t t1, json& d) {
    std::set<int32_t> shown;  // the processes of the table (--pid)
    for (const auto& t : in.summary.threads) shown.insert(t.st.tgid);
    std::map<int32_t, double> waited;  // the processes that waited longest, at most kMaxLoadRows
    for (const auto& [pid, b] : in.collector.held())
        if (shown.count(pid)) waited[pid] += 0;
    for (const auto& [pid, b] : in.collector.waiting())
        if (shown.count(pid))
            for (double v : b.bins()) waited[pid] += v;
    std::vector<std::pair<double, int32_t>> most;
    for (const auto& [pid, v] : waited) most.emplace_back(-v, pid);
    std::sort(most.begin(), most.end());
    if (most.size() > kMaxLoadRows) most.resize(kMaxLoadRows);
    std::set<int32_t> pids;
    for (const auto& [v, pid] : most) pids.insert(pid);
    json rows = json::array();
    for (int32_t pid : pids) {
        auto h = in.collector.held().find(pid);
        auto w = in.collector.waiting().find(pid);
        rows.push_back(load_row(pid, h == in.collector.held().end() ? nullptr : &h->second,
                                w == in.collector.waiting().end() ? nullptr : &w->second, t0, t1));
    }
    d["gil"] = std::move(rows);
}

// Folded lines ("a;b;c 123") as a tree {n, v, c}; nodes under 1/5000 of the
// whole, or deeper than kMaxFlameDepth, are left out (their time stays in
// their parent's).
json flame(const std::vector<std::string>& lines) {
    struct Node {
        std::string name;
        uint64_t v = 0;
        std::map<std::string, size_t> kids;
    };
    std::vector<Node> nodes(1);
    nodes[0].name = "all";
    for (const std::string& line : lines) {
        const size_t sp = line.rfind(' ');
        if (sp == std::string::npos) continue;
        const uint64_t v = std::strtoull(line.c_str() + sp + 1, nullptr, 10);
        size_t at = 0;
        nodes[0].v += v;
        std::string_view rest(line.data(), sp);
        while (!rest.empty()) {
            const size_t semi = rest.find(';');
            const std::string name(rest.substr(0, semi));
            rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
            auto it = nodes[at].kids.find(name);
            if (it == nodes[at].kids.end()) {
                nodes.push_back({name, 0, {}});
                it = nodes[at].kids.emplace(name, nodes.size() - 1).first;
            }
            at = it->second;
            nodes[at].v += v;
        }
    }
    if (nodes[0].v == 0) return nullptr;
    const uint64_t floor = nodes[0].v / 5000;
    auto build = [&](auto& self, size_t i, size_t depth) -> json {
        json kids = json::array();
        std::vector<size_t> order;
        for (const auto& [name, k] : nodes[i].kids)
            if (nodes[k].v > floor && depth < kMaxFlameDepth) order.push_back(k);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return nodes[a].v > nodes[b].v; });
        for (size_t k : order) kids.push_back(self(self, k, depth + 1));
        json n = {{"n", nodes[i].name}, {"v", nodes[i].v}};
        if (!kids.empty()) n["c"] = std::move(kids);
        return n;
    };
    return build(build, 0, 0);
}

json states() {
    // The trace's catapult colours (docs/usage.md, "What the trace shows").
    return json::array({{{"name", "running"}, {"color", "rgb(126,200,148)"}},
                        {{"name", "runnable"}, {"color", "rgb(133,160,210)"}},
                        {{"name", "sleeping"}, {"color", "rgb(232,232,232)"}},
                        {{"name", "S(GIL): waiting for the GIL"}, {"color", "rgb(180,0,0)"}},
                        {{"name", "S(GIL handoff)"}, {"color", "rgb(180,125,0)"}},
                        {{"name", "D (uninterruptible)"}, {"color", "rgb(182,125,143)"}},
                        {{"name", "other, unknown"}, {"color", "rgb(199,155,125)"}}});
}

void replace(std::string& page, std::string_view key, std::string_view with) {
    const size_t at = page.find(key);
    if (at != std::string::npos) page.replace(at, key.size(), with);
}

std::string escaped_html(std::string_view s) {
    std::string out;
    for (char c : s) {
        if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '&') out += "&amp;";
        else if (c == '"') out += "&quot;";
        else out += c;
    }
    return out;
}

}  // namespace

// "3.12 (libpython3.12.so.1.0)": the version in the name of a Python binary
// or library some recorded process mapped, or in a pyenv-style directory.
std::string pythons_mapped(const ProcessMaps& maps, const FileSummary& summary) {
    std::set<std::string> found;
    std::set<int32_t> pids;
    for (const auto& t : summary.threads) pids.insert(t.st.tgid);
    for (int32_t pid : pids) {
        const AddressSpace* as = maps.space(pid);
        if (!as) continue;
        for (const auto& [start, m] : as->maps) {
            const std::string base = m.path.substr(m.path.rfind('/') + 1);
            if (!m.exec || !(base.starts_with("libpython") || base.starts_with("python"))) continue;
            std::string version;
            for (size_t i = base.find_first_of("0123456789"); i != std::string::npos && i < base.size() &&
                                                             (std::isdigit(static_cast<unsigned char>(base[i])) ||
                                                              (base[i] == '.' && i + 1 < base.size() &&
                                                               std::isdigit(static_cast<unsigned char>(base[i + 1]))));
                 ++i)
                version += base[i];
            if (version.empty()) {  // python3 in .../versions/3.12.1/bin
                const size_t v = m.path.find("/versions/");
                if (v != std::string::npos) version = m.path.substr(v + 10, m.path.find('/', v + 10) - v - 10);
            }
            if (!version.empty()) found.insert(version + " (" + base + ")");
        }
    }
    std::string out;
    for (const auto& f : found) out += (out.empty() ? "" : ", ") + f;
    return out;
}

std::string html_report(const ReportInputs& in) {
    const FileSummary& fs = in.summary;
    const uint64_t t0 = fs.window ? fs.window->start_ns : fs.first_time;
    uint64_t t1 = fs.window ? fs.window->stop_ns : fs.last_time;
    for (const auto& t : fs.threads) t1 = std::max(t1, t.st.last_seen);
    json d;
    d["facts"] = facts(in);
    d["warnings"] = fs.warnings;
    d["span_us"] = us(t1 > t0 ? t1 - t0 : 0);
    d["states"] = states();
    table(fs, d);
    lanes(in, t0, d);
    gil_load(in, t0, t1, d);
    d["flame_wait"] = flame(in.wait_folded);
    d["flame_blame"] = flame(in.blame_folded);
    std::string data = d.dump(-1, ' ', false, json::error_handler_t::replace);
    // Inside <script>: no "</" may close it.
    for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3)) data.insert(at + 1, "\\");
    std::string page(kReportHtml);
    const std::string title = escaped_html(fs.file);
    replace(page, "@CSS@", kReportCss);
    replace(page, "@JS@", kReportJs);
    for (int i = 0; i < 3; ++i) replace(page, "@TITLE@", title);
    replace(page, "@DATA@", data);
    return page;
}

void write_html_report(const std::string& path, const ReportInputs& in) {
    OutputFile out(path);
    out.write(std::string_view(html_report(in)));
    out.commit();
}

}  // namespace gilscan
