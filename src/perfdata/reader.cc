// SessionReader: the reader's loop of Session::run (reader.h).
#include "gilscan/perfdata/reader.h"

#include <algorithm>
#include <chrono>

#include "gilscan/perfdata/kernel_records.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/session.h"

namespace gilscan {

SessionReader::SessionReader(Session& s, uint64_t begin, uint64_t end, size_t chunk_size, Options opt)
    : rs(s.file_, begin, end, s.header_.swap, chunks, chunk_size),
      q(chunks, 4u << 20),
      s_(s),
      begin_(begin),
      end_(end),
      opt_(opt),
      swap_(s.header_.swap) {}

void SessionReader::read_all(BatchHandoff& handoff) {
    handoff_ = &handoff;
    ids_ = s_.ids_;
    batch_.items.reserve(kBatch);
    if (opt_.stage) batch_.notes.reserve(kBatch);
    if (opt_.threaded) spares_.reserve(65);  // the handoff's 64 in flight and one being filled
    try {
        read_records();
        queued([&](auto& h) { q.flush_all(h); });
        send();
    } catch (...) {
        if (!opt_.threaded) throw;
        error = std::current_exception();
    }
    handoff.close();
    idle_until_stages_done();
}

// Every record of the data section: framed, its event and time found, then
// ordered, or handed on at once (no time), or applied to the session
// (pipe mode's header records).
void SessionReader::read_records() {
    uint64_t next_progress = begin_;
    const uint64_t progress_step = std::max<uint64_t>((end_ - begin_) / 100, 1u << 20);
    RawRecord r;
    unsigned until_pump = 1;
    while (!stopped_ && rs.next(r)) {
        if (s_.progress_ && rs.position() >= next_progress) {
            s_.progress_(rs.position() - begin_, end_ - begin_);
            next_progress = rs.position() + progress_step;
        }
        ++records;
        if (chunks.live_bytes() > kWindowBytes) [[unlikely]] {
            if (!window_full()) break;
        }
        if (r.type == PERF_RECORD_FINISHED_ROUND) {
            queued([&](auto& h) {
                q.finished_round(h);
                if (!opt_.threaded) q.drain(h);
            });
            if (opt_.live) send();
            continue;
        }
        // The round before this one is ready: rather than handing it over
        // all at once at FINISHED_ROUND (the reader would wait for the
        // stages while they work through it, and they would then wait while
        // it reads the next round: a 64-CPU capture's rounds are 12 MB,
        // three times what may be in flight), hand it on whenever the
        // stages' queue has room for another batch. Asked every kPumpEvery
        // records, not every record (the handoff's shared counter is read
        // when asked): up to kPump records go per kPumpEvery read, far more
        // than come in.
        if (opt_.threaded && --until_pump == 0) {
            until_pump = kPumpEvery;
            if (q.ready() && handoff_->queued_bytes() + 2 * kBatchBytes <= kInFlightBytes)
                queued([&](auto& h) { q.pump(h, kPump); });
        }
        if (r.type >= PERF_RECORD_KERNEL_MAX) {
            queued([&](auto& h) { q.drain(h); });  // as if released at its round's end, before this record
            send();
            if (opt_.threaded && !handoff_->wait_idle()) break;  // the stages are idle: safe to change attrs and formats
            user_record(r);
            continue;
        }
        // Its event, and its timestamp: a sample's TIME field, else the
        // sample_id_all trailer.
        const uint8_t* tp;
        int ev;
        uint64_t time = 0;
        with_byte_order(swap_, [&](auto sw) {
            ev = ids_.event_and_time(r, sw, tp);
            if (ev >= 0 && tp) time = load<uint64_t>(tp, sw);
        });
        if (ev < 0) {
            ++unknown_ids;
            continue;
        }
        r.event = ev;
        if (opt_.mmap_seen && (r.type == PERF_RECORD_MMAP || r.type == PERF_RECORD_MMAP2)) note_mmap(r, ev);
        if (!tp) {
            queued([&](auto& h) { q.drain(h); });
            chunks.retain(r.chunk);
            hand(r);  // as perf does for records without a time: delivered at once
            continue;
        }
        queued([&](auto& h) { q.push(time, r, h); });
    }
}

void SessionReader::deliver_until(uint64_t limit) {
    queued([&](auto& h) { q.flush_until(limit, h); });
    send();
}

// The records waiting to be ordered hold more bytes than the window allows
// (a file without rounds whose every compressed record has a buffer of its
// own): the older half goes to the stages, and their buffers come back.
// false: the stages gave up.
bool SessionReader::window_full() {
    queued([&](auto& h) { q.release_older_half(h); });
    send();
    if (opt_.threaded && !handoff_->wait_idle()) return false;
    reclaim();
    return true;
}

// A record of the session's own (attrs, formats, names), applied while the
// stages are idle.
void SessionReader::user_record(const RawRecord& r) {
    try {
        s_.handle_user_record(r);
    } catch (const Error& e) {
        if (malformed++ == 0) {
            first_malformed = r.offset;
            malformed_reason = e.what();
        }
    }
    ids_ = s_.ids_;  // whatever the record changed before it failed, if it did
    if (r.type > PERF_RECORD_COMPRESSED2) ++unknown_types;
}

// An MMAP record as it is read, before any ordering (preload.h).
void SessionReader::note_mmap(const RawRecord& r, int ev) {
    MmapEvent e;
    try {
        decode_mmap(r.body, r.type, r.misc, s_.events_[static_cast<size_t>(ev)].attr, swap_, e);
        if ((*opt_.mmap_seen)(e)) handoff_->nudge();
    } catch (const Error&) {
        // malformed: the stages skip and count it
    }
}

// A record without a time, handed on at once. Takes over a reference to
// rec.chunk: the batch holds it until it comes back.
void SessionReader::hand(const RawRecord& rec) {
    // The stages gave up: nothing more goes to them (the record's chunk is
    // freed with the ChunkTable).
    if (stopped_) return;
    // The reader stage sees it when the batch goes (run_stage).
    batch_.items.push_back({rec.body.data() - PERF_EVENT_HEADER_SIZE, rec.chunk, handed_event(rec.event), rec.size});
    batch_bytes_ += rec.size;
    if (batch_.items.size() >= kBatch || batch_bytes_ >= kBatchBytes) send();
}

// Nothing here needs a queued record's bytes (a reader stage reads them
// when the batch goes, run_stage): the queue hands on runs of where each
// one is, and the batch's bytes are counted at the round's mean record size
// (the bound is on memory and latency, not exact; run_stage counts them
// exactly). A batch is filled from a run in one loop (as much of it as the
// batch takes), then sent if full.
void SessionReader::hand_run(OrderedQueue::Run run) {
    const size_t mean = q.mean_record_size();
    const OrderedQueue::Entry* e = run.first;
    // Not after the stages gave up: send() then keeps the full batch
    // (nothing can take it), no more would fit, and this loop would spin for
    // ever (a run of ready records longer than a batch, as flush_all hands
    // over at the end of a file without rounds).
    while (e != run.last && !stopped_) {
        // Room by count and by bytes (at least one: a send empties the batch).
        const size_t by_bytes = batch_bytes_ < kBatchBytes ? (kBatchBytes - batch_bytes_ + mean - 1) / mean : 1;
        auto& items = batch_.items;
        const size_t take = std::min({static_cast<size_t>(run.last - e), kBatch - items.size(), by_bytes});
        // Grown once, then written (a push_back per record tested the
        // capacity each time).
        const size_t at = items.size();
        items.resize(at + take);
        Handed* out = items.data() + at;
        for (const OrderedQueue::Entry* const stop = e + take; e != stop; ++e, ++out) {
            // The entry holds events up to 4094 only: no clamp.
            const uint32_t chunk = e->chunk();
            *out = {chunks.data(chunk) + e->pos, chunk, static_cast<int16_t>(e->event()), 0};
        }
        batch_bytes_ += take * mean;
        if (items.size() >= kBatch || batch_bytes_ >= kBatchBytes) send();
    }
}

// The batch to the stages: at once inline, else through the handoff.
void SessionReader::send() {
    if (batch_.empty() || stopped_) return;
    if (!opt_.threaded) {
        s_.consume(batch_, *opt_.inline_sink, chunks);  // exceptions go straight to run()'s caller
        for (const Handed& h : batch_.items) chunks.release(h.chunk);
        batch_.clear();
        batch_bytes_ = 0;
        return;
    }
    if (opt_.stage) run_stage();
    // Rather than wait for room, do what the stages left to the reader.
    if (opt_.idle_work) {
        while (handoff_->would_wait(batch_bytes_) && (*opt_.idle_work)()) {
        }
    }
    if (!handoff_->push(std::move(batch_), batch_bytes_)) stopped_ = true;
    batch_.clear();
    batch_bytes_ = 0;
    // Release the chunks of every batch the stages have finished (not one
    // per send: they would pile up beside the 64 in flight), and keep their
    // vectors for the batches to come. Reusing one per send (and freeing the
    // rest) allocated the next batch's 96 KiB every other send, in a thread
    // arena that gives freed memory back (MADV_DONTNEED) and faults it in
    // anew.
    reclaim();
    if (!spares_.empty()) {  // batch_ was moved into the handoff
        batch_ = std::move(spares_.back());
        spares_.pop_back();
    }
    batch_.items.reserve(kBatch);
    if (opt_.stage) batch_.notes.reserve(kBatch);
}

// The reader stage over a whole batch, just before it goes: each record in
// order (the stage's address spaces follow every one), its note beside it.
// A batch at a time, the records' lines it reads can be asked for 4 records
// ahead, as the stages do: the records were read a round or two ago and are
// no longer in this core's caches. Spare time is judged once a batch. The
// batch was filled from the ordering queue's runs without reading a record
// (hand_run): here each one's size is noted for the stages (Handed::size),
// and the batch's bytes counted exactly.
void SessionReader::run_stage() {
    const bool spare = handoff_->queued_bytes() >= kSpareFrom;
    Handed* const items = batch_.items.data();
    const size_t n = batch_.items.size();
    batch_.notes.resize(n);
    RawRecord r;
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
        // Headers asked for 8 records ahead (the ordering queue did it when
        // it read them), each stack sample's lines 4 ahead.
        if (i + 8 < n) __builtin_prefetch(items[i + 8].rec);
        if (i + 4 < n) prefetch_stack_sample(items[i + 4], swap_);
        Handed& h = items[i];
        with_byte_order(swap_, [&](auto sw) { read_framed(h.rec, sw, r); });
        h.size = r.size;
        bytes += r.size;
        r.offset = chunks.origin(h.chunk, h.rec);
        r.chunk = h.chunk;
        const int ev = h.event >= 0 ? h.event : ids_.event_for(r, swap_);  // unknown events were never queued
        batch_.notes[i] = ev >= 0 ? opt_.stage->on_record(r, s_.events_[static_cast<size_t>(ev)], spare) : nullptr;
    }
    batch_bytes_ = bytes;
}

// The chunks of every batch the stages have finished go back.
void SessionReader::reclaim() {
    while (handoff_->take_done(back_)) {
        for (const Handed& h : back_.items) chunks.release(h.chunk);
        for (const void* note : back_.notes)
            if (note) opt_.stage->release(note);  // notes come only with a stage
        back_.clear();
        spares_.push_back(std::move(back_));
    }
}

// The stages still have up to kInFlightBytes of records to go through, and
// hand over trace events all the while: the reader does that idle work
// (formats them) until they are done, rather than leave all of it to the
// stages' thread. When there is none, it looks again every 100 us, and
// stops once the stages are done (or gave up).
void SessionReader::idle_until_stages_done() {
    if (!opt_.idle_work) return;
    using namespace std::chrono_literals;
    while (!handoff_->wait_idle_for((*opt_.idle_work)() ? 0us : 100us)) {
    }
}

}  // namespace gilscan
