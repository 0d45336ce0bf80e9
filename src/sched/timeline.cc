#include "gilscan/sched/timeline.h"

namespace gilscan {

std::string_view span_kind_name(SpanKind k) {
    switch (k) {
    case SpanKind::Running: return "R";
    case SpanKind::Runnable: return "R+";
    case SpanKind::Sleep: return "S";
    case SpanKind::DiskSleep: return "D";
    case SpanKind::Other: return "other";
    case SpanKind::Unknown: return "unknown";
    }
    return "unknown";
}

Timeline::Timeline(const Session& session, SpanSink& sink)
    : session_(session), sink_(sink), spans_wanted_(sink.wants_spans()),
      plain_spans_wanted_(sink.wants_plain_spans()) {}

__attribute__((noinline)) Timeline::Thread& Timeline::add_thread(int32_t tid) {
    Thread& th = all_.emplace_back();
    th.st.tid = tid;
    th.st.first_seen = ~uint64_t{0};  // set by the first scheduler event, not by COMM/FORK
    th.st.last_seen = 0;
    live_.set(tid, &th);
    return th;
}

// Running now, while asleep as far as the recording shows: a per-process
// recording sees neither a wake-up by another process's task (an interrupt
// on an idle CPU included: the kernel hands such wakings to the woken
// task's events on some kernels, not on others) nor the switch-in that
// follows. The sleep ends here, at the first sign of life; the time from
// the real wake-up to it stays in the sleep.
void Timeline::hidden_wakeup(Thread& th, uint64_t t) {
    if (!window_ || window_->contains(t)) ++th.st.hidden_wakeups;
    close(th, t, false);
    th.state = SpanKind::Running;
    th.state_letters = "R";
    th.since = t;
}

// Running now, but its switch-in was not recorded: the interval since the
// wake-up/preemption cannot be split into runnable and running.
void Timeline::hidden_switch_in(Thread& th, uint64_t t) {
    if (!window_ || window_->overlap(th.since, t) || window_->contains(t)) ++th.st.hidden_switch_ins;
    if (t > th.since) th.st.hidden_switch_in_ns += window_ ? window_->overlap(th.since, t) : t - th.since;
    close(th, t, false, SpanKind::Running);
    th.state = SpanKind::Running;
    th.state_letters = "R";
    th.since = t;
}

// Two copies, for and without --gil-functions: the out-of-line call to
// count a GIL wait's function made every emit save five registers up front
// (it is in the middle of the summary's path, where the rest returns early),
// 12 instructions a span on a summary-only DWARF run.
void Timeline::emit(Thread& th, uint64_t start, uint64_t end, bool cut) {
    if (gil_functions_) [[unlikely]]
        return emit_gil_functions(th, start, end, cut);
    emit_as<false>(th, start, end, cut);
}

void Timeline::emit_gil_functions(Thread& th, uint64_t start, uint64_t end, bool cut) {
    emit_as<true>(th, start, end, cut);
}

template <bool kGilFunctions>
inline void Timeline::emit_as(Thread& th, uint64_t start, uint64_t end, bool cut) {
    if (!th.st.monitored) return;  // another process's task in a per-process recording
    if (end < start) end = start;  // cross-CPU clock jitter: never negative
    if (window_) [[unlikely]]
        if (!window_->clip(start, end)) return outside_window(th, start, end, cut);
    const uint64_t d = end - start;
    // The thread's figures first; the span itself only for a sink that
    // wants spans (a summary-only run's sink does not: building and handing
    // on a span it drops was a sixth of the timeline's instructions).
    std::string_view name;
    switch (th.state) {
    case SpanKind::Running:
        name = "R";
        th.st.running_ns += d;
        break;
    case SpanKind::Runnable:
        name = "R+";
        th.st.runnable_ns += d;
        break;
    case SpanKind::Sleep:
        if (th.label.ticket >= 0 && resolver_) {
            // Being unwound on a worker: counted and written once it is known.
            Span s = span_of(th, start, end, cut);
            s.name = "S";
            output(s, th.label.ticket, &th.st);
            return;
        }
        name = th.label.name.empty() ? std::string_view("S") : th.label.name;
        th.st.sleep_ns += d;
        ++th.st.sleep_count;
        if (th.label.gil) {
            th.st.gil_sleep_ns += d;
            ++th.st.gil_sleep_count;
            if constexpr (kGilFunctions) count_gil_function(th.st.tgid, th.label.function, d);
        }
        break;
    case SpanKind::DiskSleep:
        name = "D";
        th.st.disk_ns += d;
        ++th.st.disk_count;
        break;
    case SpanKind::Other:
        name = th.state_letters;
        th.st.other_ns += d;
        break;
    case SpanKind::Unknown:
        name = "unknown";
        th.st.unknown_ns += d;
        break;
    }
    if (!spans_wanted_) return;
    if (!plain_spans_wanted_ &&
        (th.state != SpanKind::Sleep || (th.label.name == th.state_letters && th.label.stack().empty())))
        return;
    Span s = span_of(th, start, end, cut);
    s.name = name;
    if (th.state == SpanKind::Sleep) {
        s.evidence = th.label.evidence();
        s.stack_json = th.label.stack();
        s.stack_stable = th.label.stack_shared != nullptr;
        if constexpr (kGilFunctions) s.function = th.label.function;
    } else if (th.state == SpanKind::DiskSleep) {
        s.evidence = th.label.evidence();
    }
    output(s, -1, nullptr);
}

Span Timeline::span_of(const Thread& th, uint64_t start, uint64_t end, bool cut) const {
    Span s;
    s.tgid = th.st.tgid > 0 ? th.st.tgid : th.st.tid;
    s.tid = th.st.tid;
    s.start = start;
    s.end = end;
    s.kind = th.state;
    s.cpu = th.cpu;
    s.cut_at_end = cut;
    s.waker = th.waker;
    s.preempted = th.preempted;
    s.woken_before_switch = th.woken_before_switch;
    s.state = th.state_letters;
    return s;
}

void Timeline::observe_sleep_end(const Thread& th, uint64_t t) {
    int32_t waker_pid = -1;
    if (th.waker > 0)
        if (Thread* const* w = live_.find(th.waker)) waker_pid = (*w)->st.tgid;
    observer_->sleep_ended(th.st.tgid, th.st.tid, t, waker_pid, th.waker, th.label.gil);
}

void Timeline::close(Thread& th, uint64_t t, bool cut, std::optional<SpanKind> as) {
    if (observer_ && th.known && !th.dead && (th.state == SpanKind::Sleep || th.state == SpanKind::DiskSleep)) [[unlikely]]
        observe_sleep_end(th, t);
    if (th.known && !th.dead) {
        if (as) {
            SpanKind real = th.state;
            th.state = *as;
            th.state_letters = "R";
            emit(th, th.since, t, cut);
            th.state = real;
        } else {
            emit(th, th.since, t, cut);
        }
    }
    th.waker = -1;
    th.preempted = false;
    th.woken_before_switch = false;
    th.label.clear();
}

void Timeline::switch_out(Thread& th, uint64_t t, uint32_t cpu, const PrevState& ps, const Sample& s,
                          const EventInfo& ev) {
    ++th.st.switches_out;
    if (th.st.exited && th.dead) {  // its last switch-out, after its exit closed it
        if (ps.cls == StateClass::Dead) live_.erase(th.st.tid);
        return;
    }
    th.st.seen_switch = true;
    close(th, t, false);
    th.known = true;
    th.since = t;
    th.cpu = cpu;
    th.state_letters = ps.letters;
    switch (ps.cls) {
    case StateClass::Runnable:
        th.state = SpanKind::Runnable;
        th.preempted = true;
        break;
    case StateClass::Sleeping:
    case StateClass::DiskSleep: {
        th.state = ps.cls == StateClass::Sleeping ? SpanKind::Sleep : SpanKind::DiskSleep;
        th.label.clear();
        th.label.text = spans_wanted_;
        if (classifier_) classifier_(s, ev, ps, th.label);
        if (spans_wanted_ && th.label.name.empty() && th.label.ticket < 0)
            th.label.name = ps.cls == StateClass::Sleeping ? "S" : "D";
        if (observer_) [[unlikely]]
            observer_->sleep_started(th.st.tgid, th.st.tid, t, th.label, s);
        // try_to_wake_up on another CPU can trace sched_waking just before
        // this switch-out is traced. That wake-up waits for the switch to
        // finish, then enqueues the task (sched_wakeup): the sleep lasts from
        // here to that enqueue, or to the switch-in when no sched_wakeup is
        // recorded, and its waker is the early one.
        if (th.has_early_wake && th.early_wake >= th.last_own && t - th.early_wake <= kWakeRaceWindowNs) {
            th.waker = th.early_waker;
            th.woken_before_switch = true;
        }
        break;
    }
    case StateClass::Dead:
        th.dead = true;
        th.known = false;
        live_.erase(th.st.tid);
        break;
    default:
        th.state = SpanKind::Other;
        break;
    }
    th.has_early_wake = false;
}

void Timeline::switch_in(Thread& th, uint64_t t, uint32_t cpu) {
    close(th, t, false);
    th.known = true;
    th.state = SpanKind::Running;
    th.state_letters = "R";
    th.since = t;
    th.cpu = cpu;
    th.has_early_wake = false;
}

void Timeline::wake(Thread& th, uint64_t t, int32_t waker) {
    switch (th.state) {
    case SpanKind::Sleep:
    case SpanKind::DiskSleep:
    case SpanKind::Other:
        if (!th.known) break;
        if (t <= th.since && waker != th.st.tid) {
            // Another CPU's waking stamped with the switch-out's own
            // nanosecond, ordered after it only by the tie: the race the
            // switch-out handles for an earlier waking. Ending the sleep here
            // would make one of no length, counted but drawn nowhere; it goes
            // on to the enqueue (sched_wakeup) or the switch-in instead.
            if (!th.woken_before_switch) th.waker = waker;
            th.woken_before_switch = true;
            break;
        }
        if (!th.woken_before_switch) th.waker = waker;  // else the early waking's waker
        waker = th.waker;
        close(th, t, false);
        th.state = SpanKind::Runnable;
        th.state_letters = "R";
        th.since = t;
        th.waker = waker;
        break;
    case SpanKind::Running:
        // A waking in the task's own context (an interrupt on its CPU) finds
        // it still queued and ends no sleep to come: only another CPU's
        // try_to_wake_up races the switch-out.
        if (th.known) ++wake_while_running_;
        if (th.known && waker != th.st.tid) {
            th.has_early_wake = true;
            th.early_wake = t;
            th.early_waker = waker;
        }
        break;
    case SpanKind::Unknown:
        if (th.known) close(th, t, false);  // after a loss: the gap ends here
        th.known = true;
        th.state = SpanKind::Runnable;
        th.state_letters = "R";
        th.since = t;
        th.waker = waker;
        break;
    case SpanKind::Runnable:
        break;  // the sched_wakeup that follows a sched_waking
    }
}

void Timeline::sched_sample(const Sample& s, const EventInfo& ev, TpKind k) {
    const uint64_t t = s.time;
    last_time_ = std::max(last_time_, t);
    if (s.cpu != ~0u) cpu_last_.set(s.cpu, t);
    const bool swap = session_.swap();
    // The sample's own task is running now: learn its process.
    if (s.tid > 0 && k != TpKind::SchedSwitch) {
        Thread& cur = thread(s.tid);
        set_tgid(cur, s.pid);
        touch(cur, t);
        own_event(cur, t, k != TpKind::SchedWaking && k != TpKind::SchedWakeup && k != TpKind::SchedWakeupNew);
    }
    switch (k) {
    case TpKind::SchedSwitch: {
        SchedSwitch sw;
        if (!dec_.decode(s, ev, swap, sw)) return;
        ++sched_events_;
        if (tap_ && (!window_ || window_->contains(t))) tap_->sched_switch(s.cpu, t, s.tid, sw);
        idle_switch_outs_ += sw.prev_pid == 0;
        if (sw.prev_pid > 0) {
            Thread& p = thread(sw.prev_pid);
            p.prio = sw.prev_prio;
            if (s.tid == sw.prev_pid) set_tgid(p, s.pid);
            if (p.st.comm.empty() || p.st.comm != sw.prev_comm) p.st.comm = std::string(sw.prev_comm);
            touch(p, t);
            uint64_t last_own = p.last_own;
            own_event<true>(p, t, true);
            p.last_own = last_own;  // the race check below wants the task's previous sign of life
            const PrevState& ps = dec_.prev_state(ev, sw.prev_state);
            switch_out(p, t, s.cpu, ps, s, ev);
            p.last_own = t;
        }
        if (sw.next_pid > 0) {
            Thread& n = thread(sw.next_pid);
            n.prio = sw.next_prio;
            if (n.st.comm.empty()) n.st.comm = std::string(sw.next_comm);
            touch(n, t);
            switch_in(n, t, s.cpu);
        }
        break;
    }
    case TpKind::SchedWaking:
    case TpKind::SchedWakeup:
    case TpKind::SchedWakeupNew: {
        SchedWake w;
        if (!dec_.decode(s, ev, swap, w)) return;
        ++sched_events_;
        if (tap_ && (!window_ || window_->contains(t))) tap_->sched_wake(s.cpu, t, s.tid, k, w);
        if (w.pid <= 0) return;
        Thread& th = thread(w.pid);
        th.prio = w.prio;
        if (th.st.comm.empty()) th.st.comm = std::string(w.comm);
        touch(th, t);
        wake(th, t, s.tid);
        break;
    }
    case TpKind::SchedProcessFork: {
        SchedFork f;
        if (!dec_.decode(s, ev, swap, f)) return;
        ++sched_events_;
        if (f.child_pid <= 0) return;
        Thread& c = thread(f.child_pid);
        if (!f.child_comm.empty()) c.st.comm = std::string(f.child_comm);
        touch(c, t);
        break;
    }
    case TpKind::SchedProcessExit: {
        SchedExit x;
        if (!dec_.decode(s, ev, swap, x)) return;
        ++sched_events_;
        if (Thread* const* p = live_.find(x.pid)) end_thread(**p, t);
        break;
    }
    default: break;
    }
}

void Timeline::finish(uint64_t end) {
    for (auto& th : all_) {
        if (!th.known || th.dead) continue;
        uint64_t e = std::max(end, th.since);
        close(th, e, true);
        th.known = false;
        touch(th, e);
    }
    drain(true);
}

std::vector<Timeline::LiveThread> Timeline::live(uint64_t now) const {
    std::vector<LiveThread> out;
    out.reserve(all_.size());
    for (const auto& th : all_) {
        LiveThread& l = out.emplace_back();
        l.st = th.st;
        l.alive = !th.dead && !th.st.exited && !th.st.replaced_by_exec;
        if (!l.alive || !th.known || now <= th.since) continue;
        const uint64_t d = now - th.since;
        switch (th.state) {
        case SpanKind::Running: l.st.running_ns += d; break;
        case SpanKind::Runnable: l.st.runnable_ns += d; break;
        case SpanKind::Sleep:
            l.st.sleep_ns += d;
            if (th.label.gil) l.st.gil_sleep_ns += d;
            break;
        case SpanKind::DiskSleep: l.st.disk_ns += d; break;
        case SpanKind::Other: l.st.other_ns += d; break;
        case SpanKind::Unknown: break;
        }
        l.st.last_seen = std::max(l.st.last_seen, now);
    }
    return out;
}

std::vector<const ThreadStats*> Timeline::threads() const {
    std::vector<const ThreadStats*> out;
    out.reserve(all_.size());
    for (const auto& th : all_) out.push_back(&th.st);
    return out;
}

}  // namespace gilscan
