// Stage: Perfetto's own trace format (.pftrace), streamed packet by packet —
// for captures whose Chrome JSON no viewer opens. The same events as the
// JSON trace (trace_writer.h), in protobuf (perfetto_trace.proto):
//
//   OutputFile out("trace.pftrace");
//   PftraceWriter pw(out, opt, {os_release, machine, nr_cpus});
//   timeline.set_sched_tap(&pw);       // the scheduler's events, as decoded
//   Timeline tl(session, pw);  GilTracker gil(&pw);  session.run(...);
//   pw.finish(tl.threads(), sys);  out.commit();
//
// What is written:
// - SystemInfo first (the kernel release: Perfetto decodes prev_state by it;
//   it reads SystemInfo as it meets it, before it sorts and parses events, so
//   a pipe-mode recording's, known only at its end, is written last);
// - the scheduler's switches and wake-ups as ftrace bundles, compact where
//   that is exact (pftrace_sched.h): Perfetto draws its own CPU tracks and
//   thread states from them;
// - gilscan's tracks, as track events: per process a "GIL holder" slice
//   track ("GIL held by H", args holder and culprit) and a "GIL waiters"
//   counter, one per GIL; per thread a "GIL" track of its GIL waits and
//   holds ("GIL wait", "LOCK"), and on the thread's own track its labelled
//   sleeps ("S(GIL)", "S(GIL handoff)", args state, evidence, function,
//   waker); the plain states are Perfetto's, from the scheduler's events;
// - a ProcessTree at the end: every process and thread with its comm.
//
// Each track is a packet sequence of its own (as Perfetto's SDK writes a
// thread's events), so that its events need neither their track nor their
// full time: the sequence's first packet sets the track as default, clears
// its interned state (the fixed names, interned once) and takes a clock
// snapshot that starts an incremental clock at the track's first time;
// every later packet's timestamp is the nanoseconds since the previous one.
// Names and strings that repeat (holders, culprits, evidence) are interned
// per sequence at first use. A slice is a begin and an end packet, written
// when the span closes: spans on one track close in time order, so the
// clock only goes forward; one that would go back is written with its time
// on the trace's clock (BOOTTIME, as the ftrace data: the recording's own
// timestamps, unchanged, on one clock throughout).
#pragma once

#include <array>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gilscan/gil/trace_sink.h"
#include "gilscan/output/output_file.h"
#include "gilscan/output/pftrace_sched.h"
#include "gilscan/output/proto_encoder.h"
#include "gilscan/output/trace_writer.h"
#include "gilscan/sched/timeline.h"

namespace gilscan {

// Whether -o NAME asks for this format: NAME ends in ".pftrace" or
// ".perfetto-trace", or either with ".gz" after it (Perfetto opens gzip'd traces).
bool is_pftrace_name(std::string_view path);

struct PftraceSystem {
    std::string os_release, machine;
    uint32_t nr_cpus = 0;
};

class PftraceWriter final : public TraceSink, public SchedTap {
public:
    PftraceWriter(OutputFile& out, TraceOptions opt, const PftraceSystem& sys);

    void span(const Span& s) override;
    bool wants_plain_spans() const override { return false; }  // labelled sleeps, sleeps' stacks (span())
    void name_thread(int32_t pid, int32_t tid, std::string_view name) override;
    void gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns, bool cut) override;
    void gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                    std::string_view culprit) override;
    void gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) override;

    void sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) override {
        sched_.sched_switch(cpu, t, cur_tid, sw);
    }
    void sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) override {
        sched_.sched_wake(cpu, t, cur_tid, kind, w);
    }
    void switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) override {
        sched_.switch_in(cpu, t, tid, prio, comm);
    }

    // The open bundles, the process tree; the caller commits the file. sys
    // again: a pipe-mode recording's features come as records, after the
    // constructor, and SystemInfo is written here then.
    void finish(const std::vector<const ThreadStats*>& threads, const PftraceSystem& sys);

    uint64_t packets_written() const { return packets_; }
    // What it keeps: by pid only (--pid). Its spans are the labelled sleeps,
    // whatever TraceOptions says of plain states (they are Perfetto's to
    // draw); a relay in front of it filters by this.
    const TraceFilter& filter() const { return filter_; }
    const PftraceSched& sched() const { return sched_; }

    // TrackEvent's types (track_event.proto).
    static constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2, kCounter = 4;
    // The incremental clock of every track's sequence (64-127: sequence-scoped).
    static constexpr uint32_t kTrackClock = 64;
    static constexpr uint32_t kBoottime = 6;
    // Names interned in every sequence's first packet (iid = index + 1):
    // event names, then debug annotation names.
    static constexpr std::array<std::string_view, 2> kEventNames{"GIL wait", "LOCK"};
    enum Annotation : uint8_t { kGil = 1, kCutAtEnd, kHolder, kCulprit, kState, kEvidence, kFunction, kWaker, kStack };
    static constexpr std::array<std::string_view, 9> kAnnotationNames{
        "gil", "cut_at_end", "holder", "culprit", "state", "evidence", "function", "waker", "stack"};

private:
    static TraceOptions by_pid_only(TraceOptions opt) {
        opt.running = opt.runnable = opt.sleeping = true;
        return opt;
    }
    enum class Kind : uint8_t { Process, Thread, GilRow, Holder, Waiters };
    // Strings interned in one sequence, by their iid: a short list scanned
    // first (a track's few states, evidence texts and names), a hash map
    // once there are more (a holder track's culprits).
    class SequenceStrings {
    public:
        uint64_t find(std::string_view s) const;  // 0: not interned
        void add(std::string_view s, uint64_t iid);

    private:
        static constexpr size_t kScanned = 16;
        std::vector<std::pair<std::string, uint64_t>> few_;
        std::unordered_map<std::string, uint64_t, PftraceSched::StringHash, std::equal_to<>> many_;
    };
    struct Track {
        uint64_t uuid = 0;
        uint32_t sequence = 0;  // trusted_packet_sequence_id; 0: a process track, no events of its own
        bool started = false;   // its sequence's first packet written
        uint64_t clock = 0;     // the incremental clock's value: the last packet's time
        uint64_t next_iid = 0;  // the next iid of its own (after the fixed names)
        SequenceStrings names, strings;        // event names; annotation string values
        int32_t last_holder = 0;               // holders' the last one asked for, and its iid
        uint64_t last_holder_iid = 0;
        std::unordered_map<int32_t, uint64_t> holders;  // "GIL held by H" by H
    };
    // A track's state; its descriptor is written the first time it is asked
    // for (new_track). Inline: a lookup per event, one probe mostly.
    Track& track(Kind kind, int32_t pid, int32_t id) {
        const auto k = static_cast<uint8_t>(kind);
        if (Slot& found = slot(k, key_of(pid, id)); found.track) [[likely]]
            return *found.track;
        return new_track(kind, pid, id);
    }
    Track& new_track(Kind kind, int32_t pid, int32_t id);
    static uint64_t key_of(int32_t pid, int32_t id) {
        return (uint64_t{static_cast<uint32_t>(pid)} << 32) | static_cast<uint32_t>(id);
    }
    void describe(Kind kind, const Track& t, int32_t pid, int32_t id, uint64_t parent);
    void system_info(const PftraceSystem& sys);

    // One track event: begin() starts the packet's TrackEvent in event_ (its
    // interned additions go to interned_), emit() writes the packet at time
    // ts. A track that interns names of its own starts its sequence first
    // (start_sequence sets where its iids begin).
    void begin(uint64_t type, uint64_t name_iid);
    uint64_t event_name(Track& t, std::string_view name);
    uint64_t holder_name(Track& t, int32_t holder);
    void annotation(Annotation a, int64_t v);
    void annotation(Track& t, Annotation a, std::string_view v);
    void emit(Track& t, uint64_t ts);
    char* packet_fields(char* p, const Track& t, uint64_t time, bool back);
    [[gnu::noinline]] void emit_large(const Track& t, uint64_t time, bool back, size_t most);
    void start_sequence(Track& t, uint64_t ts);
    // One TracePacket's fields, framed as Trace.packet (field 1).
    void write_packet(std::string_view packet);

    OutputFile& out_;
    TraceFilter filter_;
    PftraceSched sched_;
    std::vector<std::unique_ptr<Track>> tracks_;
    // (kind, pid, id) -> its track: open addressing, linear probing, a
    // power-of-two table kept at most half full (a lookup per event: one
    // probe, mostly).
    struct Slot {
        uint64_t key = 0;
        uint8_t kind = 0;
        Track* track = nullptr;  // null: an empty slot
    };
    std::vector<Slot> by_key_ = std::vector<Slot>(256);
    // Its slot, or the empty one where it goes.
    Slot& slot(uint8_t kind, uint64_t key) {
        const size_t mask = by_key_.size() - 1;
        size_t i = static_cast<size_t>(((key ^ (uint64_t{kind} << 61)) * 0x9E3779B97F4A7C15ull) >> 32) & mask;
        while (by_key_[i].track && !(by_key_[i].key == key && by_key_[i].kind == kind)) i = (i + 1) & mask;
        return by_key_[i];
    }
    std::unordered_map<uint64_t, std::string> thread_names_;  // name_thread()'s, by (pid, tid)
    ProtoEncoder event_, interned_, packet_;  // interned_: InternedData's entries the next packet adds
    uint64_t packets_ = 0;
    bool system_info_written_ = false;
};

}  // namespace gilscan
