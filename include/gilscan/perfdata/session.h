// Session — stage 1 (perfdata): file, header, features, tracing formats, then
// every record in timestamp order, delivered to an EventSink.
//
//   Session s("perf.data");                 // throws gilscan::Error if not a recording
//   struct MySink : EventSink {
//       void on_sample(const Sample& smp, const EventInfo& ev) override { ... }
//   } sink;
//   s.run(sink);
//   s.stats().lost_events, s.stats().warnings
//
// Works the same on file-mode and pipe-mode recordings (where attrs, tracing
// data and features arrive as records) and on zstd-compressed ones. A record
// that cannot be decoded is counted in stats().malformed and skipped; a data
// stream that cannot be framed any further (cut file) stops with a warning.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gilscan/perfdata/features.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/kernel_records.h"
#include "gilscan/perfdata/mapped_file.h"
#include "gilscan/perfdata/event_ids.h"
#include "gilscan/perfdata/ordering.h"
#include "gilscan/perfdata/handoff.h"
#include "gilscan/perfdata/record_stream.h"
#include "gilscan/perfdata/sample.h"
#include "gilscan/perfdata/tp_kind.h"
#include "gilscan/perfdata/time_window.h"
#include "gilscan/perfdata/tracing_data.h"

namespace gilscan {

struct EventInfo {
    int index = 0;
    PerfEventAttr attr;
    SampleLayout layout;              // sample_layout(attr): the fixed-offset fast path
    std::string name;                 // "sched:sched_switch", "python:take_gil__return", ...
    bool name_known = false;          // from EVENT_DESC / EVENT_UPDATE / the formats, not "typeN:configM"
    const TpFormat* format = nullptr;  // tracepoints (and uprobes) only
    // Bumped whenever name or format may have changed (pipe mode's header
    // records): what a stage cached from either (a field's position inside
    // the old formats) is stale, and must be worked out again.
    uint32_t generation = 0;
    // Worked out with each generation, for the stages to read per sample
    // (each stage's own table by event index, checked against the
    // generation, was some 20 instructions a sample, twice):
    TpKind kind = TpKind::Other;      // event_kind(format, name): what TracepointDecoder decodes
    TpKind gil_kind = TpKind::Other;  // gil_probe_kind(name): a GIL probe by its name, format or not
};

struct DecodeStats {
    uint64_t records = 0;
    std::vector<uint64_t> samples_by_event;  // by EventInfo::index
    uint64_t lost_records = 0;      // PERF_RECORD_LOST records
    uint64_t lost_events = 0;       // sum of their `lost` fields
    uint64_t lost_samples = 0;      // PERF_RECORD_LOST_SAMPLES totals
    uint64_t duplicate_samples = 0; // a sample right after an identical one (written twice by perf): skipped
    std::map<uint32_t, uint64_t> lost_by_cpu;          // LOST events per CPU
    std::map<uint32_t, uint64_t> lost_samples_by_cpu;  // LOST_SAMPLES per CPU
    uint64_t malformed = 0;
    uint64_t first_malformed_offset = 0;
    std::string first_malformed_reason;
    uint64_t unknown_types = 0;
    uint64_t unknown_ids = 0;
    uint64_t out_of_order = 0;
    uint64_t compressed_records = 0;
    uint64_t peak_buffer_bytes = 0;  // read and decompressed buffers held at once, at most
    uint64_t first_time = 0, last_time = 0;
    bool have_time = false;
    bool truncated = false;
    std::vector<std::string> warnings;
};

// What a sink receives (Sample spans, comm and filename views) points into
// the record's read chunk: valid during the call only. Copy what you keep.
class EventSink {
public:
    virtual ~EventSink() = default;
    virtual void on_sample(const Sample&, const EventInfo&) {}
    virtual void on_comm(const CommEvent&) {}
    virtual void on_fork(const TaskEvent&) {}
    virtual void on_exit(const TaskEvent&) {}
    virtual void on_mmap(const MmapEvent&) {}
    virtual void on_lost(const LostEvent&) {}
    virtual void on_switch(const SwitchEvent&) {}
};

// A stage that runs on the reader thread (-j 2 and up, when the reader has a
// thread of its own), on every record in delivery order just before it goes
// to the stages: work the stages would otherwise do themselves, done while
// the reader is ahead of them. A record's note (what on_record returned)
// reaches the stages as Sample::note, and comes back to release() once the
// stages have finished the record's batch. A note must hold nothing the
// stages could not have worked out themselves: whether one is made depends
// on timing, and the results must not.
//
//   struct Ahead : ReaderStage { ... };   Ahead a;   session.set_reader_stage(&a);
class ReaderStage {
public:
    virtual ~ReaderStage() = default;
    // spare: the stages have batches queued, so the reader has time for optional work.
    virtual const void* on_record(const RawRecord& r, const EventInfo& ev, bool spare) = 0;
    virtual void release(const void* note) = 0;
};

struct HandedBatch;
class SessionReader;

class Session {
public:
    explicit Session(const std::string& path);
    // Bytes in memory (fuzzing): never falls back to this machine's tracefs.
    Session(const std::string& name, Bytes memory);
    // A pipe-mode stream as perf writes it (gilscan top): read inline,
    // each round handed to the sink as soon as it is ordered; a round is
    // held until the next ends (perf's rule), for its records may be older
    // than the last of the round before.
    // flushed(): a time (the recording's clock) before which perf has
    // written every record to the stream, once that is known (else 0):
    // gilscan top's pings to perf, each answered only after perf wrote out
    // its buffers for the one before. When a wait for bytes finds the
    // stream empty and every byte perf had written by that time read, the
    // records waiting to be ordered up to that time go to the sink too
    // (delivered_to()). stream.waiting is called as MappedFile says, after that.
    Session(const std::string& name, MappedFile::Stream stream, std::function<uint64_t()> flushed = {});
    // A stream's: every record up to this time has gone to the sink (0: not known).
    uint64_t delivered_to() const { return delivered_to_; }
    ~Session();

    void run(EventSink& sink);
    // Called now and then during run() with (bytes decoded, bytes in total).
    void set_progress(std::function<void(uint64_t, uint64_t)> f) { progress_ = std::move(f); }
    // Bytes per read of the data section (tests use tiny chunks to make records straddle them).
    void set_chunk_size(size_t n) { chunk_size_ = n; }
    // Reader thread or not (default: from a 4 MiB data section on). Tests force both.
    void set_threaded(bool on) { threaded_ = on; }
    // Runs only when the reader has a thread of its own (see set_threaded).
    void set_reader_stage(ReaderStage* stage) { reader_stage_ = stage; }
    // Work for the reader thread when it would wait for room in the stages'
    // queue (e.g. TraceRelay::format_some): called until the queue has room
    // or it returns false. It must not touch what the stages use unguarded.
    void set_reader_idle(std::function<bool()> f) { reader_idle_ = std::move(f); }
    // With a reader thread: every MMAP/MMAP2 record as the reader reads it,
    // before it is ordered (on the reader thread: it must be quick; true
    // when it left work for the stages' idle function), and work for the
    // stages' thread while it has no records (ModulePreloader: the binaries
    // those maps name, loaded before the first records come), a piece per
    // call, false when there is none.
    void set_mmap_seen(std::function<bool(const MmapEvent&)> f) { mmap_seen_ = std::move(f); }
    void set_stages_idle(std::function<bool()> f) { stages_idle_ = std::move(f); }
    // --time: anchored at the first sample delivered; samples_by_event then
    // counts the samples inside it only. The window outlives run().
    void set_window(TimeWindow* w) { window_ = w; }
    const TimeWindow* window() const { return window_; }

    const std::string& path() const { return file_.path(); }
    uint64_t file_size() const { return file_.size(); }
    const FileHeader& header() const { return header_; }
    const Features& features() const { return features_; }
    const TracingData& tracing() const { return tracing_; }
    const std::vector<EventInfo>& events() const { return events_; }
    const DecodeStats& stats() const { return stats_; }
    bool swap() const { return header_.swap; }
    // The clock the timestamps are on (from attr.clockid / HEADER_CLOCKID).
    std::string clock() const;

private:
    friend class SessionReader;  // the reader of run() (reader.h)
    // The stages' side of run(): a batch of records to the sink.
    void consume(const HandedBatch& batch, EventSink& sink, const ChunkTable& origins);
    // After run(): the reader's counts merged into stats_, and the warnings.
    void merge_reader_stats(const SessionReader& rd, uint64_t begin, uint64_t end);
    void warn_about_run();
    void run_stages_beside_reader(SessionReader& rd, Handoff<HandedBatch>& handoff, EventSink& sink);
    void add_event(const PerfEventAttr& attr, std::vector<uint64_t> ids);
    void resolve_names_and_formats();
    // After an event's name or format may have changed: a new generation, its kinds again.
    void renamed(EventInfo& ev);
    void set_tracing(Bytes data, uint64_t offset);
    void handle_user_record(const RawRecord& r);  // attrs, formats, features, names: reader thread, stages idle
    // r's type, size, body and note are set, and the event where the reader
    // found it (-1: not known); complete(r) sets the rest
    // (offset, chunk, compressed), which only the paths other than a
    // fixed-layout sample read.
    template <class Complete>
    void deliver(RawRecord& r, int event, EventSink& sink, Complete&& complete);  // event -1: look it up
    void deliver_other(const RawRecord& r, int event_index, EventSink& sink);  // not a sample
    bool parse_sample_checked(const RawRecord& r, const EventInfo& ev, Sample& s);
    template <class Decode>
    bool decoded(const RawRecord& r, Decode&& decode);
    void warn(std::string w);
    void open();

    MappedFile file_;
    FileHeader header_;
    Features features_;
    TracingData tracing_;
    bool have_tracing_ = false;
    bool tracefs_fallback_ = true;
    // A stream's: the reader while run() reads it inline, perf's flushed
    // time as it was before the current wait for bytes began, up to where
    // the records are delivered, and the caller's waiting (MappedFile::Stream).
    SessionReader* live_reader_ = nullptr;
    std::function<uint64_t()> flushed_;
    uint64_t flushed_before_wait_ = 0, delivered_to_ = 0;
    std::function<void(uint64_t)> stream_waiting_;
    void stream_waiting(uint64_t idle_ns);
    std::vector<EventInfo> events_;
    bool stack_samples_ = false;  // an event records STACK_USER (the stages prefetch such samples' lines)
    EventIds ids_;  // the stages'; the reader thread has its own copy (delivery.cc)
    std::function<void(uint64_t, uint64_t)> progress_;
    size_t chunk_size_ = RecordStream::kChunkSize;
    std::optional<bool> threaded_;
    ReaderStage* reader_stage_ = nullptr;
    std::function<bool()> reader_idle_;
    std::function<bool(const MmapEvent&)> mmap_seen_;
    std::function<bool()> stages_idle_;
    TimeWindow* window_ = nullptr;
    // Written by the stages' thread for every record, so on cache lines of
    // their own: sharing one with what the reader thread reads for every
    // record (progress_ sat right after stats_) made each write take the line
    // from the other core and each read take it back. 128: Intel's adjacent-line prefetcher fetches lines in pairs.
    alignas(128) DecodeStats stats_;
    std::vector<Sample> sample_cache_;  // by event index: the stages' thread only
    // The previous timed sample delivered, to recognise it written twice: its
    // bytes where they are (in a chunk its batch keeps alive), copied out
    // once per batch, before the batch goes back (keep_last_sample).
    bool repeats_last_sample(const Sample& s, const RawRecord& r);  // delivery.cc
    // The earliest and latest sample times delivered (lo > hi: none yet).
    uint64_t time_lo_ = ~uint64_t{0}, time_hi_ = 0;
    void keep_last_sample();
    struct LastSample {
        const uint8_t* rec = nullptr;  // the whole record, header included; nullptr: none
        uint32_t size = 0;
        uint64_t time = 0;
        bool copied = false;           // rec points into copy
        std::vector<uint8_t> copy;
    } last_sample_;
};

}  // namespace gilscan
