// Session::run and Session::deliver — the perfdata stage's loop: records in time order
// to the stages, with the reader on its own thread for large recordings.
// (The session's set-up — header, attrs, features, names — is session.cc.)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include <pthread.h>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/handoff.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/reader.h"
#include "gilscan/perfdata/session.h"

namespace gilscan {

namespace {

// Two records byte for byte (word by word: two different samples differ
// within their first four words: id, ip, pid/tid, time).
bool same_bytes(const uint8_t* a, const uint8_t* b, uint32_t size, uint32_t a_size) {
    if (size != a_size) return false;
    uint32_t i = 0;
    for (; i + 8 <= size; i += 8)
        if (load<uint64_t>(a + i, false) != load<uint64_t>(b + i, false)) return false;
    return std::memcmp(a + i, b + i, size - i) == 0;
}

}  // namespace

// The stages' side: records of one batch to the sink.
void Session::consume(const HandedBatch& batch, EventSink& sink, const ChunkTable& origins) {
    RawRecord r;
    const Handed* const items = batch.items.data();
    const void* const* const notes = batch.notes.empty() ? nullptr : batch.notes.data();
    const size_t n = batch.items.size();
    const bool stack_samples = stack_samples_;
    for (size_t i = 0; i < n; ++i) {
        // The reader's core read these bytes last: ask for them early.
        if (i + 8 < n) {
            __builtin_prefetch(items[i + 8].rec);
            __builtin_prefetch(items[i + 8].rec + 64);
        }
        if (stack_samples && i + 4 < n) prefetch_stack_sample(items[i + 4], header_.swap);
        const Handed& h = items[i];
        with_byte_order(header_.swap, [&](auto sw) { read_framed(h.rec, sw, r); });
        r.note = notes ? notes[i] : nullptr;
        deliver(r, h.event, sink, [&h, &origins](RawRecord& x) {
            x.offset = origins.origin(h.chunk, h.rec);
            x.chunk = h.chunk;
        });
    }
    keep_last_sample();  // the batch's chunks may be reused once it is back
}

// Two threads: the reader (framing, decompression, ids, timestamps, ordering:
// reader.cc) and the caller's thread, which runs the stages on records in
// time order. They meet only at batches; the reader waits for the stages to
// go idle before applying a record that changes the session's own state
// (attrs, formats, names: pipe mode's header records), so the stages never
// see it change under them. Small recordings are read inline: a second
// thread would cost more than it overlaps.
void Session::run(EventSink& sink) {
    const uint64_t begin = header_.pipe ? PERF_PIPE_HEADER_SIZE : header_.data.offset;
    const uint64_t end = header_.pipe ? file_.size() : header_.data.offset + header_.data.size;
    const bool threaded = threaded_.value_or(!file_.streaming() && end - begin >= kThreadedFrom);
    // The reader stage, idle work and MMAP hook only beside the stages:
    // inline, nothing is ahead.
    SessionReader::Options opt;
    opt.threaded = threaded;
    opt.stage = threaded ? reader_stage_ : nullptr;
    opt.idle_work = threaded && reader_idle_ ? &reader_idle_ : nullptr;
    opt.mmap_seen = threaded && mmap_seen_ ? &mmap_seen_ : nullptr;
    opt.inline_sink = &sink;
    opt.live = file_.streaming();
    auto rd = std::make_unique<SessionReader>(*this, begin, end, chunk_size_, opt);
    // Up to 64 batches in flight, bounded in bytes too (kInFlightBytes). A
    // round released at FINISHED_ROUND is pumped into it while the next
    // round is read (OrderedQueue::pump), so both threads stay busy even
    // when a round is several times what may be in flight.
    BatchHandoff handoff(64, kInFlightBytes);
    // A stream's reads may hand over what waits to be ordered (stream_waiting).
    struct Unset {
        SessionReader*& p;
        ~Unset() { p = nullptr; }
    } unset{live_reader_};
    if (!threaded && file_.streaming()) live_reader_ = rd.get();
    if (!threaded) rd->read_all(handoff);
    else run_stages_beside_reader(*rd, handoff, sink);
    if (rd->error) std::rethrow_exception(rd->error);
    merge_reader_stats(*rd, begin, end);
    warn_about_run();
}

// The reader on a thread of its own; this thread runs the stages on its batches.
void Session::run_stages_beside_reader(SessionReader& rd, BatchHandoff& handoff, EventSink& sink) {
    std::thread reader([&rd, &handoff] {
        pthread_setname_np(pthread_self(), "gilscan-read");
        rd.read_all(handoff);
    });
    HandedBatch batch;
    try {
        auto next = [&] { return stages_idle_ ? handoff.pop(batch, stages_idle_) : handoff.pop(batch); };
        while (next()) {
            consume(batch, sink, rd.chunks);  // the stages read only origin() of the chunk table
            handoff.done(std::move(batch));
        }
    } catch (...) {
        handoff.abort();
        reader.join();
        throw;
    }
    reader.join();
}

void Session::merge_reader_stats(const SessionReader& rd, uint64_t begin, uint64_t end) {
    if (rd.malformed) {
        if (stats_.malformed == 0 || rd.first_malformed < stats_.first_malformed_offset) {
            stats_.first_malformed_offset = rd.first_malformed;
            stats_.first_malformed_reason = rd.malformed_reason;
        }
        stats_.malformed += rd.malformed;
    }
    if (time_lo_ <= time_hi_) {  // over every run() so far, as the stats are
        stats_.first_time = time_lo_;
        stats_.last_time = time_hi_;
        stats_.have_time = true;
    }
    stats_.unknown_types += rd.unknown_types;
    stats_.records += rd.records;
    stats_.unknown_ids += rd.unknown_ids;
    if (progress_) progress_(end - begin, end - begin);
    stats_.out_of_order = rd.q.out_of_order();
    stats_.compressed_records = rd.rs.compressed_records();
    stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, rd.chunks.peak_live_bytes());
    for (const auto& w : rd.rs.warnings()) warn(w);
    if (rd.rs.stopped()) {
        stats_.truncated = true;
        warn(rd.rs.stop_reason() + " at byte " + std::to_string(rd.rs.stop_offset()) +
             "; results cover the data before it");
    }
}

void Session::warn_about_run() {
    if (stats_.malformed)
        warn(std::to_string(stats_.malformed) + " malformed record(s) skipped, the first at byte " +
             std::to_string(stats_.first_malformed_offset) + ": " + stats_.first_malformed_reason);
    if (stats_.unknown_ids) warn(std::to_string(stats_.unknown_ids) + " record(s) with an unknown event id skipped");
    if (stats_.out_of_order)
        warn(std::to_string(stats_.out_of_order) + " record(s) arrived out of time order");
    if (stats_.lost_records)
        warn(std::to_string(stats_.lost_events) + " event(s) lost in " + std::to_string(stats_.lost_records) +
             " LOST record(s); affected intervals are marked unknown");
    if (stats_.duplicate_samples)
        warn(std::to_string(stats_.duplicate_samples) +
             " sample(s) skipped that repeat the one before them (same event, time, CPU, thread and payload: written twice by perf)");
    if (stats_.lost_samples) warn(std::to_string(stats_.lost_samples) + " sample(s) dropped by the kernel (LOST_SAMPLES)");
}


// perf record (6.1, uprobes) was seen to write a round's last samples again
// at the start of the next round: the same bytes, id, time, CPU. One
// tracepoint hit or overflow gives one sample per event, so a timed sample
// identical to the one just before it, byte for byte, is that one again;
// delivered, it breaks the state machines (a take_gil entered twice: hundreds
// of "overlapping holders" after it). Equal times alone are not enough: a
// coarse clock, or a generated capture, gives one waker's two wake-ups the
// same time. The bytes are compared only when the times are equal; the
// previous sample is remembered by where it is, not copied (copying its
// payload for every sample would cost more than the rare compare).
bool Session::repeats_last_sample(const Sample& s, const RawRecord& r) {
    LastSample& l = last_sample_;
    const uint8_t* rec = r.body.data() - PERF_EVENT_HEADER_SIZE;
    if (s.has_time && l.rec && s.time == l.time && same_bytes(l.rec, rec, r.size, l.size)) return true;
    l.rec = s.has_time ? rec : nullptr;
    l.size = r.size;
    l.time = s.time;
    l.copied = false;
    return false;
}

// Before a batch goes back to the reader (which may then reuse its chunks).
void Session::keep_last_sample() {
    LastSample& l = last_sample_;
    if (!l.rec || l.copied) return;
    l.copy.assign(l.rec, l.rec + l.size);
    l.rec = l.copy.data();
    l.copied = true;
}

// A record that does not decode is counted and skipped; what the stages
// throw (an output that cannot be written) ends the run: only the decoding
// is guarded.
template <class Decode>
bool Session::decoded(const RawRecord& r, Decode&& decode) {
    try {
        decode();
        return true;
    } catch (const Error& e) {
        if (stats_.malformed++ == 0) {
            stats_.first_malformed_offset = r.offset;
            stats_.first_malformed_reason = e.what();
        }
        return false;
    }
}

// Samples, nearly every record, on a path of their own: inlined into the
// batch loop, with parse_sample and the other record types out of line (as
// one function for all, its register saves alone were 18 instructions a
// record).
// Where the record came from (offset, chunk) is set only for the paths that
// read it: copying it per record was 8 of a sample's instructions.
template <class Complete>
[[gnu::always_inline]] inline void Session::deliver(RawRecord& r, int event, EventSink& sink, Complete&& complete) {
    // The reader's lookup, when it came with the record: its EventIds are a
    // copy of these, changed only while the stages are idle and every record
    // read before the change has been delivered (run()), so it is the event
    // this lookup would find.
    const int event_index =
        event >= 0 ? event : with_byte_order(header_.swap, [&](auto sw) { return ids_.event_for(r, sw); });
    if (event_index < 0) return;  // counted when it was read
    if (r.type != PERF_RECORD_SAMPLE) [[unlikely]] {
        complete(r);
        deliver_other(r, event_index, sink);
        return;
    }
    const EventInfo& ev = events_[static_cast<size_t>(event_index)];
    // One Sample per attr, reused: the same fields are written every time.
    Sample& s = sample_cache_[static_cast<size_t>(event_index)];
    // The fixed-offset fast path; parse_sample for other layouts, and to
    // report what is wrong with a body too short for its fields.
    if (!(ev.layout.fixed && parse_sample_fixed(r.body, header_.swap, ev.layout, s))) {
        complete(r);
        if (!parse_sample_checked(r, ev, s)) return;
    }
    if (repeats_last_sample(s, r)) {
        ++stats_.duplicate_samples;
        return;
    }
    s.note = r.note;
    if (window_) [[unlikely]] {
        if (!window_->anchored && s.has_time) window_->anchor(s.time);  // the first sample
        if (!s.has_time || window_->contains(s.time)) ++stats_.samples_by_event[static_cast<size_t>(event_index)];
    } else {
        ++stats_.samples_by_event[static_cast<size_t>(event_index)];
    }
    if (s.has_time) {
        // Into stats_ at the end of run(): here two compares, no flag.
        time_lo_ = std::min(time_lo_, s.time);
        time_hi_ = std::max(time_hi_, s.time);
    }
    sink.on_sample(s, ev);
}

__attribute__((noinline)) bool Session::parse_sample_checked(const RawRecord& r, const EventInfo& ev, Sample& s) {
    return decoded(r, [&] { parse_sample(Cursor(r.body, header_.swap, &file_.path(), r.offset + 8), ev.attr, s); });
}

__attribute__((noinline)) void Session::deliver_other(const RawRecord& r, int event_index, EventSink& sink) {
    const EventInfo& ev = events_[static_cast<size_t>(event_index)];
    const bool swap = header_.swap;
    switch (r.type) {
    case PERF_RECORD_COMM: {
        CommEvent e;
        if (!decoded(r, [&] { decode_comm(r.body, r.misc, ev.attr, swap, e); })) return;
        sink.on_comm(e);
        break;
    }
    case PERF_RECORD_FORK:
    case PERF_RECORD_EXIT: {
        TaskEvent e;
        if (!decoded(r, [&] { decode_task(r.body, ev.attr, swap, e); })) return;
        if (r.type == PERF_RECORD_FORK)
            sink.on_fork(e);
        else
            sink.on_exit(e);
        break;
    }
    case PERF_RECORD_MMAP:
    case PERF_RECORD_MMAP2: {
        MmapEvent e;
        if (!decoded(r, [&] { decode_mmap(r.body, r.type, r.misc, ev.attr, swap, e); })) return;
        sink.on_mmap(e);
        break;
    }
    case PERF_RECORD_LOST:
    case PERF_RECORD_LOST_SAMPLES: {
        LostEvent e;
        if (!decoded(r, [&] { decode_lost(r.body, r.type, ev.attr, swap, e); })) return;
        if (e.samples) {
            stats_.lost_samples += e.lost;
            stats_.lost_samples_by_cpu[e.sid.cpu] += e.lost;
        } else {
            ++stats_.lost_records;
            stats_.lost_events += e.lost;
            stats_.lost_by_cpu[e.sid.cpu] += e.lost;
        }
        sink.on_lost(e);
        break;
    }
    case PERF_RECORD_SWITCH:
    case PERF_RECORD_SWITCH_CPU_WIDE: {
        SwitchEvent e;
        if (!decoded(r, [&] { decode_switch(r.body, r.type, r.misc, ev.attr, swap, e); })) return;
        sink.on_switch(e);
        break;
    }
    default:
        // KSYMBOL, BPF_EVENT, CGROUP, TEXT_POKE, ...: framed, not needed.
        if (r.type > PERF_RECORD_AUX_OUTPUT_HW_ID && r.type < PERF_RECORD_KERNEL_MAX) ++stats_.unknown_types;
        break;
    }
}

}  // namespace gilscan
