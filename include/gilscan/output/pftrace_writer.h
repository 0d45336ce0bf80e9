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
// - gilscan's tracks, as track events on one packet sequence with interned
//   names: per process a "GIL holder" slice track ("GIL held by H", args
//   holder and culprit) and a "GIL waiters" counter, one per GIL; per
//   thread a "GIL" track of its GIL waits and holds ("GIL wait", "LOCK"),
//   and on the thread's own track its labelled sleeps ("S(GIL)", "S(GIL
//   handoff)", args evidence, function, state, waker); the plain states are
//   Perfetto's, from the scheduler's events;
// - a ProcessTree at the end: every process and thread with its comm.
// Timestamps are the recording's, unchanged, on every packet (Perfetto takes
// them all to be one clock). A slice is a begin and an end packet, written
// when the span closes; spans on one track come closed in time order, and
// Perfetto keeps a file's order between packets of the same timestamp.
#pragma once

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

    // The open bundles, the process tree; the caller commits the file. sys
    // again: a pipe-mode recording's features come as records, after the
    // constructor, and SystemInfo is written here then.
    void finish(const std::vector<const ThreadStats*>& threads, const PftraceSystem& sys);

    uint64_t packets_written() const { return packets_; }
    const PftraceSched& sched() const { return sched_; }

    // TrackEvent's types (track_event.proto).
    static constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2, kCounter = 4;
    // The sequence of gilscan's own packets (interned names are per sequence).
    static constexpr uint32_t kSequence = 1;

private:
    enum class Track : uint8_t { Process, Thread, GilRow, Holder, Waiters };
    // A track's uuid; its descriptor is written the first time it is asked for.
    uint64_t track(Track kind, int32_t pid, int32_t id);
    void system_info(const PftraceSystem& sys);
    void describe(Track kind, uint64_t uuid, int32_t pid, int32_t id);
    // Interned event and debug annotation names: the iid, the name queued
    // for the next packet's interned_data the first time.
    uint64_t event_name(std::string_view name);
    uint64_t annotation_name(std::string_view name);

    // A track event: begin() starts it in event_, emit(ts) writes its packet.
    ProtoEncoder begin(uint64_t type, uint64_t track_uuid, uint64_t name_iid);
    void annotation(ProtoEncoder& e, std::string_view name, int64_t v);
    void annotation(ProtoEncoder& e, std::string_view name, std::string_view v);
    void emit(uint64_t ts);
    void slice_end(uint64_t track_uuid, uint64_t ts);
    // One TracePacket's fields, framed as Trace.packet (field 1).
    void write_packet(std::string_view packet);

    OutputFile& out_;
    TraceFilter filter_;
    PftraceSched sched_;
    std::unordered_map<uint64_t, uint64_t> tracks_[5];  // (pid, id) -> uuid, by Track
    uint64_t next_uuid_ = 1;
    std::unordered_map<std::string, uint64_t> event_names_, annotation_names_;
    std::vector<std::pair<uint64_t, std::string>> new_event_names_, new_annotation_names_;
    std::unordered_map<uint64_t, std::string> thread_names_;  // name_thread()'s, by (pid, tid)
    std::string event_, packet_;
    bool first_ = true;
    bool system_info_written_ = false;  // the sequence's first packet clears its incremental state
    uint64_t packets_ = 0;
};

}  // namespace gilscan
