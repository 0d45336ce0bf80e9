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
#include "gilscan/perfdata/session.h"

namespace gilscan {

namespace {

// One record on its way from the reader thread to the stages: a pointer into
// a chunk the reader keeps alive until the batch comes back. 16 bytes: the
// reader writes one per record into batch memory the stages' core read
// last, and those stores were most of the hand-over's time. At 32 bytes
// (with the record's file offset, its chunk's compressed flag and the
// reader stage's note) the bench's captures read measurably slower.
// The offset is looked up when a stage needs it (ChunkTable::origin); a
// note goes beside the record, only when there is a reader stage.
struct Handed {
    const uint8_t* rec;
    uint32_t chunk;
    int16_t event;  // as the reader found it (-1: not known, the stages look it up)
    // The record's size when the reader read its header (with a reader
    // stage), else 0 (the stages read it: prefetch_stack_sample).
    uint16_t size;
};
static_assert(sizeof(Handed) == 16);
// A batch of them: items resized, then written (no zero fill first); with a
// reader stage, notes[i] is items[i]'s note (or nullptr), else it is empty.
struct HandedBatch {
    std::vector<Handed, PrefaultAllocator<Handed>> items;  // 64 KiB reserved: prefaulted at once
    std::vector<const void*> notes;
    bool empty() const { return items.empty(); }
    void clear() {
        items.clear();
        notes.clear();
    }
};
// A record the stages will read 4 records on, in a recording with DWARF
// stacks (STACK_USER: samples of kilobytes). Their bytes were brought in by
// the reader's pread a round or two earlier (records wait to be ordered),
// since evicted or on the other core, and the stages read them in two
// places: the fields, registers and the innermost frames' stack words (the
// unwinder's reads, mostly within the first 1.5 kB), and dyn_size at the
// end (8 kB on). Asked for here, those misses overlap the work on the
// records before it (bench/run's DWARF
// rows). Its header was asked for 4 records ago.
inline void prefetch_stack_sample(const Handed& h, bool swap) {
    const size_t size = h.size ? h.size : load<uint16_t>(h.rec + 6, swap);  // perf_event_header.size
    if (size <= 1024) return;  // not a stack sample: its first two lines are asked for already
    // GCC 12 (-O1 and up) deleted this whole function, the prefetches being
    // its only effects (its tree DCE; clang keeps them): an empty volatile
    // asm is an effect it must keep.
    asm volatile("");
    __builtin_prefetch(h.rec + size - 8);
    for (size_t at = 128; at < 1536; at += 64) __builtin_prefetch(h.rec + at);
}
// Handed::event from the reader's lookup: events past int16_t go as not
// known (the stages look them up), never as another event.
int16_t handed_event(int ev) { return static_cast<int16_t>(ev >= 0 && ev <= INT16_MAX ? ev : -1); }
// A batch goes over at 4096 records or 256 KiB of record bytes, whichever
// comes first; at most 64 batches and 4 MiB of records are queued. Every
// chunk a queued record keeps alive is memory that was fresh once, and a
// fresh page costs microseconds on a VM (pinned to one core, 16 MiB in flight
// cost 5% more CPU than 4 MiB on a 64-CPU capture); 4 MiB is still some
// 40k scheduler events, milliseconds of work for the stages.
constexpr size_t kBatch = 4096;
constexpr size_t kBatchBytes = 256u << 10;
constexpr size_t kInFlightBytes = 4u << 20;
constexpr uint64_t kThreadedFrom = 4u << 20;  // data sections from 4 MiB get the reader thread
// The reader stage's optional work is done while the queue is all but full
// (within two batches of kInFlightBytes): the reader would soon wait for the
// stages anyway, so what it does for them comes off the longer of the two
// threads' work. A lower mark starves the stages: the reader takes so much over
// that the stages wait for it.
constexpr size_t kSpareFrom = kInFlightBytes - 2 * kBatchBytes;
// Ready records handed on per read record while the stages' queue has room.
constexpr size_t kPump = 512;
constexpr unsigned kPumpEvery = 8;

// What the reader writes for every record, on cache lines of its own (heap,
// 128-aligned, its size a multiple of 128). As locals of run() these shared
// lines with the stages' stack, and every ++records took a line the stages'
// core had just written.
struct alignas(128) ReaderSide {
    ReaderSide(const MappedFile& file, uint64_t begin, uint64_t end, bool swap, size_t chunk_size)
        : rs(file, begin, end, swap, chunks, chunk_size), q(chunks, 4u << 20) {}
    ChunkTable chunks;  // before rs and q: they release chunks when destroyed
    RecordStream rs;
    OrderedQueue q;
    HandedBatch batch, back;
    std::vector<HandedBatch> spares;  // finished batches' vectors, cleared (at most as many as were in flight)
    size_t batch_bytes = 0;
    // The session's EventIds, copied on the reader thread (see event_ids.h),
    // and again after each header record that may change them (pipe mode).
    EventIds ids;
    bool stopped = false;  // the stages gave up (handoff aborted)
    // Reader-side counts, merged with the stages' after both are done.
    uint64_t records = 0, unknown_ids = 0, malformed = 0, unknown_types = 0, first_malformed = 0;
    std::string malformed_reason;
    std::exception_ptr error;
};

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

// Two threads: the reader (framing, decompression, ids, timestamps, ordering)
// and the caller's thread, which runs the stages on records in time order.
// They meet only at batches; the reader waits for the stages to go idle
// before applying a record that changes the session's own state (attrs,
// formats, names: pipe mode's header records), so the stages never see it
// change under them.
void Session::run(EventSink& sink) {
    const uint64_t begin = header_.pipe ? PERF_PIPE_HEADER_SIZE : header_.data.offset;
    const uint64_t end = header_.pipe ? file_.size() : header_.data.offset + header_.data.size;
    auto side = std::make_unique<ReaderSide>(file_, begin, end, header_.swap, chunk_size_);
    // Up to 64 batches in flight, bounded in bytes too (kInFlightBytes). A
    // round released at FINISHED_ROUND is pumped into it while the next
    // round is read (OrderedQueue::pump), so both threads stay busy even
    // when a round is several times what may be in flight.
    Handoff<HandedBatch> handoff(64, kInFlightBytes);
    const ChunkTable& chunk_origins = side->chunks;  // the stages read only origin() of it

    // The stages' side: records of one batch to the sink.
    auto consume = [&](const HandedBatch& batch) {
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
            deliver(r, h.event, sink, [&h, &chunk_origins](RawRecord& x) {
                x.offset = chunk_origins.origin(h.chunk, h.rec);
                x.chunk = h.chunk;
            });
        }
        keep_last_sample();  // the batch's chunks may be reused once it is back
    };
    // Small recordings are read inline: a second thread would cost more than
    // it overlaps. Same code either way; only send() differs.
    const bool threaded = threaded_.value_or(end - begin >= kThreadedFrom);

    // Captures by value, and everything it writes is in *rd: on the reader
    // thread nothing of this frame (the stages' stack) is touched per record.
    // The reader stage only beside the stages: inline, nothing is ahead.
    ReaderStage* const stage = threaded ? reader_stage_ : nullptr;
    const std::function<bool()>* const idle_work = threaded && reader_idle_ ? &reader_idle_ : nullptr;
    const std::function<bool(const MmapEvent&)>* const mmap_seen = threaded && mmap_seen_ ? &mmap_seen_ : nullptr;
    auto read_all = [this, rdp = side.get(), &handoff, &consume, threaded, stage, idle_work, mmap_seen, begin, end] {
        ReaderSide& rd = *rdp;
        rd.ids = ids_;
        const EventIds& ids = rd.ids;
        const bool swap = header_.swap;
        ChunkTable& chunks = rd.chunks;
        HandedBatch& batch = rd.batch;
        batch.items.reserve(kBatch);
        if (stage) batch.notes.reserve(kBatch);
        if (threaded) rd.spares.reserve(65);  // the handoff's 64 in flight and one being filled
        // The reader stage over a whole batch, just before it goes: each
        // record in order (the stage's address spaces follow every one), its
        // note beside it. A batch at a time, the records' lines it reads can
        // be asked for 4 records ahead, as the stages do: the records were
        // read a round or two ago and are no longer in this core's caches
        // (one at a time, as the ordering queue hands them on, each stack
        // sample's parse and unwind waited for its misses). Spare time is
        // judged once a batch.
        // The batch was filled from the ordering queue's runs without
        // reading a record (hand_run): here each one's size is noted for the
        // stages (Handed::size), and the batch's bytes counted exactly.
        auto run_stage = [&] {
            const bool spare = handoff.queued_bytes() >= kSpareFrom;
            Handed* const items = batch.items.data();
            const size_t n = batch.items.size();
            batch.notes.resize(n);
            RawRecord r;
            size_t bytes = 0;
            for (size_t i = 0; i < n; ++i) {
                // Headers asked for 8 records ahead (the ordering queue did it
                // when it read them), each stack sample's lines 4 ahead.
                if (i + 8 < n) __builtin_prefetch(items[i + 8].rec);
                if (i + 4 < n) prefetch_stack_sample(items[i + 4], swap);
                Handed& h = items[i];
                with_byte_order(swap, [&](auto sw) { read_framed(h.rec, sw, r); });
                h.size = r.size;
                bytes += r.size;
                r.offset = chunks.origin(h.chunk, h.rec);
                r.chunk = h.chunk;
                const int ev = h.event >= 0 ? h.event : ids.event_for(r, swap);  // unknown events were never queued
                batch.notes[i] = ev >= 0 ? stage->on_record(r, events_[static_cast<size_t>(ev)], spare) : nullptr;
            }
            rd.batch_bytes = bytes;
        };
        // The chunks of every batch the stages have finished go back.
        auto reclaim = [&] {
        while (handoff.take_done(rd.back)) {
            for (const Handed& h : rd.back.items) chunks.release(h.chunk);
            for (const void* note : rd.back.notes)
                if (note) stage->release(note);  // notes come only with a stage
            rd.back.clear();
            rd.spares.push_back(std::move(rd.back));
        }
        };
        auto send = [&] {
            if (batch.empty() || rd.stopped) return;
            if (!threaded) {
                consume(batch);  // exceptions go straight to run()'s caller
                for (const Handed& h : batch.items) chunks.release(h.chunk);
                batch.clear();
                rd.batch_bytes = 0;
                return;
            }
            if (stage) run_stage();
            // Rather than wait for room, do what the stages left to the reader.
            if (idle_work) {
                while (handoff.would_wait(rd.batch_bytes) && (*idle_work)()) {
                }
            }
            if (!handoff.push(std::move(batch), rd.batch_bytes)) rd.stopped = true;
            batch.clear();
            rd.batch_bytes = 0;
            // Release the chunks of every batch the stages have finished (not
            // one per send: they would pile up beside the 64 in flight), and
            // keep their vectors for the batches to come. Reusing one per
            // send (and freeing the rest) allocated the next batch's 96 KiB
            // every other send, in a thread arena that gives freed memory
            // back (MADV_DONTNEED) and faults it in anew.
            reclaim();
            if (!rd.spares.empty()) {  // batch was moved into the handoff
                batch = std::move(rd.spares.back());
                rd.spares.pop_back();
            }
            batch.items.reserve(kBatch);
            if (stage) batch.notes.reserve(kBatch);
        };
        // A record without a time, handed on at once. Takes over a reference
        // to rec.chunk: the batch holds it until it comes back.
        auto hand = [&](const RawRecord& rec) {
            // The stages gave up: nothing more goes to them (the record's
            // chunk is freed with the ChunkTable).
            if (rd.stopped) return;
            // The reader stage sees it when the batch goes (run_stage).
            batch.items.push_back({rec.body.data() - PERF_EVENT_HEADER_SIZE, rec.chunk, handed_event(rec.event), rec.size});
            rd.batch_bytes += rec.size;
            if (batch.items.size() >= kBatch || rd.batch_bytes >= kBatchBytes) send();
        };
        RecordStream& rs = rd.rs;
        OrderedQueue& q = rd.q;
        // Nothing here needs a queued record's bytes (a reader stage reads
        // them when the batch goes, run_stage): the queue hands on runs of
        // where each one is, and the batch's bytes are counted at the round's
        // mean record size (the bound is on memory and latency, not exact;
        // run_stage counts them exactly). A batch is filled from a run in one
        // loop (as much of it as the batch takes), then sent if full. With a
        // reader stage the queue handed on one record at a time, its header
        // read here and again in run_stage.
        auto hand_run = [&](OrderedQueue::Run run) {
            const size_t mean = q.mean_record_size();
            const OrderedQueue::Entry* e = run.first;
            // Not after the stages gave up: send() then keeps the full batch
            // (nothing can take it), no more would fit, and this loop would
            // spin for ever (a run of ready records longer than a batch, as
            // flush_all hands over at the end of a file without rounds).
            while (e != run.last && !rd.stopped) {
                // Room by count and by bytes (at least one: a send empties the batch).
                const size_t by_bytes = rd.batch_bytes < kBatchBytes ? (kBatchBytes - rd.batch_bytes + mean - 1) / mean : 1;
                auto& items = batch.items;
                const size_t take = std::min({static_cast<size_t>(run.last - e), kBatch - items.size(), by_bytes});
                // Grown once, then written (a push_back per record tested
                // the capacity each time).
                const size_t at = items.size();
                items.resize(at + take);
                Handed* out = items.data() + at;
                for (const OrderedQueue::Entry* const stop = e + take; e != stop; ++e, ++out) {
                    // The entry holds events up to 4094 only: no clamp.
                    const uint32_t chunk = e->chunk();
                    *out = {chunks.data(chunk) + e->pos, chunk, static_cast<int16_t>(e->event()), 0};
                }
                rd.batch_bytes += take * mean;
                if (items.size() >= kBatch || rd.batch_bytes >= kBatchBytes) send();
            }
        };
        // The queue's operations: ready records go on a run at a time.
        auto queued = [&](auto&& op) { op(hand_run); };
        try {
            uint64_t next_progress = begin;
            const uint64_t progress_step = std::max<uint64_t>((end - begin) / 100, 1u << 20);
            RawRecord r;
            unsigned until_pump = 1;
            while (!rd.stopped && rs.next(r)) {
                if (progress_ && rs.position() >= next_progress) {
                    progress_(rs.position() - begin, end - begin);
                    next_progress = rs.position() + progress_step;
                }
                ++rd.records;
                if (chunks.live_bytes() > kWindowBytes) [[unlikely]] {
                    // The records waiting to be ordered hold more bytes than
                    // the window allows (a file without rounds whose every
                    // compressed record has a buffer of its own): the older
                    // half goes to the stages, and their buffers come back.
                    queued([&](auto& h) { q.release_older_half(h); });
                    send();
                    if (threaded && !handoff.wait_idle()) break;
                    reclaim();
                }
                if (r.type == PERF_RECORD_FINISHED_ROUND) {
                    queued([&](auto& h) {
                        q.finished_round(h);
                        if (!threaded) q.drain(h);
                    });
                    continue;
                }
                // The round before this one is ready: rather than handing it
                // over all at once at FINISHED_ROUND (the reader would wait
                // for the stages while they work through it, and they would
                // then wait while it reads the next round: a 64-CPU capture's
                // rounds are 12 MB, three times what may be in flight), hand it
                // on whenever the stages' queue has room for another batch.
                // Asked every kPumpEvery records, not every record (the
                // handoff's shared counter is read when asked): up to kPump
                // records go per kPumpEvery read, far more than come in.
                if (threaded && --until_pump == 0) {
                    until_pump = kPumpEvery;
                    if (q.ready() && handoff.queued_bytes() + 2 * kBatchBytes <= kInFlightBytes) queued([&](auto& h) { q.pump(h, kPump); });
                }
                if (r.type >= PERF_RECORD_KERNEL_MAX) {
                    queued([&](auto& h) { q.drain(h); });  // as if released at its round's end, before this record
                    send();
                    if (threaded && !handoff.wait_idle()) break;  // the stages are idle: safe to change attrs and formats
                    try {
                        handle_user_record(r);
                    } catch (const Error& e) {
                        if (rd.malformed++ == 0) {
                            rd.first_malformed = r.offset;
                            rd.malformed_reason = e.what();
                        }
                    }
                    rd.ids = ids_;  // whatever the record changed before it failed, if it did
                    if (r.type > PERF_RECORD_COMPRESSED2) ++rd.unknown_types;
                    continue;
                }
                // Its event, and its timestamp: a sample's TIME field, else
                // the sample_id_all trailer.
                const uint8_t* tp;
                int ev;
                uint64_t time = 0;
                with_byte_order(swap, [&](auto sw) {
                    ev = ids.event_and_time(r, sw, tp);
                    if (ev >= 0 && tp) time = load<uint64_t>(tp, sw);
                });
                if (ev < 0) {
                    ++rd.unknown_ids;
                    continue;
                }
                r.event = ev;
                if (mmap_seen && (r.type == PERF_RECORD_MMAP || r.type == PERF_RECORD_MMAP2)) {
                    MmapEvent e;
                    try {
                        decode_mmap(r.body, r.type, r.misc, events_[static_cast<size_t>(ev)].attr, swap, e);
                        if ((*mmap_seen)(e)) handoff.nudge();
                    } catch (const Error&) {
                        // malformed: the stages skip and count it
                    }
                }
                if (!tp) {
                    queued([&](auto& h) { q.drain(h); });
                    chunks.retain(r.chunk);
                    hand(r);  // as perf does for records without a time: delivered at once
                    continue;
                }
                queued([&](auto& h) { q.push(time, r, h); });
            }
            queued([&](auto& h) { q.flush_all(h); });
            send();
        } catch (...) {
            if (!threaded) throw;
            rd.error = std::current_exception();
        }
        handoff.close();
        // The stages still have up to kInFlightBytes of records to go
        // through, and hand over trace events all the while: the reader
        // does that idle work (formats them) until they are done, rather
        // than leave all of it to the stages' thread. When there is none, it
        // looks again every 100 us, and stops once the stages are done (or
        // gave up).
        if (idle_work) {
            using namespace std::chrono_literals;
            while (!handoff.wait_idle_for((*idle_work)() ? 0us : 100us)) {
            }
        }
    };

    if (!threaded) {
        read_all();
    } else {
        std::thread reader([read_all] {
            pthread_setname_np(pthread_self(), "gilscan-read");
            read_all();
        });
        HandedBatch batch;
        try {
            auto next = [&] { return stages_idle_ ? handoff.pop(batch, stages_idle_) : handoff.pop(batch); };
            while (next()) {
                consume(batch);
                handoff.done(std::move(batch));
            }
        } catch (...) {
            handoff.abort();
            reader.join();
            throw;
        }
        reader.join();
    }
    if (side->error) std::rethrow_exception(side->error);
    if (side->malformed) {
        if (stats_.malformed == 0 || side->first_malformed < stats_.first_malformed_offset) {
            stats_.first_malformed_offset = side->first_malformed;
            stats_.first_malformed_reason = side->malformed_reason;
        }
        stats_.malformed += side->malformed;
    }
    if (time_lo_ <= time_hi_) {  // over every run() so far, as the stats are
        stats_.first_time = time_lo_;
        stats_.last_time = time_hi_;
        stats_.have_time = true;
    }
    stats_.unknown_types += side->unknown_types;
    stats_.records += side->records;
    stats_.unknown_ids += side->unknown_ids;
    if (progress_) progress_(end - begin, end - begin);
    stats_.out_of_order = side->q.out_of_order();
    stats_.compressed_records = side->rs.compressed_records();
    stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, side->chunks.peak_live_bytes());
    for (const auto& w : side->rs.warnings()) warn(w);
    if (side->rs.stopped()) {
        stats_.truncated = true;
        warn(side->rs.stop_reason() + " at byte " + std::to_string(side->rs.stop_offset()) +
             "; results cover the data before it");
    }
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
    ++stats_.samples_by_event[static_cast<size_t>(event_index)];
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
    default:
        // SWITCH, KSYMBOL, BPF_EVENT, CGROUP, TEXT_POKE, ...: framed, not needed.
        if (r.type > PERF_RECORD_AUX_OUTPUT_HW_ID && r.type < PERF_RECORD_KERNEL_MAX) ++stats_.unknown_types;
        break;
    }
}

}  // namespace gilscan
