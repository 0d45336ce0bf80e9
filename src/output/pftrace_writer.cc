// The .pftrace writer (pftrace_writer.h). Field numbers are those of
// perfetto_trace.proto; each is named where it is written.
#include "gilscan/output/pftrace_writer.h"

#include <cstring>
#include <map>
#include <memory>

#include "gilscan/gil/gil_probes.h"
#include "gilscan/perfdata/byte_buffer.h"

namespace gilscan {

namespace {

// Trace.packet (field 1, length-delimited): each packet's tag; TracePacket.
constexpr char kTracePacketTag = 0x0A;
// The most bytes of a track event's packet besides its event and interned
// data: the frame's tag and length, timestamp, clock, sequence, and the tags
// and lengths of the two (each varint at most 10 bytes).
constexpr size_t kPacketRoom = 64;
constexpr uint32_t kPacketTimestamp = 8, kPacketClockId = 58, kPacketTrackEvent = 11, kPacketSequenceId = 10,
                   kPacketInterned = 12, kPacketSequenceFlags = 13, kPacketDefaults = 59, kPacketClockSnapshot = 6,
                   kPacketTrackDescriptor = 60, kPacketProcessTree = 2, kPacketSystemInfo = 45;
constexpr uint64_t kSeqIncrementalStateCleared = 1;
// TrackEvent.
constexpr uint32_t kEventType = 9, kEventNameIid = 10, kEventAnnotations = 4, kEventCounterValue = 30;
// DebugAnnotation.
constexpr uint32_t kAnnotationNameIid = 1, kAnnotationInt = 4, kAnnotationStringIid = 17;
// InternedData: event_names and debug_annotation_names ({ iid 1, name 2 }),
// debug_annotation_string_values ({ iid 1, str 2 }).
constexpr uint32_t kInternedEventNames = 2, kInternedAnnotationNames = 3, kInternedStrings = 29;
// TrackDescriptor, ProcessDescriptor, ThreadDescriptor.
constexpr uint32_t kTrackUuid = 1, kTrackParent = 5, kTrackName = 2, kTrackProcess = 3, kTrackThread = 4,
                   kTrackCounter = 8;
// Iids of a sequence's own names and strings start here, past the fixed ones.
constexpr uint64_t kFirstOwnIid = 64;

void interned_entry(ProtoEncoder& e, uint32_t list, uint64_t iid, std::string_view text) {
    const size_t m = e.begin(list);
    e.varint(1, iid);
    e.string(2, text);
    e.end(m);
}

}  // namespace

bool is_pftrace_name(std::string_view path) {
    if (path.ends_with(".gz")) path.remove_suffix(3);
    return path.ends_with(".pftrace") || path.ends_with(".perfetto-trace");
}

PftraceWriter::PftraceWriter(OutputFile& out, TraceOptions opt, const PftraceSystem& sys)
    : out_(out), filter_{by_pid_only(std::move(opt))}, sched_([this](std::string_view p) { write_packet(p); }) {
    if (!sys.os_release.empty()) system_info(sys);
}

// SystemInfo { utsname { sysname 1, release 3, machine 4 }, num_cpus 8 }.
void PftraceWriter::system_info(const PftraceSystem& sys) {
    ProtoEncoder e;
    const size_t info = e.begin(kPacketSystemInfo);
    const size_t uts = e.begin(1);
    e.string(1, "Linux");
    if (!sys.os_release.empty()) e.string(3, sys.os_release);
    if (!sys.machine.empty()) e.string(4, sys.machine);
    e.end(uts);
    if (sys.nr_cpus) e.varint(8, sys.nr_cpus);
    e.end(info);
    write_packet(e.view());
    system_info_written_ = true;
}

void PftraceWriter::write_packet(std::string_view packet) {
    const size_t n = 1 + ProtoEncoder::varint_size(packet.size()) + packet.size();
    if (n <= OutputFile::kBufferSize / 2) {
        char* p = out_.room(n);
        *p++ = kTracePacketTag;
        p = ProtoEncoder::put_varint(p, packet.size());
        std::memcpy(p, packet.data(), packet.size());
        out_.advance(n);
    } else {
        char head[11];
        head[0] = kTracePacketTag;
        out_.write(head, static_cast<size_t>(ProtoEncoder::put_varint(head + 1, packet.size()) - head));
        out_.write(packet.data(), packet.size());
    }
    ++packets_;
}

uint64_t PftraceWriter::SequenceStrings::find(std::string_view s) const {
    for (const auto& [text, iid] : few_)
        if (same_short(text, s)) return iid;
    if (many_.empty()) return 0;
    auto it = many_.find(s);
    return it == many_.end() ? 0 : it->second;
}

void PftraceWriter::SequenceStrings::add(std::string_view s, uint64_t iid) {
    if (few_.size() < kScanned) few_.emplace_back(std::string(s), iid);
    else many_.emplace(std::string(s), iid);
}

// A track not asked for before: its state, its slot, its descriptor.
PftraceWriter::Track& PftraceWriter::new_track(Kind kind, int32_t pid, int32_t id) {
    const uint64_t key = key_of(pid, id);
    const auto k = static_cast<uint8_t>(kind);
    // A child track's parent first: its descriptor names the parent's uuid.
    const uint64_t parent = kind == Kind::Holder || kind == Kind::Waiters ? track(Kind::Process, pid, pid).uuid : 0;
    tracks_.push_back(std::make_unique<Track>());
    Track& t = *tracks_.back();
    t.uuid = tracks_.size();
    // Sequence 0 is none, and 1 is left to other writers' conventions.
    t.sequence = kind == Kind::Process ? 0 : static_cast<uint32_t>(t.uuid + 1);
    if (2 * tracks_.size() > by_key_.size()) {  // past half full: twice the size, every track placed again
        std::vector<Slot> old(2 * by_key_.size());
        old.swap(by_key_);
        for (const Slot& o : old)
            if (o.track) slot(o.kind, o.key) = o;
    }
    slot(k, key) = {key, k, &t};
    describe(kind, t, pid, id, parent);
    return t;
}

// TrackDescriptor packets: a process's track, a thread's own track, its
// "GIL" track, a process's "GIL holder" slice track (id: the JSON trace's
// holder row, gil_track_tid) and its "GIL waiters" counter (id: the GIL).
void PftraceWriter::describe(Kind kind, const Track& t, int32_t pid, int32_t id, uint64_t parent) {
    ProtoEncoder e;
    const size_t d = e.begin(kPacketTrackDescriptor);
    e.varint(kTrackUuid, t.uuid);
    if (kind == Kind::Process) {
        const size_t m = e.begin(kTrackProcess);
        e.int64(1, pid);  // ProcessDescriptor.pid
        e.end(m);
    } else if (kind == Kind::Thread || kind == Kind::GilRow) {
        if (kind == Kind::GilRow) e.string(kTrackName, "GIL");
        const size_t m = e.begin(kTrackThread);
        e.int64(1, pid);  // ThreadDescriptor.pid, tid
        e.int64(2, id);
        e.end(m);
    } else {
        e.varint(kTrackParent, parent);
        if (kind == Kind::Holder) {
            const uint32_t index = (static_cast<uint32_t>(id) - static_cast<uint32_t>(gil_track_tid(pid, 0))) >> 22;
            e.string(kTrackName, index ? "GIL holder (GIL " + std::to_string(index + 1) + ")" : "GIL holder");
        } else {
            e.string(kTrackName, id ? "GIL waiters (GIL " + std::to_string(id + 1) + ")" : "GIL waiters");
            const size_t c = e.begin(kTrackCounter);
            e.end(c);
        }
    }
    e.end(d);
    write_packet(e.view());
}

// A sequence's first packet: its interned state cleared and the fixed names
// interned; its defaults (the track, the incremental clock); the clock's
// snapshot, at the track's first time on BOOTTIME, the trace's clock.
void PftraceWriter::start_sequence(Track& t, uint64_t ts) {
    ProtoEncoder& e = packet_;
    e.clear();
    e.varint(kPacketSequenceId, t.sequence);
    e.varint(kPacketSequenceFlags, kSeqIncrementalStateCleared);
    const size_t defaults = e.begin(kPacketDefaults);
    e.varint(58, kTrackClock);  // TracePacketDefaults.timestamp_clock_id
    const size_t te = e.begin(11);  // .track_event_defaults { track_uuid 11 }
    e.varint(11, t.uuid);
    e.end(te);
    e.end(defaults);
    const size_t snap = e.begin(kPacketClockSnapshot);
    size_t c = e.begin(1);  // ClockSnapshot.clocks { clock_id 1, timestamp 2, is_incremental 3 }
    e.varint(1, kBoottime);
    e.varint(2, ts);
    e.end(c);
    c = e.begin(1);
    e.varint(1, kTrackClock);
    e.varint(2, ts);
    e.boolean(3, true);
    e.end(c);
    e.varint(2, kBoottime);  // ClockSnapshot.primary_trace_clock
    e.end(snap);
    const size_t in = e.begin(kPacketInterned);
    for (size_t i = 0; i < kEventNames.size(); ++i) interned_entry(e, kInternedEventNames, i + 1, kEventNames[i]);
    for (size_t i = 0; i < kAnnotationNames.size(); ++i)
        interned_entry(e, kInternedAnnotationNames, i + 1, kAnnotationNames[i]);
    e.end(in);
    write_packet(e.view());
    t.started = true;
    t.clock = ts;
    t.next_iid = kFirstOwnIid;
}

void PftraceWriter::begin(uint64_t type, uint64_t name_iid) {
    event_.clear();
    event_.varint(kEventType, type);
    if (name_iid) event_.varint(kEventNameIid, name_iid);
}

uint64_t PftraceWriter::event_name(Track& t, std::string_view name) {
    for (size_t i = 0; i < kEventNames.size(); ++i)
        if (kEventNames[i] == name) return i + 1;
    if (const uint64_t known = t.names.find(name)) return known;
    const uint64_t iid = t.next_iid++;
    t.names.add(name, iid);
    interned_entry(interned_, kInternedEventNames, iid, name);
    return iid;
}

uint64_t PftraceWriter::holder_name(Track& t, int32_t holder) {
    if (t.last_holder_iid && t.last_holder == holder) return t.last_holder_iid;
    auto [it, fresh] = t.holders.try_emplace(holder, 0);
    if (fresh) {
        it->second = t.next_iid++;
        interned_entry(interned_, kInternedEventNames, it->second, "GIL held by " + std::to_string(holder));
    }
    t.last_holder = holder;
    t.last_holder_iid = it->second;
    return it->second;
}

// DebugAnnotation { name_iid, int_value }, its length counted first.
void PftraceWriter::annotation(Annotation a, int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    event_.tag(kEventAnnotations, ProtoEncoder::kLengthDelimited);
    event_.raw_varint(ProtoEncoder::varint_field_size(kAnnotationNameIid, a) +
                      ProtoEncoder::varint_field_size(kAnnotationInt, u));
    event_.varint(kAnnotationNameIid, a);
    event_.varint(kAnnotationInt, u);
}

// A string value, interned in the track's sequence (culprits, evidence and
// functions repeat from one slice to the next).
void PftraceWriter::annotation(Track& t, Annotation a, std::string_view v) {
    uint64_t iid = t.strings.find(v);
    if (!iid) {
        iid = t.next_iid++;
        t.strings.add(v, iid);
        interned_entry(interned_, kInternedStrings, iid, v);
    }
    event_.tag(kEventAnnotations, ProtoEncoder::kLengthDelimited);
    event_.raw_varint(ProtoEncoder::varint_field_size(kAnnotationNameIid, a) +
                      ProtoEncoder::varint_field_size(kAnnotationStringIid, iid));
    event_.varint(kAnnotationNameIid, a);
    event_.varint(kAnnotationStringIid, iid);
}

// TracePacket { timestamp (a delta on the track's clock, or BOOTTIME when
// time would go back), sequence, track_event (event_), interned_data
// (interned_: what this event used first) }: the fields at p; returns their end.
char* PftraceWriter::packet_fields(char* p, const Track& t, uint64_t time, bool back) {
    using E = ProtoEncoder;
    const auto field = [&p](uint32_t f, int wire, uint64_t v) {
        p = E::put_varint(E::put_varint(p, E::key(f, wire)), v);
    };
    const auto bytes = [&p, &field](uint32_t f, std::string_view b) {
        field(f, E::kLengthDelimited, b.size());
        copy_short(p, b.data(), b.size());
        p += b.size();
    };
    field(kPacketTimestamp, E::kVarint, time);
    if (back) field(kPacketClockId, E::kVarint, kBoottime);
    field(kPacketSequenceId, E::kVarint, t.sequence);
    bytes(kPacketTrackEvent, event_.view());
    if (interned_.size()) bytes(kPacketInterned, interned_.view());
    return p;
}

// The packet framed as Trace.packet, written straight into the output
// buffer: the fields after a one-byte length (a track event's packet is
// mostly shorter than 128 bytes), moved forward when theirs is longer.
void PftraceWriter::emit(Track& t, uint64_t ts) {
    if (!t.started) start_sequence(t, ts);
    const bool back = ts < t.clock;
    const uint64_t time = back ? ts : ts - t.clock;
    if (!back) t.clock = ts;
    const size_t most = kPacketRoom + event_.size() + interned_.size();
    if (most > OutputFile::kBufferSize / 2) [[unlikely]]
        return emit_large(t, time, back, most);
    char* const at = out_.room(most);
    const size_t body = static_cast<size_t>(packet_fields(at + 2, t, time, back) - (at + 2));
    at[0] = kTracePacketTag;
    size_t n = body + 2;
    if (body < 0x80) [[likely]] {
        at[1] = static_cast<char>(body);
    } else {
        const size_t k = ProtoEncoder::varint_size(body);
        std::memmove(at + 1 + k, at + 2, body);
        ProtoEncoder::put_varint(at + 1, body);
        n = 1 + k + body;
    }
    out_.advance(n);
    interned_.clear();
    ++packets_;
}

// A packet longer than the output buffer's room for one (a huge interned
// string): made whole aside, then written.
void PftraceWriter::emit_large(const Track& t, uint64_t time, bool back, size_t most) {
    std::string packet(most, '\0');
    packet.resize(static_cast<size_t>(packet_fields(packet.data(), t, time, back) - packet.data()));
    interned_.clear();
    write_packet(packet);
}

// Labelled sleeps, and sleeps with a stack (--sleep-stacks): a plain state
// ("S", "D", "R+", …) is drawn by Perfetto from the scheduler's events, and
// has nothing to add to it but its stack. The stack is the JSON trace's
// args.stack text (a JSON array of frames), interned: it repeats.
void PftraceWriter::span(const Span& s) {
    const bool labelled = !s.evidence.empty() && s.name != s.state;
    if ((!labelled && s.stack_json.empty()) || !filter_.wanted(s.tgid) || s.end <= s.start) return;
    Track& t = track(Kind::Thread, s.tgid, s.tid);
    if (!t.started) start_sequence(t, s.start);
    const uint64_t name = event_name(t, s.name);
    begin(kSliceBegin, name);
    annotation(t, kState, s.state);
    if (labelled) annotation(t, kEvidence, s.evidence);
    if (!s.function.empty()) annotation(t, kFunction, s.function);
    if (s.waker > 0) annotation(kWaker, s.waker);
    if (s.cut_at_end) annotation(kCutAtEnd, 1);
    if (!s.stack_json.empty()) annotation(t, kStack, s.stack_json);
    emit(t, s.start);
    begin(kSliceEnd, 0);
    emit(t, s.end);
}

void PftraceWriter::name_thread(int32_t pid, int32_t tid, std::string_view name) {
    thread_names_[key_of(pid, tid)] = std::string(name);
}

void PftraceWriter::gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns,
                             bool cut) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    Track& t = track(Kind::GilRow, pid, tid);
    begin(kSliceBegin, what == GilSpan::Wait ? 1 : 2);  // kEventNames
    if (gil > 0) annotation(kGil, static_cast<int64_t>(gil) + 1);
    if (cut) annotation(kCutAtEnd, 1);
    emit(t, start_ns);
    begin(kSliceEnd, 0);
    emit(t, end_ns);
}

void PftraceWriter::gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                               std::string_view culprit) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    Track& t = track(Kind::Holder, pid, track_tid);
    if (!t.started) start_sequence(t, start_ns);
    begin(kSliceBegin, holder_name(t, holder));
    annotation(kHolder, holder);
    if (!culprit.empty()) annotation(t, kCulprit, culprit);
    emit(t, start_ns);
    begin(kSliceEnd, 0);
    emit(t, end_ns);
}

void PftraceWriter::gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) {
    if (!filter_.wanted(pid)) return;
    Track& t = track(Kind::Waiters, pid, static_cast<int32_t>(gil));
    begin(kCounter, 0);
    event_.int64(kEventCounterValue, waiting);
    emit(t, ts_ns);
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
    ProtoEncoder e;
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
    write_packet(e.view());
}

}  // namespace gilscan
