// The timeline's task records: COMM, FORK, EXIT, LOST and SWITCH, which
// say who a thread is, when it began and ended, when its state is unknown,
// and (perf record --switch-events) when it was switched in.
#include "gilscan/sched/timeline.h"

namespace gilscan {

void Timeline::on_comm(const CommEvent& e) {
    uint64_t t = e.sid.has_time ? e.sid.time : last_time_;
    Thread* const* it = live_.find(e.tid);
    if (e.exec && it && (*it)->st.monitored && t > 0) {
        // exec replaces the program (a pyenv shim's bash becoming python):
        // the thread's statistics start again under the new program.
        Thread& old = **it;
        close(old, t, false);
        touch(old, t);
        const bool known = old.known && !old.dead;
        const SpanKind state = old.state;
        const uint32_t cpu = old.cpu;
        old.dead = true;
        old.known = false;
        old.st.replaced_by_exec = true;
        live_.erase(e.tid);
        Thread& th = thread(e.tid);
        set_tgid(th, e.pid);
        th.st.comm = std::string(e.comm);
        th.st.monitored = true;
        th.known = known;
        th.state = state;
        th.state_letters = span_kind_name(state);
        th.since = t;
        th.cpu = cpu;
        touch(th, t);
        return;
    }
    Thread& th = thread(e.tid);
    set_tgid(th, e.pid);
    th.st.comm = std::string(e.comm);
}

void Timeline::on_fork(const TaskEvent& e) {
    Thread* const* it = live_.find(e.tid);
    if (it && ((*it)->st.exited || (*it)->dead)) live_.erase(e.tid);
    Thread& th = thread(e.tid);
    set_tgid(th, e.pid);
    if (th.st.comm.empty()) {
        if (Thread* const* p = live_.find(e.ptid)) th.st.comm = (*p)->st.comm;
    }
}

void Timeline::on_exit(const TaskEvent& e) {
    const uint64_t t = e.sid.has_time ? e.sid.time : e.time ? e.time : last_time_;  // as perf script shows it
    if (Thread* const* p = live_.find(e.tid)) end_thread(**p, t);
}

void Timeline::end_thread(Thread& th, uint64_t t) {
    if (th.st.exited) return;  // sched_process_exit and PERF_RECORD_EXIT both come
    th.st.exited = true;
    if (!th.known || th.dead) return;
    const uint64_t at = std::max(t, th.since);
    close(th, at, false);
    if (observer_) [[unlikely]]
        observer_->thread_gone(th.st.tgid, th.st.tid, at);
    touch(th, at);
    th.known = false;
    th.dead = true;  // stays findable by its tid until the tid is reused (on_fork)
}

void Timeline::on_lost(const LostEvent& e) {
    uint64_t t = e.sid.has_time ? e.sid.time : last_time_;
    const bool any_cpu = e.sid.cpu == ~0u;
    uint64_t gap_start = t;
    if (!any_cpu) {
        if (const uint64_t* c = cpu_last_.find(e.sid.cpu)) gap_start = std::min(*c, t);
    }
    // Threads in first-seen order (a tid's earlier, replaced entries skipped).
    for (uint32_t idx = 0; idx < all_.size(); ++idx) {
        Thread& th = all_[idx];
        Thread* const* live = live_.find(th.st.tid);
        if (!live || *live != &th) continue;
        if (!th.known || th.dead || th.state == SpanKind::Unknown) continue;
        if (!any_cpu && th.cpu != e.sid.cpu) continue;
        uint64_t cut = std::max(th.since, gap_start);
        if (cut > th.since) {
            close(th, cut, false);
        } else {
            th.waker = -1;  // nothing known of this state: it becomes the unknown span
            th.preempted = false;
            th.label = SleepLabel{};
        }
        th.state = SpanKind::Unknown;
        th.state_letters = "?";
        th.since = cut;
    }
}

// A switch-in record is written in the task's own context, so it shows the
// switch-ins a per-process recording's sched_switch misses (another
// process's task switched the thread in; sched_switch fires in that task's
// context). A thread whose switch-in was traced is running already and
// stays so; a runnable one runs from here, its wait for a CPU exact; a
// sleeping one was woken unrecorded (hidden_wakeups): its sleep ends here,
// the wait for a CPU after the real wake-up inside it. Switch-outs are left
// to sched_switch, whose prev_state tells which sleep begins. The scheduler
// tap (the .pftrace's) gets every switch-in record, to write the switches
// its sched_switch events lack.
void Timeline::on_switch(const SwitchEvent& e) {
    if (e.out || !e.sid.has_time || e.sid.tid <= 0) return;
    const uint64_t t = e.sid.time;
    last_time_ = std::max(last_time_, t);
    if (e.sid.cpu != ~0u) cpu_last_.set(e.sid.cpu, t);
    Thread& th = thread(e.sid.tid);
    if (th.dead) return;
    set_tgid(th, e.sid.pid);
    touch(th, t);
    th.st.monitored = true;
    th.last_own = t;
    if (tap_ && e.sid.cpu != ~0u && (!window_ || window_->contains(t)))
        tap_->switch_in(e.sid.cpu, t, th.st.tid, th.prio, th.st.comm);
    if (th.known && th.state == SpanKind::Running) return;
    if (th.known && th.state != SpanKind::Runnable && th.state != SpanKind::Unknown) {
        if (t <= th.since) return;  // not after its switch-out (as own_event): nothing to end
        if (!window_ || window_->contains(t)) ++th.st.hidden_wakeups;
    }
    switch_in(th, th.known ? std::max(t, th.since) : t, e.sid.cpu);
}

}  // namespace gilscan
