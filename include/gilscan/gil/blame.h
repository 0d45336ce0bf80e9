// Stage: GIL blame — who holds the GIL while other threads of its process
// wait for it, and what the holder was doing then.
//
//   GilBlame blame(maps, stacks);   // holders inferred until the uprobes' GilTracker calls it
//   tracker.set_listener(&blame); timeline.set_observer(&blame);
//   FanOutOf<ProcessMaps, GilTracker, Timeline, GilBlame> stages(...);   // last: CPU samples
//   blame.finish(end);
//   blame_rows(blame.charges(), stacks, blame.inferred())   // by (process, function), most contended first
//
// Contended hold: an instant at which a thread holds its process's GIL
// while at least one other thread waits for it. It is charged to what the
// holder was doing:
//   on CPU   (running, or runnable after a preemption): to the stack of the
//            holder's next CPU sample (cpu-clock, cycles: a sample stands
//            for the thread's CPU time before it);
//   off CPU  (asleep holding the GIL: a C call that blocks without releasing
//            it): to the stack of the holder's switch-out into that sleep.
// Who holds:
//   uprobes  take_gil's return to drop_gil, from the GilTracker (listener
//            calls whenever a GIL's holder or waiters change);
//   inferred without them, from the scheduler: a GIL wait is a sleep
//            labelled S(GIL) (its stack is in take_gil). drop_gil signals a
//            waiter, so the thread that wakes a GIL waiter of its process
//            held the GIL until then, since the previous such wake-up: the
//            time waited in between is charged to what that thread did in
//            it, and what the process's other threads did is dropped. Time
//            waited after the last such wake-up has no holder named.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "gilscan/gil/blame_stacks.h"
#include "gilscan/perfdata/time_window.h"
#include "gilscan/gil/gil_probes.h"
#include "gilscan/sched/tid_map.h"
#include "gilscan/sched/timeline.h"
#include "gilscan/symbols/process_maps.h"

namespace gilscan {

// What one (process, stack) was charged.
struct BlameCharge {
    int32_t pid = -1;
    uint32_t stack = 0;  // BlameStacks id
    uint64_t on_cpu_ns = 0, off_cpu_ns = 0;  // contended hold
    uint64_t hold_ns = 0;                    // all hold, contended or not (uprobes only)
    std::set<int32_t> tids;
    uint64_t contended_ns() const { return on_cpu_ns + off_cpu_ns; }
};

// One row of the blame table: a process's time charged to one function —
// the Python function where a stack names one, else the native culprit.
struct BlameRow {
    int32_t pid = -1;
    std::string function;        // "hog (/app/prog.py)", or the native culprit's name
    bool python = false;         // function is a Python function's
    std::string native, module;  // the heaviest native culprit under it, and its file
    uint64_t on_cpu_ns = 0, off_cpu_ns = 0;
    std::optional<uint64_t> hold_ns;  // all hold (uprobes only)
    uint32_t threads = 0;
    bool inferred = false;
    uint64_t contended_ns() const { return on_cpu_ns + off_cpu_ns; }
};

class GilBlame final : public EventSink, public GilListener, public ThreadObserver {
public:
    // Holders are inferred until the first gil_state call: from then on the
    // recording's GIL uprobes decide who holds (a pipe's events are known
    // only as they come), and what was inferred before is dropped.
    GilBlame(const ProcessMaps& maps, BlameStacks& stacks);

    // CPU samples: where on-CPU contended time lands.
    void on_sample(const Sample& s, const EventInfo& ev) override {
        if (ev.kind != TpKind::Other || ev.gil_kind != TpKind::Other || s.tid <= 0) return;
        cpu_sample(s, ev);
    }
    // GilListener: a GIL's holder and waiters from t on.
    void gil_state(int32_t pid, uint32_t gil, uint64_t t, int32_t holder, uint32_t waiters, void*& cookie) override;
    // The function charged most of this hold's contended time so far (its
    // on-CPU time not yet named by a sample: by the hold's last sample), or
    // empty: the trace's args.culprit on the holder's span.
    std::string_view hold_culprit(int32_t pid, uint32_t gil, int32_t holder, uint64_t t, void*& cookie) override;
    // ThreadObserver (the timeline): sleeps start and end, threads go.
    void sleep_started(int32_t pid, int32_t tid, uint64_t t, const SleepLabel& label, const Sample& s) override;
    void sleep_ended(int32_t pid, int32_t tid, uint64_t t, int32_t waker_pid, int32_t waker, bool gil_wait) override;
    void thread_gone(int32_t pid, int32_t tid, uint64_t t) override;
    void finish(uint64_t end);

    bool inferred() const { return !probes_; }
    // Every charge, by (pid, stack).
    std::vector<BlameCharge> charges() const;
    uint64_t cpu_samples() const { return cpu_samples_; }
    // Inferred: waiting time after the last wake-up by a holder (no holder named).
    uint64_t unattributed_ns() const { return unattributed_ns_; }
    // --wait-folded: the GIL waits' stacks, by (pid, stack), in ns waited.
    void set_wait_stacks(bool on) { wait_stacks_ = on; }
    // --time: only waiting inside it is charged.
    void set_window(const TimeWindow* w) { window_ = w; }
    const std::map<std::pair<int32_t, uint32_t>, uint64_t>& wait_charges() const { return waits_; }
    // Inferred: per process, the time in which at least one thread waited.
    std::map<int32_t, uint64_t> waiting_ns() const;

private:
    enum class Act : uint8_t { OnCpu, OffCpu, Waiting, Unknown };
    // Time charged to a thread: on CPU still waiting for the thread's next
    // CPU sample to name its stack, off CPU by its sleep's stack.
    struct Tally {
        uint64_t on_pending = 0, hold_on_pending = 0;        // contended / all hold, on CPU
        // inferred, not yet committed: contended off CPU, by the sleep's
        // switch-out (unwound only if committed; id set when known without it)
        struct Off {
            std::shared_ptr<SampleCopy> copy;
            uint32_t id = ~0u;
            uint64_t ns = 0;
        };
        std::vector<Off> off;
        std::vector<std::pair<uint32_t, uint64_t>> on;  // inferred: (stack, ns) named by a sample, not yet committed
        void clear() {
            on_pending = hold_on_pending = 0;
            off.clear();
            on.clear();
        }
    };
    struct Gil;
    struct Thread {
        int32_t pid = -1, tid = -1;
        Act act = Act::OnCpu;
        std::shared_ptr<SampleCopy> off_sample;  // the switch-out of the sleep it is in (kept when it may be charged)
        bool off_valid = false;                  // off_sample is this sleep's (else a buffer kept for reuse)
        uint32_t off_stack = ~0u;                // its resolved id (~0u: not yet)
        uint64_t wait_since = 0;                 // in a GIL wait sleep since (--wait-folded)
        std::shared_ptr<SampleCopy> wait_sample; // that sleep's switch-out (--wait-folded)
        Gil* holds = nullptr;                    // uprobes: the GIL it holds
        Gil* process_gil = nullptr;              // inferred: its process's (once it has one)
        // uprobes: this hold's contended time by stack, and the stack of
        // the last CPU sample in it (~0u: none): what names its span.
        std::vector<std::pair<uint32_t, uint64_t>> hold_stacks;
        uint32_t hold_sample = ~0u;
        // inferred: the process's contended integral where this thread's
        // share was last brought up to date, and the epoch it belongs to.
        uint64_t base = 0, epoch = 0;
        bool synced = false;  // base and epoch set (inferred)
        Tally sure;   // committed: its on-CPU part waits for a sample (uprobes: everything)
        Tally maybe;  // inferred: since the process's last commit
    };
    struct Gil {  // one GIL (uprobes), or one process's (inferred)
        int32_t pid = -1;
        int32_t holder = -1;
        Thread* holder_th = nullptr;  // uprobes: holder's entry
        uint32_t waiters = 0;
        uint64_t since = 0;       // the state above holds from here
        uint64_t contended = 0;   // inferred: ns with a waiter, up to `since`
        uint64_t epoch = 0, epoch_base = 0;  // inferred: commits so far, contended at the last one
    };
    Thread& thread(int32_t pid, int32_t tid);
    Gil& gil_of(int32_t pid, uint32_t index);
    void cpu_sample(const Sample& s, const EventInfo& ev);
    void advance(Gil& g, uint64_t t);                 // uprobes: charge [g.since, t) to the holder; inferred: integrate
    void charge(Thread& th, uint64_t contended, uint64_t held, Tally& to);
    void catch_up(Thread& th, uint64_t t);            // bring th's charges up to t
    void commit(Gil& g, Thread& holder, uint64_t t);  // inferred: holder's maybe -> sure; others' dropped
    void set_act(Thread& th, uint64_t t, Act a);
    uint32_t off_stack(Thread& th);
    void book(int32_t pid, int32_t tid, uint32_t stack, uint64_t on, uint64_t off, uint64_t hold);
    void note_hold(Thread& th, uint32_t stack, uint64_t contended);  // uprobes: into th's hold tally

    const ProcessMaps& maps_;
    BlameStacks& stacks_;
    bool probes_ = false;
    bool wait_stacks_ = false;
    const TimeWindow* window_ = nullptr;
    std::deque<Thread> all_;      // deque: entries never move (Gil::holder_th points at one)
    PtrIdMap<Thread> threads_;    // tid -> its entry in all_
    std::map<std::pair<int32_t, uint32_t>, Gil> gils_;
    std::map<std::pair<int32_t, uint32_t>, BlameCharge> charges_;
    std::map<std::pair<int32_t, uint32_t>, uint64_t> waits_;
    std::unordered_map<int32_t, std::shared_ptr<SampleCopy>> wait_samples_;  // --wait-folded: a waiter's switch-out
    uint64_t cpu_samples_ = 0, unattributed_ns_ = 0;
};

// The charges by (process, function), the most contended first.
std::vector<BlameRow> blame_rows(const std::vector<BlameCharge>& charges, const BlameStacks& stacks, bool inferred);

}  // namespace gilscan
