#include "gilscan/output/top_view.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "gilscan/output/utf8.h"

namespace gilscan {

namespace {

uint64_t grown(uint64_t now, uint64_t before) { return now > before ? now - before : 0; }

double pct(uint64_t part, uint64_t whole) { return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

double us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

double round1(double v) { return static_cast<double>(static_cast<int64_t>(v * 10 + (v < 0 ? -0.5 : 0.5))) / 10; }

// v with one decimal, right-aligned in `width` columns.
std::string num(double v, int width = 0) {
    char b[64];
    std::snprintf(b, sizeof b, "%*.1f", width, v);
    return b;
}

// Characters as columns (comm names and symbols: no wide characters in
// practice); text made valid UTF-8 first.
size_t utf8_columns(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

std::string utf8_prefix(const std::string& text, size_t columns) {
    const std::string s = valid_utf8(text);
    size_t n = 0, i = 0;
    for (; i < s.size(); ++i) {
        if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && n++ == columns) break;
    }
    return s.substr(0, i);
}

// A cell of `width` columns: cut (with an ellipsis) or padded on the right.
std::string cell(const std::string& s, size_t width) {
    std::string out = utf8_prefix(s, width);
    if (utf8_columns(out) < utf8_columns(valid_utf8(s)) && width > 0) out = utf8_prefix(s, width - 1) + "\xe2\x80\xa6";
    const size_t cols = utf8_columns(out);
    if (cols < width) out.append(width - cols, ' ');
    return out;
}

void line(std::string& screen, size_t& rows, size_t height, size_t width, const std::string& text) {
    if (height && rows >= height) return;
    screen += utf8_prefix(text, width);
    screen += '\n';
    ++rows;
}

using BlameKey = std::tuple<int32_t, std::string, std::string>;

BlameKey key_of(const BlameRow& r) { return {r.pid, r.function, r.native}; }

using ThreadRow = TopView::ThreadRow;

std::string thread_line(const ThreadRow& t, uint64_t span) {
    char b[96];
    std::snprintf(b, sizeof b, "%7d  ", t.t->tid);
    std::string row = b + cell(t.t->comm + (t.t->alive ? "" : " (exited)"), 16);
    std::snprintf(b, sizeof b, "%6.1f %10.1f %10.1f", pct(t.running_ns, span), pct(t.hold_ns, span),
                  pct(t.wait_ns, span));
    return row + b;
}

}  // namespace

LiveFigures live_figures_of(const FileSummary& fs) {
    LiveFigures f;
    f.time = fs.last_time;
    f.start = fs.first_time;
    f.gil_probes = fs.gil_probes;
    f.lost_events = fs.lost_events;
    for (const ThreadSummary& t : fs.threads) {
        LiveThreadFigures& x = f.threads.emplace_back(t.st, !t.st.exited);
        x.gil_hold_ns = t.gil_hold_ns.value_or(0);
        x.gil_wait_ns = fs.gil_probes ? t.gil_wait_ns.value_or(0) : t.gil_sleep_ns.value_or(0);
    }
    for (const GilProcessStats& g : fs.gil_processes)
        f.gils.push_back({g.pid, g.index, g.held_ns, g.contended_ns, g.waiting_ns, -1, 0});
    f.blame = fs.blame_known;
    f.blame_rows = fs.gil_blame;
    return f;
}

void TopView::update(LiveFigures now) {
    if (have_now_) {
        now.blame |= now_.blame;  // a finished run's summary has no blame rows when no one waited
        before_ = std::move(now_);
    }
    else before_.time = now.start ? now.start : now.time;  // the first interval: from the recording's start
    now_ = std::move(now);
    have_now_ = true;
}

std::vector<TopView::ThreadRow> TopView::thread_rows() const {
    std::map<std::pair<int32_t, uint64_t>, const LiveThreadFigures*> before;
    for (const auto& t : before_.threads) before[{t.tid, t.first_seen}] = &t;
    std::vector<ThreadRow> rows;
    for (const auto& t : now_.threads) {
        auto it = before.find({t.tid, t.first_seen});
        const LiveThreadFigures* b = it == before.end() ? nullptr : it->second;
        ThreadRow r{&t, grown(t.running_ns, b ? b->running_ns : 0), grown(t.gil_hold_ns, b ? b->gil_hold_ns : 0),
                    grown(t.gil_wait_ns, b ? b->gil_wait_ns : 0)};
        // A thread gone before the interval began is not shown again.
        if (!t.alive && b && !b->alive) continue;
        rows.push_back(r);
    }
    std::stable_sort(rows.begin(), rows.end(), [](const ThreadRow& a, const ThreadRow& b) {
        return std::tie(b.wait_ns, b.hold_ns, b.running_ns) < std::tie(a.wait_ns, a.hold_ns, a.running_ns);
    });
    return rows;
}

std::vector<TopView::GilRow> TopView::gil_rows() const {
    std::map<std::pair<int32_t, uint32_t>, const LiveGilFigures*> before;
    for (const auto& g : before_.gils) before[{g.pid, g.index}] = &g;
    std::map<int32_t, uint64_t> waits;  // by process: its threads' waits in the interval
    for (const ThreadRow& t : thread_rows()) waits[t.t->pid] += t.wait_ns;
    std::vector<GilRow> rows;
    for (const auto& g : now_.gils) {
        auto it = before.find({g.pid, g.index});
        const LiveGilFigures* b = it == before.end() ? nullptr : it->second;
        rows.push_back({&g, grown(g.held_ns, b ? b->held_ns : 0), grown(g.contended_ns, b ? b->contended_ns : 0),
                        grown(g.waiting_ns, b ? b->waiting_ns : 0), g.index == 0 ? waits[g.pid] : 0});
    }
    std::stable_sort(rows.begin(), rows.end(), [](const GilRow& a, const GilRow& b) {
        return std::tie(a.g->pid, a.g->index) < std::tie(b.g->pid, b.g->index);
    });
    return rows;
}

std::vector<TopView::BlameLine> TopView::blame_lines() const {
    std::map<BlameKey, const BlameRow*> before;
    for (const auto& r : before_.blame_rows) before[key_of(r)] = &r;
    std::vector<BlameLine> lines;
    for (const auto& r : now_.blame_rows) {
        auto it = before.find(key_of(r));
        const BlameRow* b = it == before.end() ? nullptr : it->second;
        BlameLine l{&r, 0, grown(r.on_cpu_ns, b ? b->on_cpu_ns : 0), grown(r.off_cpu_ns, b ? b->off_cpu_ns : 0)};
        l.contended_ns = l.on_cpu_ns + l.off_cpu_ns;
        if (l.contended_ns) lines.push_back(l);
    }
    std::stable_sort(lines.begin(), lines.end(),
                     [](const BlameLine& a, const BlameLine& b) { return a.contended_ns > b.contended_ns; });
    if (lines.size() > blame_top_) lines.resize(blame_top_);
    return lines;
}

// The heading and a line per GIL.
void TopView::gil_text(std::string& screen, size_t& rows, size_t width, size_t height, const std::string& what) const {
    const uint64_t span = interval_ns();
    const double at = now_.start && now_.time > now_.start ? static_cast<double>(now_.time - now_.start) / 1e9 : 0;
    line(screen, rows, height, width,
         "gilscan top  " + what + "   at " + num(at) + " s, the last " + num(static_cast<double>(span) / 1e9) + " s" +
             (now_.lost_events ? "   " + std::to_string(now_.lost_events) + " events lost" : ""));
    for (const GilRow& g : gil_rows()) {
        std::string holder = g.g->holder > 0 ? "held by " + std::to_string(g.g->holder) : "free";
        line(screen, rows, height, width,
             "GIL of " + std::to_string(g.g->pid) + (g.g->index ? " (#" + std::to_string(g.g->index + 1) + ")" : "") +
                 ": load " + num(pct(g.held_ns, span), 5) + "%  contended " + num(pct(g.contended_ns, span), 5) +
                 "%  waiters " + num(span ? static_cast<double>(g.thread_wait_ns) / static_cast<double>(span) : 0) +
                 " mean, " + std::to_string(g.g->waiters) + " now, " + holder);
    }
    if (!now_.gil_probes)
        line(screen, rows, height, width, "(no GIL uprobes: waits from the sleeps' stacks, holds not measured)");
}

// The interval's GIL blame table.
void TopView::blame_text(std::string& screen, size_t& rows, size_t width, size_t height,
                         const std::vector<BlameLine>& blame) const {
    line(screen, rows, height, width, "");
    line(screen, rows, height, width, "GIL blame, the last interval: held while others waited");
    line(screen, rows, height, width, "  CONTENDED  ON CPU  OFF CPU  FUNCTION                        NATIVE");
    if (blame.empty()) line(screen, rows, height, width, "  (no contended hold in this interval)");
    for (const BlameLine& l : blame) {
        char b[96];
        std::snprintf(b, sizeof b, "  %6.1f ms %6.1f%% %7.1f%%  ", us(l.contended_ns) / 1000, pct(l.on_cpu_ns, l.contended_ns),
                      pct(l.off_cpu_ns, l.contended_ns));
        line(screen, rows, height, width, b + cell(l.row->function, 30) + "  " + l.row->native);
    }
}

std::string TopView::text(size_t width, size_t height, const std::string& what) const {
    std::string screen;
    size_t rows = 0;
    gil_text(screen, rows, width, height, what);
    line(screen, rows, height, width, "");
    line(screen, rows, height, width, "    TID  NAME              CPU%  GIL held%  GIL wait%");
    const std::vector<BlameLine> blame = blame_lines();
    // The blame table's rows are kept: the threads' give way to them.
    const size_t blame_rows = now_.blame ? 3 + std::max<size_t>(blame.size(), 1) : 0;
    const std::vector<ThreadRow> threads = thread_rows();
    size_t shown = 0;
    for (const ThreadRow& t : threads) {
        if (height && rows + blame_rows + 1 >= height && shown + 1 < threads.size()) {
            line(screen, rows, height, width, "  ... " + std::to_string(threads.size() - shown) + " more threads");
            break;
        }
        line(screen, rows, height, width, thread_line(t, interval_ns()));
        ++shown;
    }
    if (now_.blame) blame_text(screen, rows, width, height, blame);
    return screen;
}

nlohmann::json TopView::json() const {
    const uint64_t span = interval_ns();
    nlohmann::json j;
    j["start_ns"] = before_.time;
    j["end_ns"] = now_.time;
    j["recording_start_ns"] = now_.start;
    j["gil_probes"] = now_.gil_probes;
    j["lost_events"] = now_.lost_events;
    j["threads"] = nlohmann::json::array();
    for (const ThreadRow& t : thread_rows())
        j["threads"].push_back({{"pid", t.t->pid}, {"tid", t.t->tid}, {"name", t.t->comm}, {"alive", t.t->alive},
                                {"running_us", us(t.running_ns)}, {"gil_hold_us", us(t.hold_ns)},
                                {"gil_wait_us", us(t.wait_ns)}, {"cpu_pct", round1(pct(t.running_ns, span))},
                                {"gil_held_pct", round1(pct(t.hold_ns, span))},
                                {"gil_wait_pct", round1(pct(t.wait_ns, span))}});
    j["gils"] = nlohmann::json::array();
    for (const GilRow& g : gil_rows())
        j["gils"].push_back({{"pid", g.g->pid}, {"index", g.g->index}, {"held_us", us(g.held_ns)},
                             {"contended_us", us(g.contended_ns)}, {"waiting_us", us(g.waiting_ns)},
                             {"load_pct", round1(pct(g.held_ns, span))},
                             {"mean_waiters", span ? static_cast<double>(g.thread_wait_ns) / static_cast<double>(span) : 0.0},
                             {"waiters_now", g.g->waiters}, {"holder_now", g.g->holder}});
    j["gil_blame"] = nlohmann::json::array();
    if (now_.blame)
        for (const BlameLine& l : blame_lines())
            j["gil_blame"].push_back({{"pid", l.row->pid}, {"function", l.row->function}, {"native", l.row->native},
                                      {"contended_us", us(l.contended_ns)}, {"on_cpu_us", us(l.on_cpu_ns)},
                                      {"off_cpu_us", us(l.off_cpu_ns)}, {"total_contended_us", us(l.row->contended_ns())}});
    return j;
}

}  // namespace gilscan
