// The .pftrace writer (pftrace_writer.h). Field numbers are those of
// perfetto_trace.proto; each is named where it is written.
#include "gilscan/output/pftrace_writer.h"

#include <cstring>
#include <map>

#include "gilscan/gil/gil_probes.h"
#include "gilscan/output/proto_encoder.h"

namespace gilscan {

namespace {

// TracePacket.
constexpr uint32_t kPacketTimestamp = 8, kPacketTrackEvent = 11, kPacketSequenceId = 10, kPacketInterned = 12,
                   kPacketSequenceFlags = 13, kPacketTrackDescriptor = 60, kPacketProcessTree = 2,
                   kPacketSystemInfo = 45;
constexpr uint64_t kSeqIncrementalStateCleared = 1, kSeqNeedsIncrementalState = 2;
// TrackEvent.
constexpr uint32_t kEventType = 9, kEventTrackUuid = 11, kEventNameIid = 10, kEventAnnotations = 4,
                   kEventCounterValue = 30;
// DebugAnnotation.
constexpr uint32_t kAnnotationNameIid = 1, kAnnotationInt = 4, kAnnotationString = 6;
// InternedData: event_names, debug_annotation_names (each { iid = 1, name = 2 }).
constexpr uint32_t kInternedEventNames = 2, kInternedAnnotationNames = 3;
// TrackDescriptor, ProcessDescriptor, ThreadDescriptor.
constexpr uint32_t kTrackUuid = 1, kTrackParent = 5, kTrackName = 2, kTrackProcess = 3, kTrackThread = 4,
                   kTrackCounter = 8;
constexpr uint32_t kProcessPid = 1, kThreadPid = 1, kThreadTid = 2;

uint64_t key_of(int32_t pid, int32_t id) {
    return (uint64_t{static_cast<uint32_t>(pid)} << 32) | static_cast<uint32_t>(id);
}

}  // namespace

bool is_pftrace_name(std::string_view path) {
    if (path.ends_with(".gz")) path.remove_suffix(3);
    return path.ends_with(".pftrace") || path.ends_with(".perfetto-trace");
}

PftraceWriter::PftraceWriter(OutputFile& out, TraceOptions opt, const PftraceSystem& sys)
    : out_(out), filter_{std::move(opt)}, sched_([this](std::string_view p) { write_packet(p); }) {
    if (!sys.os_release.empty()) system_info(sys);
}

// SystemInfo { utsname { sysname 1, release 3, machine 4 }, num_cpus 8 }.
void PftraceWriter::system_info(const PftraceSystem& sys) {
    std::string p;
    ProtoEncoder e(p);
    const size_t info = e.begin(kPacketSystemInfo);
    const size_t uts = e.begin(1);
    e.string(1, "Linux");
    if (!sys.os_release.empty()) e.string(3, sys.os_release);
    if (!sys.machine.empty()) e.string(4, sys.machine);
    e.end(uts);
    if (sys.nr_cpus) e.varint(8, sys.nr_cpus);
    e.end(info);
    write_packet(p);
    system_info_written_ = true;
}

void PftraceWriter::write_packet(std::string_view packet) {
    const size_t n = 1 + ProtoEncoder::varint_size(packet.size()) + packet.size();
    if (n <= OutputFile::kBufferSize / 2) {
        char* p = out_.room(n);
        *p++ = 0x0A;  // Trace.packet = 1, length-delimited
        p = ProtoEncoder::put_varint(p, packet.size());
        std::memcpy(p, packet.data(), packet.size());
        out_.advance(n);
    } else {
        char head[11];
        head[0] = 0x0A;
        out_.write(head, static_cast<size_t>(ProtoEncoder::put_varint(head + 1, packet.size()) - head));
        out_.write(packet.data(), packet.size());
    }
    ++packets_;
}

uint64_t PftraceWriter::track(Track kind, int32_t pid, int32_t id) {
    auto& map = tracks_[static_cast<size_t>(kind)];
    if (auto it = map.find(key_of(pid, id)); it != map.end()) [[likely]]
        return it->second;
    // A child track's parent first: its descriptor names the parent's uuid.
    if (kind == Track::Holder || kind == Track::Waiters) track(Track::Process, pid, pid);
    const uint64_t uuid = next_uuid_++;
    map.emplace(key_of(pid, id), uuid);
    describe(kind, uuid, pid, id);
    return uuid;
}

// TrackDescriptor packets: a process's track, a thread's own track, its
// "GIL" track, a process's "GIL holder" slice track (id: the JSON trace's
// holder row, gil_track_tid) and its "GIL waiters" counter (id: the GIL).
void PftraceWriter::describe(Track kind, uint64_t uuid, int32_t pid, int32_t id) {
    std::string p;
    ProtoEncoder e(p);
    const size_t d = e.begin(kPacketTrackDescriptor);
    e.varint(kTrackUuid, uuid);
    if (kind == Track::Process) {
        const size_t m = e.begin(kTrackProcess);
        e.int64(kProcessPid, pid);
        e.end(m);
    } else if (kind == Track::Thread || kind == Track::GilRow) {
        if (kind == Track::GilRow) e.string(kTrackName, "GIL");
        const size_t m = e.begin(kTrackThread);
        e.int64(kThreadPid, pid);
        e.int64(kThreadTid, id);
        e.end(m);
    } else {
        e.varint(kTrackParent, tracks_[static_cast<size_t>(Track::Process)].at(key_of(pid, pid)));
        if (kind == Track::Holder) {
            const uint32_t index = (static_cast<uint32_t>(id) - gil_track_tid(pid, 0)) >> 22;
            e.string(kTrackName, index ? "GIL holder (GIL " + std::to_string(index + 1) + ")" : "GIL holder");
        } else {
            e.string(kTrackName, id ? "GIL waiters (GIL " + std::to_string(id + 1) + ")" : "GIL waiters");
            const size_t c = e.begin(kTrackCounter);
            e.end(c);
        }
    }
    e.end(d);
    e.varint(kPacketSequenceId, kSequence);
    write_packet(p);
}

uint64_t PftraceWriter::event_name(std::string_view name) {
    auto [it, fresh] = event_names_.try_emplace(std::string(name), event_names_.size() + 1);
    if (fresh) new_event_names_.emplace_back(it->second, name);
    return it->second;
}

uint64_t PftraceWriter::annotation_name(std::string_view name) {
    auto [it, fresh] = annotation_names_.try_emplace(std::string(name), annotation_names_.size() + 1);
    if (fresh) new_annotation_names_.emplace_back(it->second, name);
    return it->second;
}

ProtoEncoder PftraceWriter::begin(uint64_t type, uint64_t track_uuid, uint64_t name_iid) {
    event_.clear();
    ProtoEncoder e(event_);
    e.varint(kEventType, type);
    e.varint(kEventTrackUuid, track_uuid);
    if (name_iid) e.varint(kEventNameIid, name_iid);
    return e;
}

void PftraceWriter::annotation(ProtoEncoder& e, std::string_view name, int64_t v) {
    const uint64_t iid = annotation_name(name);
    const size_t a = e.begin(kEventAnnotations);
    e.varint(kAnnotationNameIid, iid);
    e.int64(kAnnotationInt, v);
    e.end(a);
}

void PftraceWriter::annotation(ProtoEncoder& e, std::string_view name, std::string_view v) {
    const uint64_t iid = annotation_name(name);
    const size_t a = e.begin(kEventAnnotations);
    e.varint(kAnnotationNameIid, iid);
    e.string(kAnnotationString, v);
    e.end(a);
}

// TracePacket { timestamp, track_event (event_), sequence id and flags,
// interned_data with the names first used by this event }.
void PftraceWriter::emit(uint64_t ts) {
    packet_.clear();
    ProtoEncoder e(packet_);
    e.varint(kPacketTimestamp, ts);
    e.bytes(kPacketTrackEvent, event_);
    e.varint(kPacketSequenceId, kSequence);
    e.varint(kPacketSequenceFlags, first_ ? kSeqIncrementalStateCleared : kSeqNeedsIncrementalState);
    first_ = false;
    if (!new_event_names_.empty() || !new_annotation_names_.empty()) {
        const size_t in = e.begin(kPacketInterned);
        for (const auto& [iid, name] : new_event_names_) {
            const size_t m = e.begin(kInternedEventNames);
            e.varint(1, iid);
            e.string(2, name);
            e.end(m);
        }
        for (const auto& [iid, name] : new_annotation_names_) {
            const size_t m = e.begin(kInternedAnnotationNames);
            e.varint(1, iid);
            e.string(2, name);
            e.end(m);
        }
        e.end(in);
        new_event_names_.clear();
        new_annotation_names_.clear();
    }
    write_packet(packet_);
}

void PftraceWriter::slice_end(uint64_t track_uuid, uint64_t ts) {
    begin(kSliceEnd, track_uuid, 0);
    emit(ts);
}

// Only labelled sleeps: a plain state ("S", "D", "R+", …) is drawn by
// Perfetto from the scheduler's events.
void PftraceWriter::span(const Span& s) {
    if (s.evidence.empty() || s.name == s.state || !filter_.wanted(s.tgid) || s.end <= s.start) return;
    const uint64_t uuid = track(Track::Thread, s.tgid, s.tid);
    ProtoEncoder e = begin(kSliceBegin, uuid, event_name(s.name));
    annotation(e, "state", s.state);
    annotation(e, "evidence", s.evidence);
    if (!s.function.empty()) annotation(e, "function", s.function);
    if (s.waker > 0) annotation(e, "waker", s.waker);
    if (s.cut_at_end) annotation(e, "cut_at_end", 1);
    emit(s.start);
    slice_end(uuid, s.end);
}

void PftraceWriter::name_thread(int32_t pid, int32_t tid, std::string_view name) {
    thread_names_[key_of(pid, tid)] = std::string(name);
}

void PftraceWriter::gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns,
                             bool cut) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    const uint64_t uuid = track(Track::GilRow, pid, tid);
    ProtoEncoder e = begin(kSliceBegin, uuid, event_name(what == GilSpan::Wait ? "GIL wait" : "LOCK"));
    if (gil > 0) annotation(e, "gil", static_cast<int64_t>(gil) + 1);
    if (cut) annotation(e, "cut_at_end", 1);
    emit(start_ns);
    slice_end(uuid, end_ns);
}

void PftraceWriter::gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                               std::string_view culprit) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    const uint64_t uuid = track(Track::Holder, pid, track_tid);
    ProtoEncoder e = begin(kSliceBegin, uuid, event_name("GIL held by " + std::to_string(holder)));
    annotation(e, "holder", holder);
    if (!culprit.empty()) annotation(e, "culprit", culprit);
    emit(start_ns);
    slice_end(uuid, end_ns);
}

void PftraceWriter::gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) {
    if (!filter_.wanted(pid)) return;
    ProtoEncoder e = begin(kCounter, track(Track::Waiters, pid, static_cast<int32_t>(gil)), 0);
    e.int64(kEventCounterValue, waiting);
    emit(ts_ns);
}

// ProcessTree { processes { pid 1, cmdline 3, cmdline_is_comm 9 },
// threads { tid 1, name 2, tgid 3 } }: a process by its main thread's comm
// (else the first seen).
void PftraceWriter::finish(const std::vector<const ThreadStats*>& threads, const PftraceSystem& sys) {
    if (!system_info_written_) system_info(sys);
    sched_.flush();
    std::map<int32_t, std::string_view> process_names;
    for (const ThreadStats* t : threads) {
        if (t->tgid <= 0) continue;
        if (t->tid == t->tgid || !process_names.count(t->tgid)) process_names[t->tgid] = t->comm;
    }
    std::string p;
    ProtoEncoder e(p);
    const size_t tree = e.begin(kPacketProcessTree);
    for (const auto& [pid, name] : process_names) {
        const size_t m = e.begin(1);
        e.int64(1, pid);
        e.string(3, name);
        e.boolean(9, true);
        e.end(m);
    }
    for (const ThreadStats* t : threads) {
        if (t->tgid <= 0) continue;
        const size_t m = e.begin(2);
        e.int64(1, t->tid);
        auto named = thread_names_.find(key_of(t->tgid, t->tid));
        e.string(2, named != thread_names_.end() ? std::string_view(named->second) : std::string_view(t->comm));
        e.int64(3, t->tgid);
        e.end(m);
    }
    e.end(tree);
    write_packet(p);
}

}  // namespace gilscan
