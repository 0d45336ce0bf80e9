// The timeline's spans that wait: a sleep being unwound on a worker (-j 3
// and up) is counted and written once its label is back, and every span
// and deferred event after it waits behind it, so that the trace keeps the
// timeline's order. Also the GIL-function totals those labels feed.
#include "gilscan/sched/timeline.h"

namespace gilscan {

// A state wholly outside --time: not counted, not drawn. A sleep being
// unwound on a worker still takes its place in the queue, so that its label
// is taken back (and dropped) in turn.
void Timeline::outside_window(Thread& th, uint64_t start, uint64_t end, bool cut) {
    if (th.state == SpanKind::Sleep && th.label.ticket >= 0 && resolver_) {
        Span s = span_of(th, start, end, cut);
        s.name = "S";
        output(s, th.label.ticket, nullptr);
    }
}

void Timeline::output(const Span& s, int64_t ticket, ThreadStats* st) {
    if (pending_.empty() && ticket < 0) {
        sink_.span(s);
        return;
    }
    PendingSpan p;
    p.span = s;
    p.name = std::string(s.name);
    p.state = std::string(s.state);
    p.evidence = std::string(s.evidence);
    if (!s.stack_stable) p.stack = std::string(s.stack_json);  // a stable text is kept as the view
    p.ticket = ticket;
    p.st = st;
    hold(std::move(p));
}

void Timeline::defer(const DeferredEvent& e) {
    PendingSpan p;
    p.other = e;
    hold(std::move(p));
}

void Timeline::hold(PendingSpan&& p) {
    pending_.push_back(std::move(p));
    if (pending_.size() > 65536) drain(true);  // bounded memory: wait for the workers
}

void Timeline::drain(bool wait) {
    while (!pending_.empty()) {
        PendingSpan& p = pending_.front();
        if (p.other.to) {
            p.other.to->replay(p.other);
            pending_.pop_front();
            continue;
        }
        if (p.ticket >= 0) {
            std::optional<SleepLabel> l = resolver_(p.ticket, wait);
            if (!l) return;
            if (!p.st) {  // outside --time
                pending_.pop_front();
                continue;
            }
            // The label is this span's alone: its built strings are taken, not copied.
            if (!l->name.empty()) p.name = l->name;
            if (l->evidence_literal.empty())
                p.evidence = std::move(l->evidence_built);
            else
                p.evidence = l->evidence_literal;
            if (l->stack_shared) {
                p.span.stack_json = *l->stack_shared;
                p.span.stack_stable = true;
            } else {
                p.stack = std::move(l->stack_json);
            }
            const uint64_t d = p.span.end - p.span.start;
            p.st->sleep_ns += d;
            ++p.st->sleep_count;
            if (l->gil) {
                p.st->gil_sleep_ns += d;
                ++p.st->gil_sleep_count;
                if (gil_functions_) count_gil_function(p.st->tgid, l->function, d);
            }
            p.span.function = l->function;  // empty without --gil-functions
            p.ticket = -1;
        }
        p.span.name = p.name;
        p.span.state = p.state;
        p.span.evidence = p.evidence;
        if (!p.span.stack_stable) p.span.stack_json = p.stack;
        sink_.span(p.span);
        pending_.pop_front();
    }
}

void Timeline::count_gil_function(int32_t tgid, std::string_view function, uint64_t d) {
    auto it = by_function_.find(std::pair<int32_t, std::string_view>(tgid, function));
    if (it == by_function_.end()) it = by_function_.emplace(std::pair<int32_t, std::string>(tgid, function), FunctionTotals{}).first;
    it->second.sleep_ns += d;
    ++it->second.sleep_count;
}

std::vector<GilFunctionStats> Timeline::gil_functions() const {
    std::vector<GilFunctionStats> out;
    out.reserve(by_function_.size());
    for (const auto& [key, t] : by_function_) out.push_back({key.first, key.second, t.sleep_ns, t.sleep_count});
    return out;
}

}  // namespace gilscan
