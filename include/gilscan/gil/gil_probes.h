// Stage: GIL hold / wait from take_gil / drop_gil uprobes (per4m's `gil` mode).
//
//   GilTracker gil(&trace_writer);         // or nullptr: figures only
//   FanOutOf<GilTracker, Timeline> both(gil, timeline);   // the tracker sees each event first
//   session.run(both);
//   gil.finish(end);
//   gil.thread(tid)->wait_ns, gil.processes(), gil.anomalies()
//
// Per thread: GIL wait = take_gil entry -> take_gil return; GIL held =
// take_gil return -> next drop_gil entry; the rest of the thread's span is
// no-GIL. Per GIL: held, contended, waited for. A process has one GIL, or
// since 3.12 one per subinterpreter that owns its GIL (PEP 684): when the
// take_gil entry probe carries the GIL's address (a `gil` field, placed by
// `gilscan probe` from libpython's DWARF: gil_arg.h), each address is a GIL
// of its own; without it, one GIL per process. Event names are matched
// whatever the probe group (python:, g39:,
// probe_libpython3:) and with perf's duplicate suffixes (take_gil_1 when perf
// placed several probes for an inlined function). Broken sequences — a
// missing return, a drop without a take, two holders at once — are counted
// as anomalies and reported, never asserted.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "gilscan/sched/sched_events.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/tid_map.h"
#include "gilscan/sched/timeline.h"

namespace gilscan {

class TraceSink;

struct GilThreadStats {
    int32_t tid = -1, tgid = -1;
    uint64_t wait_ns = 0, hold_ns = 0;
    uint64_t takes = 0, drops = 0;
    uint64_t first = ~uint64_t{0}, last = 0;
    // Bit k: the thread took (or held) its process's GIL k (GilProcessStats::
    // index; k >= 63 share bit 63). One bit unless subinterpreters own GILs.
    uint64_t gil_mask = 0;
};

// One GIL of a process: the process's only one, or one of several
// (subinterpreters with their own GIL), in the order first seen.
struct GilProcessStats {
    int32_t pid = -1;
    uint32_t index = 0;    // 0: the process's first GIL
    uint64_t address = 0;  // the GIL's address from the probes' `gil` field; 0 when not recorded
    uint64_t first = ~uint64_t{0}, last = 0;
    uint64_t held_ns = 0;       // some thread holds the GIL
    uint64_t contended_ns = 0;  // held while at least one other thread waits
    uint64_t waiting_ns = 0;    // at least one thread waits
    uint32_t max_waiters = 0;
};

struct GilAnomalies {
    uint64_t take_without_return = 0;   // take_gil entered again before returning
    uint64_t return_without_take = 0;   // take_gil__return with no entry seen
    uint64_t drop_without_take = 0;     // drop_gil while not holding
    // take_gil entered while holding: the drop happened unseen (drop_gil
    // inlined at the eval breaker of stripped builds, or a lost event); the
    // hold ends there. Not an anomaly where the build inlines drop_gil.
    uint64_t implicit_drops = 0;
    // A take returned while another thread held the same GIL: a GIL has one
    // holder, so the old hold ended unseen, and ends there (Debian's
    // python3.11 releases the GIL from copies of drop_gil inlined into
    // _Py_read and others, which no probe sees; or a lost event). Not an
    // anomaly where the build inlines releases.
    uint64_t releases_not_seen = 0;
    uint64_t total() const { return take_without_return + return_without_take + drop_without_take; }
};

enum class GilState : uint8_t { None, Waiting, Holding, Dropping };

// Told a GIL's state whenever a probe may have changed it: from t on, `holder`
// (or -1) holds GIL `gil` (GilProcessStats::index) of process pid while
// `waiters` threads wait in take_gil. GIL blame listens (blame.h).
class GilListener {
public:
    virtual ~GilListener() = default;
    // `cookie` is the listener's own, kept with that GIL by the tracker
    // (null at first): a probe's call finds the listener's entry without
    // a lookup (most of a uprobe capture's records are probes).
    virtual void gil_state(int32_t pid, uint32_t gil, uint64_t t, int32_t holder, uint32_t waiters, void*& cookie) = 0;
    // holder's hold of that GIL ends at t (before gil_state tells the new
    // state): the name to give the hold's span in the trace (args.culprit),
    // or empty. The text must live until the trace is written.
    virtual std::string_view hold_culprit(int32_t, uint32_t, int32_t, uint64_t, void*&) { return {}; }
};

class GilTracker final : public EventSink {
public:
    // swap: the recording's byte order differs from this machine's (the
    // `gil` field is read from the sample's raw data).
    explicit GilTracker(TraceSink* trace, bool swap = false) : trace_(trace), swap_(swap) {}

    // Most records are not GIL probes: they only test their event's kind
    // here (inline: FanOutOf calls it directly). The probe's work is a
    // function of its own, so that this path does not save and restore the
    // registers that work needs (18 instructions a record).
    void on_sample(const Sample& s, const EventInfo& ev) override {
        const TpKind k = ev.gil_kind;
        if (!is_gil_probe(k) || s.tid <= 0) return;
        on_probe(s, ev, k);
    }
    void finish(uint64_t end);
    void set_listener(GilListener* l) { listener_ = l; }
    // --time: waits, holds and the GILs' figures are clipped to it, and so
    // are the trace's GIL spans; a waiters count before it is drawn at its start.
    void set_window(const TimeWindow* w) { window_ = w; }

    bool seen_probes() const { return probe_events_ > 0; }
    uint64_t probe_events() const { return probe_events_; }
    GilState state(int32_t tid) const;
    const GilThreadStats* thread(int32_t tid) const;
    std::vector<GilThreadStats> threads() const;
    std::vector<GilProcessStats> processes() const;  // one entry per GIL, by pid and index
    // gilscan top: the figures with open waits and holds counted up to
    // `now`, as finish(now) would, with nothing closed; each GIL with its
    // holder (-1: none) and waiters at `now`.
    struct LiveGil {
        GilProcessStats st;
        int32_t holder = -1;
        uint32_t waiters = 0;
    };
    std::vector<GilThreadStats> live_threads(uint64_t now) const;
    std::vector<LiveGil> live_gils(uint64_t now) const;
    const GilAnomalies& anomalies() const { return anomalies_; }

private:
    // One GIL (named Process from when a process had exactly one).
    struct Process {
        GilProcessStats st;
        int32_t holder = -1;
        uint64_t holder_since = 0;
        uint32_t holders = 0, waiters = 0;
        uint64_t changed = 0;
        uint32_t gils = 1;  // the process's first GIL: how many the process has
        void* cookie = nullptr;  // the listener's (GilListener::gil_state)
        // --time: the waiters count last set before the window, which it
        // opens with (drawn at its start with the first change inside it).
        bool count_before_window = false;
        uint32_t waiters_before_window = 0;
    };
    struct Thread {
        GilThreadStats st;
        GilState state = GilState::None;
        uint64_t since = 0;
        Process* gil = nullptr;  // the GIL of its last take_gil: what it waits for, holds, drops
    };
    // Inline lookups (one or two per probe event); the maps hold the
    // entries themselves, and making one is out of line.
    Thread& thread_of(int32_t pid, int32_t tid) {
        if (Thread* const* p = threads_.find(tid)) {
            if (pid > 0) (*p)->st.tgid = pid;
            return **p;
        }
        return add_thread(pid, tid);
    }
    // The process's first GIL (address 0: any).
    Process& process_of(int32_t pid) {
        if (Process* const* p = proc_index_.find(pid)) return **p;
        return add_process(pid, 0, 0);
    }
    Process& gil_of(int32_t pid, uint64_t address);  // the process's GIL at that address
    Thread& add_thread(int32_t pid, int32_t tid);
    Process& add_process(int32_t pid, uint32_t index, uint64_t address);
    uint64_t gil_address(const Sample& s, const EventInfo& ev);  // the `gil` field, or 0
    void on_probe(const Sample& s, const EventInfo& ev, TpKind k);  // a GIL probe's sample
    void account(Process& p, uint64_t t);  // integrate the process counters up to t
    void set_holder(Process& p, int32_t tid, uint64_t t);
    void waiters_changed(Process& p, uint64_t t);
    void show_waiters(Process& p, uint64_t t, uint32_t n);
    void open_window_count(Process& p);
    bool in_window(const Thread& th, uint64_t t, uint64_t& a, uint64_t& b) const;
    void end_wait(Thread& th, uint64_t t, bool cut);
    void end_hold(Thread& th, Process& p, uint64_t t, bool cut);
    void end_unseen_hold(Process& p, uint64_t t);  // another thread's take returned: p's holder let go

    void tell(Process& p, uint64_t t) {
        if (listener_) listener_->gil_state(p.st.pid, p.st.index, t, p.holders ? p.holder : -1, p.waiters, p.cookie);
    }

    TraceSink* trace_;
    GilListener* listener_ = nullptr;
    const TimeWindow* window_ = nullptr;
    PtrIdMap<Thread> threads_;  // tid -> its entry in all_
    std::deque<Thread> all_;  // deque: entries never move
    PtrIdMap<Process> proc_index_;  // pid -> its first GIL in procs_
    std::deque<Process> procs_;
    // (pid << 32) ^ address -> the GILs of that key (a collision keeps both).
    std::unordered_map<uint64_t, std::vector<Process*>> by_address_;
    bool swap_ = false;
    struct GilField {  // per event index: where its `gil` field is, for its generation
        bool known = false;
        uint32_t generation = 0;
        const TpField* field = nullptr;
    };
    std::vector<GilField> gil_fields_;
    GilAnomalies anomalies_;
    uint64_t probe_events_ = 0;
};

// Labels a sleep from the uprobe state of its thread at the switch-out:
// inside take_gil -> "S(GIL)", inside drop_gil (FORCE_SWITCHING hand-off
// wait) -> "S(GIL handoff)".
SleepClassifier gil_probe_classifier(const GilTracker& gil);

// Delivers every event to several sinks, in the order given. The sinks'
// types are known where it is built (the analysis's stages), so the calls
// are direct, not through a list of pointers, and each stage's sample
// handler can be inlined. Each type must be final (a direct call of
// S::on_sample is right only for an object that is exactly an S).
//
//   FanOutOf<ProcessMaps, GilTracker, Timeline> stages(maps, gil, timeline);
template <class... S>
class FanOutOf final : public EventSink {
    static_assert((std::is_final_v<S> && ...), "FanOutOf calls S::on_sample directly: S must be final");

public:
    explicit FanOutOf(S&... sinks) : sinks_(sinks...) {}
    void on_sample(const Sample& s, const EventInfo& e) override {
        std::apply([&](auto&... k) { (k.on_sample(s, e), ...); }, sinks_);
    }
    void on_comm(const CommEvent& e) override {
        std::apply([&](auto&... k) { (k.on_comm(e), ...); }, sinks_);
    }
    void on_fork(const TaskEvent& e) override {
        std::apply([&](auto&... k) { (k.on_fork(e), ...); }, sinks_);
    }
    void on_exit(const TaskEvent& e) override {
        std::apply([&](auto&... k) { (k.on_exit(e), ...); }, sinks_);
    }
    void on_mmap(const MmapEvent& e) override {
        std::apply([&](auto&... k) { (k.on_mmap(e), ...); }, sinks_);
    }
    void on_lost(const LostEvent& e) override {
        std::apply([&](auto&... k) { (k.on_lost(e), ...); }, sinks_);
    }
    void on_switch(const SwitchEvent& e) override {
        std::apply([&](auto&... k) { (k.on_switch(e), ...); }, sinks_);
    }

private:
    std::tuple<S&...> sinks_;
};

// The id of a process's "GIL holder" track in the trace: above any real
// tid (Linux caps pids at 2^22), the GIL's index above that (up to 255
// tracks; later GILs share the last). Added modulo 2^32: a damaged file's
// pid can be anything, and a signed overflow there was undefined (found by
// fuzzing).
inline int32_t gil_track_tid(int32_t pid, uint32_t gil_index = 0) {
    const uint32_t k = gil_index < 255 ? gil_index : 255;
    return static_cast<int32_t>(static_cast<uint32_t>(pid) + 0x40000000u + (k << 22));
}

// The id of a thread's GIL row in the trace (its GIL waits and holds, which
// partially overlap the sleeps and runs of the thread's own row): above any
// real tid, below the holder tracks.
inline int32_t gil_row_tid(int32_t tid) { return static_cast<int32_t>(static_cast<uint32_t>(tid) + 0x20000000u); }

}  // namespace gilscan
