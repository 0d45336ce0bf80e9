// The scheduler's events as Perfetto ftrace bundles (pftrace_sched.h).
// Field numbers are those of perfetto_trace.proto: FtraceEventBundle
// (cpu 1, event 2, compact_sched 4), CompactSched (switch_timestamp 1 …
// waking_common_flags 12, intern_table 5), FtraceEvent (timestamp 1, pid 2,
// sched_switch 4, sched_wakeup 17, sched_waking 20, sched_wakeup_new 114).
#include "gilscan/output/pftrace_sched.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "gilscan/output/proto_encoder.h"
#include "gilscan/perfdata/byte_buffer.h"

namespace gilscan {

namespace {

// TracePacket.ftrace_events, FtraceEventBundle's fields, CompactSched's.
constexpr uint32_t kFtraceEvents = 1;
constexpr uint32_t kBundleCpu = 1, kBundleEvent = 2, kBundleCompact = 4;
constexpr uint32_t kSwitchTimestamp = 1, kSwitchPrevState = 2, kSwitchNextPid = 3, kSwitchNextPrio = 4,
                   kInternTable = 5, kSwitchNextComm = 6, kWakingTimestamp = 7, kWakingPid = 8,
                   kWakingTargetCpu = 9, kWakingPrio = 10, kWakingComm = 11, kWakingCommonFlags = 12;
// FtraceEvent's fields and its events' own.
constexpr uint32_t kEventTimestamp = 1, kEventPid = 2, kEventSchedSwitch = 4, kEventSchedWakeup = 17,
                   kEventSchedWaking = 20, kEventSchedWakeupNew = 114;

// A packed repeated field of varints, one per row: field_of(row) (int32
// and int64 values as their 64-bit two's complement, as protobuf writes them).
// The values are written once, after room for the longest length a bundle's
// column can have; the length then goes in front of them, moved up to it
// when shorter (a memmove of the column, instead of sizing every value first).
template <class Rows, class F>
void packed(ProtoEncoder& e, uint32_t field, const Rows& rows, F field_of) {
    if (rows.empty()) return;
    constexpr size_t kLengthBytes = 3;  // up to 2^21 - 1 bytes: kMaxEvents values of 10 bytes at most
    static_assert(PftraceSched::kMaxEvents * 10 < (size_t{1} << 21));
    e.tag(field, ProtoEncoder::kLengthDelimited);
    char* const at = e.room(kLengthBytes + 10 * static_cast<size_t>(rows.end() - rows.begin()));
    char* p = at + kLengthBytes;
    for (const auto& r : rows) p = ProtoEncoder::put_varint(p, static_cast<uint64_t>(static_cast<int64_t>(field_of(r))));
    const auto len = static_cast<size_t>(p - (at + kLengthBytes));
    const size_t k = ProtoEncoder::varint_size(len);
    if (k < kLengthBytes) std::memmove(at + k, at + kLengthBytes, len);
    ProtoEncoder::put_varint(at, len);
    e.advance(k + len);
}

}  // namespace

PftraceSched::Bundle& PftraceSched::bundle(uint32_t cpu) {
    Bundle* b;
    if (cpu < kIndexedCpus) {
        if (cpu >= cpus_.size()) cpus_.resize(size_t{cpu} + 1);
        b = &cpus_[cpu];
    } else {
        b = &other_cpus_[cpu];
    }
    if (!b->switches.rows) [[unlikely]]
        give_rows(*b);
    return *b;
}

void PftraceSched::SlabFree::operator()(uint8_t* p) const {
    HugeUninitAllocator<uint8_t>().deallocate(p, kSlabBytes);
}

void PftraceSched::give_rows(Bundle& b) {
    static_assert(kRowBytes <= kSlabBytes && alignof(Bundle::Switch) <= 8 && alignof(Bundle::Waking) <= 8);
    if (kSlabBytes - slab_used_ < kRowBytes) {
        slabs_.emplace_back(HugeUninitAllocator<uint8_t>().allocate(kSlabBytes));
        slab_used_ = 0;
    }
    uint8_t* at = slabs_.back().get() + slab_used_;
    slab_used_ += kRowBytes;
    // Rows of trivial types in aligned_alloc's memory (which creates them
    // implicitly), each written before it is read.
    b.switches.rows = static_cast<Bundle::Switch*>(static_cast<void*>(at));
    b.wakings.rows = static_cast<Bundle::Waking*>(static_cast<void*>(at + kMaxEvents * sizeof(Bundle::Switch)));
}

uint32_t PftraceSched::intern(Bundle& b, int32_t pid, std::string_view comm) {
    Bundle::Recent& r = b.recent[recent_slot(pid)];
    if (r.pid == pid && same_short(b.comms[r.index], comm)) return r.index;
    uint32_t index;
    if (auto it = b.comm_index.find(comm); it != b.comm_index.end()) {
        index = it->second;
    } else {
        index = static_cast<uint32_t>(b.comms.size());
        b.comms.emplace_back(comm);
        b.comm_index.emplace(std::string(comm), index);
    }
    r = {pid, index};
    return index;
}

void PftraceSched::sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) {
    Bundle& b = bundle(cpu);
    if ((!b.switches.empty() && t < b.last_switch) || (!b.wakings.empty() && t < b.last_waking)) write(cpu, b);
    if (cpu != kNoCpu && b.current >= 0 && b.current == sw.prev_pid) {
        const uint64_t ts = b.switches.empty() ? t : t - b.last_switch;
        b.switches.push_back({ts, sw.prev_state, sw.next_pid, sw.next_prio, intern(b, sw.next_pid, sw.next_comm)});
        b.last_switch = t;
        ++compact_;
    } else {
        full_switch(b, t, cur_tid, sw);
    }
    b.current = sw.next_pid;  // what Perfetto takes the CPU's task to be, either way
    counted(cpu, b);
}

void PftraceSched::sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) {
    saw_waking_ |= kind == TpKind::SchedWaking;
    if (kind == TpKind::SchedWakeup && saw_waking_) {
        ++dropped_wakeups_;
        return;
    }
    Bundle& b = bundle(cpu);
    if ((!b.switches.empty() && t < b.last_switch) || (!b.wakings.empty() && t < b.last_waking)) write(cpu, b);
    if (cpu != kNoCpu && kind == TpKind::SchedWaking && b.current >= 0 && b.current == cur_tid) {
        const uint64_t ts = b.wakings.empty() ? t : t - b.last_waking;
        b.wakings.push_back({ts, w.pid, w.target_cpu, w.prio, intern(b, w.pid, w.comm)});
        b.last_waking = t;
        ++compact_;
    } else {
        full_wake(b, t, cur_tid, kind, w);
    }
    counted(cpu, b);
}

void PftraceSched::switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) {
    if (cpu == kNoCpu) return;  // no CPU's sequence to put it in
    const int32_t current = bundle(cpu).current;
    if (current == tid) return;  // a switch showed it
    char idle[24];               // the idle task's comm, as the kernel names it
    const int n = std::snprintf(idle, sizeof idle, "swapper/%u", cpu);
    SchedSwitch sw;
    sw.prev_pid = current >= 0 ? current : 0;  // compact when the CPU's task is known (sched_switch)
    sw.prev_prio = 120;
    sw.prev_state = 0;  // R
    sw.prev_comm = std::string_view(idle, static_cast<size_t>(std::max(n, 0)));
    sw.next_pid = tid;
    sw.next_prio = prio;
    sw.next_comm = comm;
    sched_switch(cpu, t, sw.prev_pid, sw);
    ++switch_ins_;
}

void PftraceSched::full_switch(Bundle& b, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) {
    ProtoEncoder& e = b.full;
    const size_t ev = e.begin(kBundleEvent);
    e.varint(kEventTimestamp, t);
    e.varint(kEventPid, static_cast<uint32_t>(cur_tid));
    const size_t m = e.begin(kEventSchedSwitch);
    e.string(1, sw.prev_comm);
    e.int64(2, sw.prev_pid);
    e.int64(3, sw.prev_prio);
    e.int64(4, sw.prev_state);
    e.string(5, sw.next_comm);
    e.int64(6, sw.next_pid);
    e.int64(7, sw.next_prio);
    e.end(m);
    e.end(ev);
    ++full_;
}

void PftraceSched::full_wake(Bundle& b, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) {
    ProtoEncoder& e = b.full;
    const size_t ev = e.begin(kBundleEvent);
    e.varint(kEventTimestamp, t);
    e.varint(kEventPid, static_cast<uint32_t>(cur_tid));
    const uint32_t field = kind == TpKind::SchedWakeup      ? kEventSchedWakeup
                           : kind == TpKind::SchedWakeupNew ? kEventSchedWakeupNew
                                                            : kEventSchedWaking;
    const size_t m = e.begin(field);
    e.string(1, w.comm);
    e.int64(2, w.pid);
    e.int64(3, w.prio);
    e.int64(4, 1);  // success: the tracepoints fire for wake-ups that happen
    e.int64(5, w.target_cpu);
    e.end(m);
    e.end(ev);
    ++full_;
}

void PftraceSched::counted(uint32_t cpu, Bundle& b) {
    if (++b.events >= kMaxEvents) write(cpu, b);
}

// One TracePacket { ftrace_events { cpu, event…, compact_sched { … } } }; the
// bundle is then empty (its CPU's current task kept).
void PftraceSched::write(uint32_t cpu, Bundle& b) {
    if (b.empty()) return;
    packet_.clear();
    ProtoEncoder& e = packet_;
    const size_t bundle_at = e.begin(kFtraceEvents);
    e.varint(kBundleCpu, cpu == kNoCpu ? 0 : cpu);
    e.raw(b.full.view());
    if (!b.switches.empty() || !b.wakings.empty()) {
        const size_t c = e.begin(kBundleCompact);
        for (const std::string& comm : b.comms) e.string(kInternTable, comm);
        using S = Bundle::Switch;
        using W = Bundle::Waking;
        packed(e, kSwitchTimestamp, b.switches, [](const S& r) { return r.ts; });
        packed(e, kSwitchPrevState, b.switches, [](const S& r) { return r.prev_state; });
        packed(e, kSwitchNextPid, b.switches, [](const S& r) { return r.next_pid; });
        packed(e, kSwitchNextPrio, b.switches, [](const S& r) { return r.next_prio; });
        packed(e, kSwitchNextComm, b.switches, [](const S& r) { return r.comm; });
        packed(e, kWakingTimestamp, b.wakings, [](const W& r) { return r.ts; });
        packed(e, kWakingPid, b.wakings, [](const W& r) { return r.pid; });
        packed(e, kWakingTargetCpu, b.wakings, [](const W& r) { return r.target_cpu; });
        packed(e, kWakingPrio, b.wakings, [](const W& r) { return r.prio; });
        packed(e, kWakingComm, b.wakings, [](const W& r) { return r.comm; });
        // common_flags: not in perf's samples; 0 says "not in an interrupt",
        // so the waker is the CPU's task.
        packed(e, kWakingCommonFlags, b.wakings, [](const W&) { return 0; });
        e.end(c);
    }
    e.end(bundle_at);
    sink_(packet_.view());
    b.clear();
}

void PftraceSched::flush() {
    for (size_t cpu = 0; cpu < cpus_.size(); ++cpu) write(static_cast<uint32_t>(cpu), cpus_[cpu]);
    for (auto& [cpu, b] : other_cpus_) write(cpu, b);
}

}  // namespace gilscan
