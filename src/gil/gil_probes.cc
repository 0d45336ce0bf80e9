#include "gilscan/gil/gil_probes.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "gilscan/gil/gil_arg.h"
#include "gilscan/gil/trace_sink.h"

namespace gilscan {

__attribute__((noinline)) GilTracker::Thread& GilTracker::add_thread(int32_t pid, int32_t tid) {
    Thread& th = all_.emplace_back();
    th.st.tid = tid;
    th.st.tgid = pid > 0 ? pid : tid;
    threads_.set(tid, &th);
    return th;
}

__attribute__((noinline)) GilTracker::Process& GilTracker::add_process(int32_t pid, uint32_t index,
                                                                      uint64_t address) {
    Process& p = procs_.emplace_back();
    p.st.pid = pid;
    p.st.index = index;
    p.st.address = address;
    if (index == 0) proc_index_.set(pid, &p);
    return p;
}

GilTracker::Process& GilTracker::gil_of(int32_t pid, uint64_t address) {
    Process& first = process_of(pid);
    if (address == 0 || first.st.address == address) return first;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32) ^ address;
    // Hashed, not a walk along the process's GILs: a damaged file can name
    // any number of addresses.
    auto [it, added] = by_address_.try_emplace(key);
    if (!added)
        for (Process* p : it->second)
            if (p->st.pid == pid && p->st.address == address) return *p;
    // The first GIL was made before any address was seen (a return probe,
    // a drop): it is the first address's.
    if (first.st.address == 0) {
        first.st.address = address;
        it->second.push_back(&first);
        return first;
    }
    Process& p = add_process(pid, first.gils++, address);
    it->second.push_back(&p);
    return p;
}

uint64_t GilTracker::gil_address(const Sample& s, const EventInfo& ev) {
    if (!ev.format) return 0;
    const auto i = static_cast<size_t>(ev.index);
    if (i >= gil_fields_.size()) gil_fields_.resize(i + 1);
    GilField& g = gil_fields_[i];
    if (!g.known || g.generation != ev.generation) {
        g = {true, ev.generation, ev.format->field(kGilArgField)};
        // A probe placed by hand may name a field `gil` of another kind: only an address-sized one.
        if (g.field && (g.field->size != 8 || g.field->data_loc || g.field->rel_loc || g.field->is_array))
            g.field = nullptr;
    }
    return g.field ? read_uint(s.raw, *g.field, swap_) : 0;
}

void GilTracker::account(Process& p, uint64_t t) {
    if (t > p.changed) {
        const uint64_t dt = window_ ? window_->overlap(p.changed, t) : t - p.changed;
        if (p.holders > 0) p.st.held_ns += dt;
        if (p.holders > 0 && p.waiters > 0) p.st.contended_ns += dt;
        if (p.waiters > 0) p.st.waiting_ns += dt;
    }
    p.changed = std::max(p.changed, t);
}

void GilTracker::waiters_changed(Process& p, uint64_t t) {
    if (window_) [[unlikely]] {
        if (t >= window_->hi) return;
        if (t < window_->lo) {
            p.count_before_window = true;
            p.waiters_before_window = p.waiters;
            return;
        }
        open_window_count(p);
    }
    show_waiters(p, t, p.waiters);
}

void GilTracker::show_waiters(Process& p, uint64_t t, uint32_t n) {
    p.st.max_waiters = std::max(p.st.max_waiters, n);
    if (trace_) trace_->gil_waiters(p.st.pid, p.st.index, t, n);
}

// The count the window opens with, at its start, once.
void GilTracker::open_window_count(Process& p) {
    if (!p.count_before_window) return;
    p.count_before_window = false;
    show_waiters(p, window_->lo, p.waiters_before_window);
}

void GilTracker::set_holder(Process& p, int32_t tid, uint64_t t) {
    // Close the holder track's previous span.
    uint64_t a = p.holder_since, b = t;
    if (p.holder > 0 && trace_ && t > p.holder_since && (!window_ || window_->clip(a, b)))
        trace_->gil_holder(p.st.pid, gil_track_tid(p.st.pid, p.st.index), p.holder, a, b,
                           listener_ ? listener_->hold_culprit(p.st.pid, p.st.index, p.holder, t, p.cookie) : std::string_view());
    p.holder = tid;
    p.holder_since = t;
}

// th's interval from `since` to t, cut to --time: false when none of it is in.
bool GilTracker::in_window(const Thread& th, uint64_t t, uint64_t& a, uint64_t& b) const {
    a = th.since;
    b = std::max(t, th.since);
    return !window_ || window_->clip(a, b);
}

void GilTracker::end_wait(Thread& th, uint64_t t, bool cut) {
    uint64_t a, b;
    if (!in_window(th, t, a, b)) return;
    th.st.wait_ns += b - a;
    if (trace_) trace_->gil_span(th.st.tgid, th.st.tid, TraceSink::GilSpan::Wait, th.gil ? th.gil->st.index : 0, a, b, cut);
}

void GilTracker::end_hold(Thread& th, Process& p, uint64_t t, bool cut) {
    uint64_t a, b;
    if (in_window(th, t, a, b)) {
        th.st.hold_ns += b - a;
        if (trace_) trace_->gil_span(th.st.tgid, th.st.tid, TraceSink::GilSpan::Lock, p.st.index, a, b, cut);
    }
    account(p, t);
    if (p.holders > 0) --p.holders;
    if (p.holder == th.st.tid) set_holder(p, -1, t);
}

// One GIL, one holder: a take that returns while another thread holds it
// means that thread let go unseen, at the latest now.
void GilTracker::end_unseen_hold(Process& p, uint64_t t) {
    Thread* const* holder = threads_.find(p.holder);
    if (!holder) return;
    Thread& old = **holder;
    if (old.state != GilState::Holding || old.gil != &p) return;
    ++anomalies_.releases_not_seen;
    end_hold(old, p, t, false);
    old.state = GilState::None;
    old.since = t;
}

__attribute__((noinline)) void GilTracker::on_probe(const Sample& s, const EventInfo& ev, TpKind k) {
    const uint64_t t = s.time;
    probe_events_ += !window_ || window_->contains(t);
    Thread& th = thread_of(s.pid, s.tid);
    th.st.first = std::min(th.st.first, t);
    th.st.last = std::max(th.st.last, t);
    // Which GIL: a take_gil entry's `gil` field when the probe has one; every
    // other probe acts on the GIL of the thread's last take (a thread swaps
    // interpreters by dropping one GIL and taking the other).
    const uint64_t address = k == TpKind::GilTake ? gil_address(s, ev) : 0;
    if (!th.gil || th.gil->st.pid != th.st.tgid) th.gil = &process_of(th.st.tgid);
    Process& was = *th.gil;  // what it waits for or holds now
    Process& p = k == TpKind::GilTake && address ? gil_of(th.st.tgid, address) : was;
    p.st.first = std::min(p.st.first, t);
    p.st.last = std::max(p.st.last, t);
    switch (k) {
    case TpKind::GilTake:
        if (th.state == GilState::Waiting) {
            ++anomalies_.take_without_return;  // the return was lost: count the wait so far
            end_wait(th, t, false);
            account(was, t);
            --was.waiters;
            if (&was != &p) waiters_changed(was, t);
        } else if (th.state == GilState::Holding) {
            ++anomalies_.implicit_drops;  // holding, asks again: dropped unseen just before
            end_hold(th, was, t, false);
        }
        th.gil = &p;
        th.st.gil_mask |= uint64_t{1} << std::min<uint32_t>(p.st.index, 63);
        ++th.st.takes;
        th.state = GilState::Waiting;
        th.since = t;
        account(p, t);
        ++p.waiters;
        waiters_changed(p, t);
        break;
    case TpKind::GilTakeReturn:
        if (th.state == GilState::Waiting) {
            end_wait(th, t, false);
            account(p, t);
            --p.waiters;
            waiters_changed(p, t);
        } else {
            ++anomalies_.return_without_take;
        }
        account(p, t);
        if (p.holder > 0 && p.holder != th.st.tid) end_unseen_hold(p, t);
        th.st.gil_mask |= uint64_t{1} << std::min<uint32_t>(p.st.index, 63);
        ++p.holders;
        set_holder(p, th.st.tid, t);
        th.state = GilState::Holding;
        th.since = t;
        break;
    case TpKind::GilDrop:
        ++th.st.drops;
        if (th.state == GilState::Holding) {
            end_hold(th, p, t, false);
        } else {
            ++anomalies_.drop_without_take;
            if (th.state == GilState::Waiting) {
                end_wait(th, t, false);
                account(p, t);
                --p.waiters;
                waiters_changed(p, t);
            }
        }
        th.state = GilState::Dropping;
        th.since = t;
        break;
    case TpKind::GilDropReturn:
        if (th.state == GilState::Dropping) th.state = GilState::None;
        break;
    default: break;
    }
    if (listener_) {
        tell(p, t);
        if (&was != &p) tell(was, t);
    }
}

void GilTracker::finish(uint64_t end) {
    for (auto& th : all_) {
        Process& p = th.gil ? *th.gil : process_of(th.st.tgid);
        uint64_t e = std::max(end, th.since);
        if (th.state == GilState::Waiting) {
            end_wait(th, e, true);
            account(p, e);
            --p.waiters;
        } else if (th.state == GilState::Holding) {
            end_hold(th, p, e, true);
        }
        th.state = GilState::None;
    }
    for (auto& p : procs_) {
        if (window_ && end >= window_->lo) open_window_count(p);
        account(p, std::max(end, p.changed));
        if (p.holder > 0) set_holder(p, -1, std::max(end, p.holder_since));
        tell(p, std::max(end, p.changed));
    }
}

GilState GilTracker::state(int32_t tid) const {
    Thread* const* p = threads_.find(tid);
    return p ? (*p)->state : GilState::None;
}

const GilThreadStats* GilTracker::thread(int32_t tid) const {
    Thread* const* p = threads_.find(tid);
    return p ? &(*p)->st : nullptr;
}

std::vector<GilThreadStats> GilTracker::threads() const {
    std::vector<GilThreadStats> out;
    for (const auto& th : all_) out.push_back(th.st);
    return out;
}

std::vector<GilThreadStats> GilTracker::live_threads(uint64_t now) const {
    std::vector<GilThreadStats> out;
    out.reserve(all_.size());
    for (const auto& th : all_) {
        GilThreadStats& st = out.emplace_back(th.st);
        if (now <= th.since) continue;
        if (th.state == GilState::Waiting) st.wait_ns += now - th.since;
        else if (th.state == GilState::Holding) st.hold_ns += now - th.since;
    }
    return out;
}

std::vector<GilTracker::LiveGil> GilTracker::live_gils(uint64_t now) const {
    std::vector<LiveGil> out;
    for (const auto& p : procs_) {
        LiveGil& g = out.emplace_back();
        g.st = p.st;
        g.holder = p.holders ? p.holder : -1;
        g.waiters = p.waiters;
        if (now <= p.changed) continue;
        const uint64_t d = now - p.changed;
        if (p.holders > 0) g.st.held_ns += d;
        if (p.holders > 0 && p.waiters > 0) g.st.contended_ns += d;
        if (p.waiters > 0) g.st.waiting_ns += d;
    }
    return out;
}

std::vector<GilProcessStats> GilTracker::processes() const {
    std::vector<GilProcessStats> out;
    for (const auto& p : procs_) out.push_back(p.st);
    std::sort(out.begin(), out.end(),
              [](auto& a, auto& b) { return a.pid != b.pid ? a.pid < b.pid : a.index < b.index; });
    return out;
}

}  // namespace gilscan

namespace gilscan {

SleepClassifier gil_probe_classifier(const GilTracker& gil) {
    return [&gil](const Sample& s, const EventInfo&, const PrevState& ps, SleepLabel& l) {
        if (ps.cls != StateClass::Sleeping || !gil.seen_probes()) return;
        switch (gil.state(s.tid)) {
        case GilState::Waiting:
            if (l.text) {
                l.name = "S(GIL)";
                l.evidence_literal = "inside take_gil (uprobe)";
            }
            l.gil = true;
            break;
        case GilState::Dropping:
            if (l.text) {
                l.name = "S(GIL handoff)";
                l.evidence_literal = "inside drop_gil (uprobe)";
            }
            break;
        default: break;
        }
    };
}

}  // namespace gilscan
