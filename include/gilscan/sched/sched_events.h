// Stage 2 (sched): tracepoint samples -> typed scheduler (and GIL uprobe) events,
// with every field read through the formats embedded in the recording.
//
//   TracepointDecoder dec;
//   switch (ev.kind) {                    // the session's event_kind(): TpKind
//   case TpKind::SchedSwitch: { SchedSwitch sw; if (dec.decode(smp, ev, swap, sw)) ...; }
//   ...
//   }
//   PrevState st = dec.prev_state(ev, sw.prev_state);   // numeric, per the print fmt masks
//
// prev_state is decoded from its number: the letters and the "preempted"
// bit (TASK_REPORT_MAX, printed "R+") come from the event's print fmt, so
// kernels before 4.14 (other masks) decode correctly too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "gilscan/perfdata/sample.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/perfdata/tp_kind.h"
#include "gilscan/perfdata/tracepoint_format.h"

namespace gilscan {


struct SchedSwitch {
    int32_t prev_pid = 0, next_pid = 0;
    int32_t prev_prio = 0, next_prio = 0;
    int64_t prev_state = 0;
    std::string_view prev_comm, next_comm;
};

struct SchedWake {  // sched_waking / sched_wakeup / sched_wakeup_new
    int32_t pid = 0;
    int32_t target_cpu = -1;
    int32_t prio = 120;  // the kernel's default, when the format has none
    std::string_view comm;
};

struct SchedFork {
    int32_t parent_pid = 0, child_pid = 0;
    std::string_view parent_comm, child_comm;
};

struct SchedExit {
    int32_t pid = 0;
    std::string_view comm;
};

enum class StateClass : uint8_t { Runnable, Sleeping, DiskSleep, Stopped, Dead, Idle, Parked, Other };

struct PrevState {
    StateClass cls = StateClass::Other;
    bool preempted = false;  // "R+": switched out while runnable
    std::string letters;     // as perf prints it: "R", "R+", "S", "D", "I", "D|K" ...
};

// Masks of one kernel's prev_state, parsed from sched_switch's print fmt.
struct PrevStateTable {
    std::vector<std::pair<uint64_t, std::string>> flags;  // {0x1,"S"}, {0x2,"D"}, ...
    uint64_t preempt_bit = 0x100;                         // TASK_REPORT_MAX on >= 4.14
    static PrevStateTable from_print_fmt(std::string_view print_fmt);
    PrevState decode(int64_t prev_state) const;
};

class TracepointDecoder {
public:
    bool decode(const Sample& s, const EventInfo& ev, bool swap, SchedSwitch& out);
    bool decode(const Sample& s, const EventInfo& ev, bool swap, SchedWake& out);
    bool decode(const Sample& s, const EventInfo& ev, bool swap, SchedFork& out);
    bool decode(const Sample& s, const EventInfo& ev, bool swap, SchedExit& out);
    const PrevStateTable& prev_state_table(const EventInfo& ev);
    // The decoded state, cached per value: one decode per distinct prev_state,
    // and `letters` stays valid (and at the same address) for the decoder's life.
    const PrevState& prev_state(const EventInfo& ev, int64_t prev_state);
    uint64_t field_errors() const { return field_errors_; }

private:
    struct Fields {
        bool ready = false;
        uint32_t generation = 0;  // EventInfo::generation this was worked out for
        TpKind kind = TpKind::Other;
        const TpField *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr, *e = nullptr, *f = nullptr,
                      *g = nullptr;
        PrevStateTable states;
        // sched_switch with every field it reads at a fixed place (ints of 4
        // or 8 bytes, strings char[N]): one test of the record's length for
        // all seven, instead of a bounds test and size and sign switches
        // each (some 200 instructions a switch to under 100).
        bool fixed_switch = false;
        bool fixed_wake = false;  // the same for the wake-ups' three fields (a tenth of a wake-up's instructions)
        uint64_t fixed_end = 0;  // raw bytes those fields need
        std::vector<const PrevState*> small;                   // prev_state < 4096 -> in decoded_, nullptr: not yet
        std::unordered_map<int64_t, const PrevState*> large;  // any other value
    };
    // Once or twice per sample: a vector of pointers (one indexed load; a
    // deque's index arithmetic was some 30 instructions a sample). Each
    // Fields stays where it is: prev_state_table() hands out references.
    Fields& fields(const EventInfo& ev) {
        const size_t i = static_cast<size_t>(ev.index);
        if (i < by_event_.size()) [[likely]] {
            Fields* f = by_event_[i].get();
            if (f && f->ready && f->generation == ev.generation) [[likely]]
                return *f;
        }
        return prepare(ev);
    }
    Fields& prepare(const EventInfo& ev);
    std::vector<std::unique_ptr<Fields>> by_event_;
    std::deque<PrevState> decoded_;  // deque: elements never move
    uint64_t field_errors_ = 0;
};

}  // namespace gilscan
