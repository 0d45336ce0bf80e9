// PftraceSched — the recording's scheduler events as Perfetto ftrace
// bundles (FtraceEventBundle, one per CPU and run of events), from which
// Perfetto draws its own CPU tracks and thread states.
//
//   PftraceSched sched(packet_sink);   // sink(bytes of one TracePacket body)
//   sched.sched_switch(cpu, t, cur_tid, sw);  sched.sched_wake(...);
//   sched.flush();                     // at the end: every bundle still open
//
// Compact form (CompactSched: columns of varints, timestamps as deltas from
// the bundle's previous switch or waking) wherever it says the same as the
// full one. A compact switch has no previous task: Perfetto takes the CPU's
// last next_pid, so a switch is compact only when its prev_pid is that task;
// a compact waking has no waker: Perfetto takes the CPU's current task, so
// a waking is compact only when the task it fired in is that one. In a
// recording of some processes (not -a), a switch-in by another process's
// task is not recorded, and those events are written in full (FtraceEvent
// with sched_switch or sched_waking, their pids as recorded). sched_wakeup
// and sched_wakeup_new have no compact form and are written in full, except
// a sched_wakeup once the recording has shown a sched_waking: perf records
// both then, a wakeup follows each waking, and Perfetto's thread states
// take the waking as the start of runnable time (as Perfetto's own traces,
// which record sched_waking alone).
//
// A switch-in record (switch_in(), perf record --switch-events) that the
// switches so far do not show (the CPU's task is another) becomes a switch
// at the record's time from the CPU's task to the thread, prev_state R (the
// idle task's always is; another process's task's is not recorded): without
// it Perfetto would keep such a thread asleep until its next switch-out, and
// count that switch-out's prev_pid as a mismatch. The CPU's first switch, when
// no task was seen on it before, names the idle task (pid 0) as the previous.
//
// A bundle is written when it holds kMaxEvents events, when a timestamp
// goes back (a delta is unsigned), and at flush(). kMaxEvents is small
// enough that every CPU's open bundle (64 CPUs and more) stays within the
// caches as events are appended, and large enough that a bundle's intern
// table, repeated in every bundle, stays a small part of the file.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gilscan/output/proto_encoder.h"
#include "gilscan/perfdata/tp_kind.h"
#include "gilscan/sched/sched_events.h"

namespace gilscan {

class PftraceSched {
public:
    // Receives each finished TracePacket's fields (without the Trace's own
    // tag and length around them).
    using PacketSink = std::function<void(std::string_view packet)>;
    explicit PftraceSched(PacketSink sink) : sink_(std::move(sink)) {}

    void sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw);
    void sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w);
    void switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm);
    void flush();

    uint64_t compact_events() const { return compact_; }
    uint64_t full_events() const { return full_; }
    uint64_t dropped_wakeups() const { return dropped_wakeups_; }
    uint64_t switch_ins() const { return switch_ins_; }  // switches written for switch-in records

    // Heterogeneous lookup by string_view (no string made per event).
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    static constexpr size_t kMaxEvents = 1024;
    // A bundle's recent-comm slots (intern), by pid: Fibonacci hashing, so
    // that runs of pids (a process's threads) land apart.
    static constexpr size_t kRecent = 256;
    static size_t recent_slot(int32_t pid) { return (static_cast<uint32_t>(pid) * 2654435769u) >> 24; }
    // Events of a recording without PERF_SAMPLE_CPU (cpu ~0u): one bundle,
    // said to be CPU 0's, every event in full (no CPU's sequence to make
    // compact ones from).
    static constexpr uint32_t kNoCpu = ~0u;
    // CPUs numbered below this are kept in a vector, others (a file's
    // arbitrary number) in a map.
    static constexpr uint32_t kIndexedCpus = 4096;

private:
    struct Bundle {
        int32_t current = -1;  // the CPU's running task as Perfetto will see it; -1: unknown
        uint64_t last_switch = 0, last_waking = 0;  // the previous compact timestamps
        // The compact columns, a row per event (one append, one cache line);
        // each column is written out at write().
        struct Switch {
            uint64_t ts;  // a delta from the previous (the first: absolute)
            int64_t prev_state;
            int32_t next_pid, next_prio;
            uint32_t comm;  // index in comms
        };
        struct Waking {
            uint64_t ts;
            int32_t pid, target_cpu, prio;
            uint32_t comm;
        };
        // Room for kMaxEvents rows each, in the writer's huge-page slabs
        // (give_rows): a bundle never grows or moves them.
        template <class Row>
        struct Rows {
            Row* rows = nullptr;
            uint32_t n = 0;
            bool empty() const { return n == 0; }
            void push_back(const Row& r) { rows[n++] = r; }
            void clear() { n = 0; }
            const Row* begin() const { return rows; }
            const Row* end() const { return rows + n; }
        };
        Rows<Switch> switches;
        Rows<Waking> wakings;
        std::vector<std::string> comms;                   // intern_table
        std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> comm_index;
        // The last index interned for a pid, in its recent_slot(): a task's
        // comm mostly stays what it was, so most events find it here and
        // need no hash (an entry is used only if its comm is still the same).
        struct Recent {
            int32_t pid = -1;
            uint32_t index = 0;
        };
        std::array<Recent, kRecent> recent{};
        ProtoEncoder full;  // FtraceEventBundle.event fields, encoded
        size_t events = 0;
        bool empty() const { return events == 0; }
        // Empty again, the capacity kept; current stays.
        void clear() {
            switches.clear(), wakings.clear(), comms.clear(), comm_index.clear(), full.clear();
            recent.fill(Recent{});
            events = 0;
        }
    };
    Bundle& bundle(uint32_t cpu);
    // A new bundle's rows, from the current slab (a new one when it is full).
    // One 2 MiB slab on a huge page holds the rows of 36 CPUs: the rows are
    // touched once per event, and first touches of small pages are what
    // a fresh bundle's memory cost most (a page fault per 4 KiB).
    void give_rows(Bundle& b);
    static constexpr size_t kRowBytes = kMaxEvents * (sizeof(Bundle::Switch) + sizeof(Bundle::Waking));
    static constexpr size_t kSlabBytes = 2u << 20;
    struct SlabFree {
        void operator()(uint8_t* p) const;
    };
    std::vector<std::unique_ptr<uint8_t, SlabFree>> slabs_;
    size_t slab_used_ = kSlabBytes;  // the current slab's bytes given out
    uint32_t intern(Bundle& b, int32_t pid, std::string_view comm);
    void full_switch(Bundle& b, uint64_t t, int32_t cur_tid, const SchedSwitch& sw);
    void full_wake(Bundle& b, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w);
    void counted(uint32_t cpu, Bundle& b);
    void write(uint32_t cpu, Bundle& b);

    PacketSink sink_;
    std::vector<Bundle> cpus_;  // by CPU number, below kIndexedCpus
    std::unordered_map<uint32_t, Bundle> other_cpus_;  // the rest, kNoCpu included
    ProtoEncoder packet_;
    bool saw_waking_ = false;
    uint64_t compact_ = 0, full_ = 0, dropped_wakeups_ = 0, switch_ins_ = 0;
};

}  // namespace gilscan
