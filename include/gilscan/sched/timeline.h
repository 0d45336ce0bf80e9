// Stage: per-thread scheduler state machines -> state spans.
//
//   Timeline tl(session, sink);          // sink receives every closed Span
//   session.run(tl);                     // Timeline is an EventSink
//   tl.finish(session.stats().last_time) // cut spans still open, mark them
//   for (const ThreadStats& t : tl.threads()) ...
//
// States come from sched_switch (prev_state decoded numerically), wake-ups
// (sched_waking / sched_wakeup / sched_wakeup_new) and process events. A
// sleep starts at the switch-out and ends at the first wake-up or switch-in
// of that thread after it. A waking that reaches a thread a few microseconds
// before its own switch-out is seen (the kernel's try_to_wake_up racing
// __schedule on another CPU) ends that sleep at once instead of leaving it
// open until the next wake-up. LOST records make the states of the threads
// last seen on that CPU unknown until their next event.
//
// sched_switch fires in the context of the task switched out, so a recording
// of one process (not -a) never sees its threads switched in by another
// process's task. A thread woken or preempted and next seen as the current
// task of a sample was switched in unseen: that interval is "on a CPU or
// waiting for one" and is counted as running (hidden_switch_ins counts them).
// Some kernels do not hand a wake-up by another process's task (an
// interrupt on an idle CPU included) to the woken task's events either: a
// sleeping thread seen as the current task of a sample other than its
// switch-out was woken and switched in unseen, and its sleep ends there
// (hidden_wakeups counts them). Switch records (perf record
// --switch-events, as gilscan record makes per-process recordings) are
// written in the task's own context and show every switch-in: a thread
// runs from its switch-in exactly, and a sleep whose wake-up went
// unrecorded ends there (counted in hidden_wakeups too).
// Spans are emitted only for monitored threads (seen as a sample's current
// task): a per-process recording names other processes' tasks only as
// switch-in targets and wake-up targets, whose states it cannot follow.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gilscan/sched/sched_events.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/tid_map.h"

namespace gilscan {

enum class SpanKind : uint8_t { Running, Runnable, Sleep, DiskSleep, Other, Unknown };

// What a sleep was, as far as the switch-out sample tells (filled by the GIL
// classifier stage when it has stacks; "S"/"D" otherwise).
struct SleepLabel {
    // Names and most evidence are literals (static storage), set as views:
    // the uprobe classifier's two string assignments per sleep were 4% of
    // the stages' instructions on a scheduler capture with its trace.
    std::string_view name;              // a literal: "S", "S(GIL)", "S(GIL handoff)", "D", ...
    std::string_view evidence_literal;  // evidence that is a literal ("inside take_gil (uprobe)")
    std::string evidence_built;         // or evidence built for this sleep (the matching frame)
    bool gil = false;       // counts towards gil_sleep_us
    std::string stack_json; // optional: the symbolized stack, a JSON array (when not shared)
    // Or the stack's text kept once by the classifier that made the label
    // (StackTexts): it stays valid as long as that classifier lives, which
    // is until the trace is written. Read both through stack().
    const std::string* stack_shared = nullptr;
    int64_t ticket = -1;    // >= 0: decided later (-j): the timeline resolves it when it emits the span
    // A GIL wait's Python function (--gil-functions): the perf map's name
    // for the first frame in JIT code past take_gil on its stack (CPython
    // 3.12+ -X perf: "py::spin:/app/work.py"). A view of the map's text,
    // which lives as long as the classifier's module cache; empty when
    // none was looked for or found.
    std::string_view function;
    // Whether name and evidence are read: a summary-only run's timeline reads
    // only gil (and the stack), so a classifier may leave them empty. Set by
    // the timeline before each call; clear() keeps it. The uprobe classifier
    // skips its two assignments by it (string copies once, 1.6% of the
    // stages' instructions; two stores since name and literal evidence are
    // views), the stack classifiers the built evidence of a GIL frame (7% of
    // a summary-only DWARF run's instructions). Labels made away from the
    // timeline (the reader's notes, -j workers' jobs) get it from
    // ReaderStacks::set_text and ParallelStackClassifier::set_text.
    bool text = true;
    // Back to "nothing known", keeping the strings' capacity: a thread's label
    // is rewritten at every switch-out without allocating.
    void clear() {
        name = {};
        evidence_literal = {};
        evidence_built.clear();
        gil = false;
        stack_json.clear();
        stack_shared = nullptr;
        ticket = -1;
        function = {};
    }
    std::string_view evidence() const { return evidence_literal.empty() ? std::string_view(evidence_built) : evidence_literal; }
    std::string_view stack() const { return stack_shared ? std::string_view(*stack_shared) : std::string_view(stack_json); }
};

struct Span {
    int32_t tgid = -1, tid = -1;
    uint64_t start = 0, end = 0;
    SpanKind kind = SpanKind::Unknown;
    std::string_view name;     // "R", "R+", "S", "D", "S(GIL)", "T", "unknown", ...
    std::string_view state;    // prev_state letters as perf prints them
    std::string_view evidence;
    std::string_view stack_json;  // JSON array text, or empty
    // A GIL wait's Python function (SleepLabel::function, --gil-functions),
    // or empty: a view of a perf map's text, valid until the trace is written.
    // Written as args.function beside the evidence (a GIL wait has evidence).
    std::string_view function;
    // stack_json's text is a classifier's kept text (SleepLabel::stack_shared),
    // valid until the trace is written: a sink may keep the view, not a copy.
    bool stack_stable = false;
    int32_t waker = -1;        // thread whose wake-up ended the sleep / runnable wait
    uint32_t cpu = ~0u;
    bool cut_at_end = false;   // still open when the recording ended
    bool woken_before_switch = false;
    bool preempted = false;    // runnable because switched out while runnable
};

// An event of another stage held back behind spans still waiting for their
// labels (Timeline::defer), replayed through `to` when its turn comes.
struct DeferredEvent;
class DeferredSink {
public:
    virtual ~DeferredSink() = default;
    virtual void replay(const DeferredEvent& e) = 0;
};
struct DeferredEvent {
    DeferredSink* to = nullptr;
    uint8_t kind = 0, what = 0;  // the sink's own codes
    bool cut = false;
    int32_t pid = 0, tid = 0, other = 0;
    uint32_t count = 0;
    uint64_t start = 0, end = 0;
};

class SpanSink {
public:
    virtual ~SpanSink() = default;
    virtual void span(const Span& s) = 0;
    // False: span() is never called; only the threads' figures are kept
    // (a summary-only run). Asked once, by the Timeline's constructor.
    virtual bool wants_spans() const { return true; }
    // False: of the spans, only labelled sleeps (named otherwise than their
    // state, as "S(GIL)") and sleeps with a stack (--sleep-stacks) are handed
    // on; the rest are counted, not built (a .pftrace writes no others:
    // Perfetto draws the plain states from the scheduler's events). Asked
    // once, as wants_spans().
    virtual bool wants_plain_spans() const { return true; }
};

struct ThreadStats {
    int32_t tid = -1, tgid = -1;
    std::string comm;
    uint64_t first_seen = 0, last_seen = 0;
    uint64_t running_ns = 0, runnable_ns = 0, sleep_ns = 0, disk_ns = 0, other_ns = 0, unknown_ns = 0;
    uint64_t sleep_count = 0, disk_count = 0;
    uint64_t gil_sleep_ns = 0, gil_sleep_count = 0;
    uint64_t switches_out = 0;
    uint64_t hidden_switch_ins = 0;  // woken/preempted, then seen running with no switch-in
    uint64_t hidden_switch_in_ns = 0;  // the time from those wake-ups/preemptions to being seen running
    // Sleeps ended with no wake-up recorded: at a switch-in record, or at the
    // first own event when the switch-in went unrecorded too.
    uint64_t hidden_wakeups = 0;
    bool exited = false;
    bool replaced_by_exec = false;  // the program this entry describes exec'd another
    bool seen_switch = false;
    bool monitored = false;  // seen as the current task of a sample: its events are recorded
};

// The S(GIL) sleeps of one process under one Python function
// (SleepLabel::function; "" for those none was named for).
struct GilFunctionStats {
    int32_t tgid = -1;
    std::string function;
    uint64_t sleep_ns = 0, sleep_count = 0;
};

// Told of each monitored thread's sleeps as the timeline meets them (GIL
// blame, blame.h): a sleep starts at its switch-out, labelled (the label's
// gil set for a GIL wait; never a ticket: no -j workers then), with the
// switch-out's sample; it ends at its wake-up or switch-in, waker the
// thread that woke it (-1: none seen) and waker_pid that thread's process.
class ThreadObserver {
public:
    virtual ~ThreadObserver() = default;
    virtual void sleep_started(int32_t pid, int32_t tid, uint64_t t, const SleepLabel& label, const Sample& s) = 0;
    virtual void sleep_ended(int32_t pid, int32_t tid, uint64_t t, int32_t waker_pid, int32_t waker, bool gil_wait) = 0;
    virtual void thread_gone(int32_t pid, int32_t tid, uint64_t t) = 0;
};

// Told of every decoded switch and wake-up inside the window, in the
// stages' order (the .pftrace writer's scheduler data, pftrace_writer.h):
// cpu is ~0u when the recording has no PERF_SAMPLE_CPU, cur_tid the task
// the event fired in (the sample's tid).
class SchedTap {
public:
    virtual ~SchedTap() = default;
    virtual void sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) = 0;
    virtual void sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) = 0;
    // A switch-in record (perf record --switch-events): tid runs on cpu
    // from t, whether or not a sched_switch showed it (a per-process
    // recording's does not when another process's task switched it in).
    // prio and comm are the thread's last seen (120 and "" if none).
    virtual void switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) = 0;
};

// Labels a sleep or disk sleep at its switch-out: writes into `label`, which
// arrives cleared (and keeps its capacity from the thread's earlier sleeps).
using SleepClassifier = std::function<void(const Sample&, const EventInfo&, const PrevState&, SleepLabel& label)>;

class Timeline final : public EventSink {
public:
    Timeline(const Session& session, SpanSink& sink);

    void set_classifier(SleepClassifier c) { classifier_ = std::move(c); }
    void set_observer(ThreadObserver* o) { observer_ = o; }
    void set_sched_tap(SchedTap* t) { tap_ = t; }
    // --time: states are clipped to it, threads' first/last times too; what
    // lies wholly outside is neither counted nor drawn.
    void set_window(const TimeWindow* w) { window_ = w; }
    // Whether its sink wants spans: what it sets every label's text to
    // (SleepLabel::text), for labels made elsewhere to follow.
    bool spans_wanted() const { return spans_wanted_; }
    // For labels the classifier returned as tickets (see SleepLabel::ticket):
    // resolver(ticket, wait) gives the label, or nothing yet when !wait.
    // Spans after an unresolved one wait in order, so the output is the same
    // as with immediate labels.
    using Resolver = std::function<std::optional<SleepLabel>(int64_t, bool)>;
    void set_resolver(Resolver r) { resolver_ = std::move(r); }
    // Other stages writing to the same trace (the GIL tracker) must hold
    // their events back the same way while spans wait, or a -j 3 trace
    // orders them otherwise than -j 1's: holding() says spans wait, and
    // defer(e) queues e behind them (InOrderTraceSink, trace_writer.h).
    bool holding() const { return !pending_.empty(); }
    void defer(const DeferredEvent& e);

    // Inline, and a GIL probe's sample apart (half of a uprobe capture's
    // samples: only their task's sign of life matters here) from the
    // scheduler's: the one function for all took some 70 instructions a probe.
    void on_sample(const Sample& s, const EventInfo& ev) override {
        if (!pending_.empty()) [[unlikely]]
            drain(false);
        const TpKind k = ev.kind;
        if (k == TpKind::Other) return;
        if (is_gil_probe(k))
            running_sample(s);
        else
            sched_sample(s, ev, k);
    }
    void on_comm(const CommEvent& e) override;
    void on_fork(const TaskEvent& e) override;
    void on_exit(const TaskEvent& e) override;
    void on_lost(const LostEvent& e) override;
    void on_switch(const SwitchEvent& e) override;

    // Cut every open span at `end` (the recording's last timestamp).
    void finish(uint64_t end);

    // gilscan top: each thread's figures with its open state counted up to
    // `now`, as finish(now) would, with nothing closed; in first-seen order.
    struct LiveThread {
        ThreadStats st;
        bool alive = false;  // neither exited nor replaced
    };
    std::vector<LiveThread> live(uint64_t now) const;
    // The latest time of a scheduler event or GIL probe seen so far.
    uint64_t latest() const { return last_time_; }
    // Threads in first-seen order (a tid reused after exit gets a new entry).
    // Pointers into the timeline (valid while it lives): a capture with
    // hundreds of thousands of threads is not copied for the summary.
    std::vector<const ThreadStats*> threads() const;
    // --gil-functions: S(GIL) sleeps totalled by (process, label.function)
    // as their spans are emitted, when every label is final.
    void set_gil_functions(bool on) { gil_functions_ = on; }
    // By process, then function ("" first).
    std::vector<GilFunctionStats> gil_functions() const;
    uint64_t wakeups_while_running() const { return wake_while_running_; }
    uint64_t sched_events() const { return sched_events_; }
    // A sched_switch of the idle task (prev_pid 0) was recorded: the events
    // were opened per CPU (perf record -a, -C), not per task, and an
    // unrecorded switch-in is not the per-process recording's blind spot.
    bool cpu_wide() const { return idle_switch_outs_ > 0; }
    const TracepointDecoder& decoder() const { return dec_; }

    static constexpr uint64_t kWakeRaceWindowNs = 200'000;

private:
    struct Thread {
        ThreadStats st;
        SpanKind state = SpanKind::Unknown;
        bool known = false;        // state is meaningful (else: not yet seen / after a loss)
        uint64_t since = 0;
        uint32_t cpu = ~0u;
        uint64_t last_own = 0;     // last time this thread was the current task in a sample
        std::string_view state_letters;  // a literal or the decoder's cached PrevState letters
        SleepLabel label;
        bool preempted = false;
        int32_t waker = -1;
        uint64_t early_wake = 0;   // waking seen while still running
        int32_t early_waker = -1;
        bool has_early_wake = false;
        bool woken_before_switch = false;
        bool dead = false;
        int32_t prio = 120;        // the kernel's, as the last switch or wake-up naming it said
    };

    // The live thread of a tid (made on first sight). Inline: every event
    // looks up one to three; the map holds the thread itself, not an index
    // into all_ (one dependent load less), and making one is out of line.
    Thread& thread(int32_t tid) {
        if (Thread* const* p = live_.find(tid)) return **p;
        return add_thread(tid);
    }
    Thread& add_thread(int32_t tid);
    void set_tgid(Thread& th, int32_t tgid) {
        if (tgid > 0) th.st.tgid = tgid;
    }
    void close(Thread& th, uint64_t t, bool cut, std::optional<SpanKind> as = std::nullopt);
    void emit(Thread& th, uint64_t start, uint64_t end, bool cut);
    void outside_window(Thread& th, uint64_t start, uint64_t end, bool cut);
    [[gnu::noinline]] void emit_gil_functions(Thread& th, uint64_t start, uint64_t end, bool cut);
    template <bool kGilFunctions>
    [[gnu::always_inline]] void emit_as(Thread& th, uint64_t start, uint64_t end, bool cut);
    Span span_of(const Thread& th, uint64_t start, uint64_t end, bool cut) const;
    void switch_out(Thread& th, uint64_t t, uint32_t cpu, const PrevState& ps, const Sample& s, const EventInfo& ev);
    // The thread exited at t (PERF_RECORD_EXIT, sched_process_exit): its
    // state closes there. perf stops recording an exiting task before its
    // last switch-out, so without this a thread that exits early would stay
    // "running" until the recording ends.
    void end_thread(Thread& th, uint64_t t);
    void switch_in(Thread& th, uint64_t t, uint32_t cpu);
    void wake(Thread& th, uint64_t t, int32_t waker);
    void touch(Thread& th, uint64_t t) {
        if (t < th.st.first_seen) th.st.first_seen = t;
        if (t > th.st.last_seen) th.st.last_seen = t;
    }
    // An event of th's own (th is running at t). A sleeping thread's own
    // event other than its switch-out (which ends the sleep itself) means
    // its wake-up and switch-in both went unrecorded: hidden_wakeup.
    template <bool kSwitchOut = false>
    void own_event(Thread& th, uint64_t t, bool proves_monitored) {
        // Wake-up tracepoints can reach the woken task's events (__perf_task)
        // with the waker as the sample's task: a waker from an unrecorded
        // process can show up there, so only other samples prove a thread is
        // recorded.
        if (proves_monitored) th.st.monitored = true;
        if (th.known && th.state != SpanKind::Running && t > th.since) [[unlikely]] {
            if (th.state == SpanKind::Runnable) hidden_switch_in(th, t);
            else if (!kSwitchOut && th.state != SpanKind::Unknown) hidden_wakeup(th, t);
        }
        th.last_own = t;
    }
    void hidden_switch_in(Thread& th, uint64_t t);
    void hidden_wakeup(Thread& th, uint64_t t);
    void sched_sample(const Sample& s, const EventInfo& ev, TpKind k);
    // A sample of a running task's own (a GIL probe's): as sched_sample
    // begins for the scheduler's events other than sched_switch. (Apart from it: with one
    // helper for both, GCC inlines it into neither.)
    void running_sample(const Sample& s) {
        const uint64_t t = s.time;
        last_time_ = std::max(last_time_, t);
        if (s.cpu != ~0u) cpu_last_.set(s.cpu, t);
        if (s.tid > 0) {
            Thread& cur = thread(s.tid);
            set_tgid(cur, s.pid);
            touch(cur, t);
            own_event(cur, t, true);
        }
    }

    const Session& session_;
    SpanSink& sink_;
    const bool spans_wanted_;
    const bool plain_spans_wanted_;
    TracepointDecoder dec_;
    SleepClassifier classifier_;
    ThreadObserver* observer_ = nullptr;
    SchedTap* tap_ = nullptr;
    const TimeWindow* window_ = nullptr;
    [[gnu::noinline]] void observe_sleep_end(const Thread& th, uint64_t t);
    Resolver resolver_;
    struct PendingSpan {
        Span span;
        std::string name, state, evidence, stack;  // what the span's views point at (the stack: unless stable)
        int64_t ticket = -1;                       // >= 0: the label is not known yet
        ThreadStats* st = nullptr;
        DeferredEvent other;                       // other.to set: another stage's event, not a span
    };
    std::deque<PendingSpan> pending_;
    void output(const Span& s, int64_t ticket, ThreadStats* st);
    void hold(PendingSpan&& p);  // queued behind the waiting spans, their number bounded
    void drain(bool wait);
    std::deque<Thread> all_;  // deque: references stay valid as threads are added
    PtrIdMap<Thread> live_;  // tid -> its live entry in all_
    // cpu -> time of its last event, set by every scheduler event and probe:
    // an array for the CPU numbers machines have (a hash map's set was a
    // dozen instructions a record), a map for any other a file may hold.
    struct CpuLast {
        static constexpr uint32_t kDense = 1024;
        std::array<uint64_t, kDense> time{};
        std::array<bool, kDense> seen{};
        IdMap<uint64_t> other;
        void set(uint32_t cpu, uint64_t t) {
            if (cpu < kDense) [[likely]] {
                time[cpu] = t;
                seen[cpu] = true;
            } else {
                other.set(cpu, t);
            }
        }
        const uint64_t* find(uint32_t cpu) const {
            if (cpu < kDense) return seen[cpu] ? &time[cpu] : nullptr;
            return other.find(cpu);
        }
    };
    CpuLast cpu_last_;
    // Out of line and cold: inlined, its map code cost every span emitted.
    [[gnu::noinline, gnu::cold]] void count_gil_function(int32_t tgid, std::string_view function, uint64_t d);
    struct FunctionKeyLess {  // (tgid, name) as std::string or std::string_view alike
        using is_transparent = void;
        template <class A, class B>
        bool operator()(const A& a, const B& b) const {
            return a.first != b.first ? a.first < b.first : std::string_view(a.second) < std::string_view(b.second);
        }
    };
    struct FunctionTotals {
        uint64_t sleep_ns = 0, sleep_count = 0;
    };
    bool gil_functions_ = false;
    std::map<std::pair<int32_t, std::string>, FunctionTotals, FunctionKeyLess> by_function_;
    uint64_t wake_while_running_ = 0;
    uint64_t sched_events_ = 0;
    uint64_t idle_switch_outs_ = 0;
    uint64_t last_time_ = 0;
};

std::string_view span_kind_name(SpanKind k);

}  // namespace gilscan
