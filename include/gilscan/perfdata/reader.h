// The reader of Session::run: on its own thread for large recordings, it
// frames the data section's records (RecordStream), finds each one's event
// and time, orders them by FINISHED_ROUND (OrderedQueue) and hands them to
// the stages' thread in batches (Handoff). Internal to Session::run
// (delivery.cc); reader.cc is its loop.
//
//   SessionReader rd(session, begin, end, options);   // heap: cache lines of its own
//   rd.read_all(handoff);                              // on the reader thread, or inline
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/event_ids.h"
#include "gilscan/perfdata/handoff.h"
#include "gilscan/perfdata/ordering.h"
#include "gilscan/perfdata/record_stream.h"

namespace gilscan {

class Session;
class ReaderStage;
class EventSink;
struct MmapEvent;

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
inline int16_t handed_event(int ev) { return static_cast<int16_t>(ev >= 0 && ev <= INT16_MAX ? ev : -1); }
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

using BatchHandoff = Handoff<HandedBatch>;

// What the reader thread writes for every record, on cache lines of its
// own (heap, 128-aligned, its size a multiple of 128). As locals of run()
// these shared lines with the stages' stack, and every ++records took a
// line the stages' core had just written.
class alignas(128) SessionReader {
public:
    struct Options {
        bool threaded = true;                                       // else everything inline, on the caller's thread
        ReaderStage* stage = nullptr;                               // work on the records before they go
        const std::function<bool()>* idle_work = nullptr;           // done rather than wait for the stages
        const std::function<bool(const MmapEvent&)>* mmap_seen = nullptr;  // each MMAP as it is read
        EventSink* inline_sink = nullptr;                           // !threaded: where batches go at once
        bool live = false;  // a stream: each round goes to the stages at its end, not when a batch is full
    };
    SessionReader(Session& s, uint64_t begin, uint64_t end, size_t chunk_size, Options opt);

    // Every record to the handoff (threaded) or straight to the stages.
    // Threaded, an exception is kept in `error` for the stages' thread.
    void read_all(BatchHandoff& handoff);
    // Inline, from within a stream's read (Session::stream_waiting): the
    // records waiting to be ordered up to `limit` (a time), to the stages now.
    void deliver_until(uint64_t limit);

    ChunkTable chunks;  // before rs and q: they release chunks when destroyed
    RecordStream rs;
    OrderedQueue q;
    // Reader-side counts, merged with the stages' after both are done.
    uint64_t records = 0, unknown_ids = 0, malformed = 0, unknown_types = 0, first_malformed = 0;
    std::string malformed_reason;
    std::exception_ptr error;

private:
    void read_records();
    bool window_full();
    void user_record(const RawRecord& r);
    void note_mmap(const RawRecord& r, int ev);
    void hand(const RawRecord& rec);
    void hand_run(OrderedQueue::Run run);
    void send();
    void run_stage();
    void reclaim();
    void idle_until_stages_done();
    template <class Op>
    void queued(Op&& op) {
        auto to_batches = [this](OrderedQueue::Run run) { hand_run(run); };
        op(to_batches);
    }

    Session& s_;
    const uint64_t begin_, end_;
    const Options opt_;
    const bool swap_;
    BatchHandoff* handoff_ = nullptr;
    HandedBatch batch_, back_;
    std::vector<HandedBatch> spares_;  // finished batches' vectors, cleared (at most as many as were in flight)
    size_t batch_bytes_ = 0;
    // The session's EventIds, copied on the reader thread (see event_ids.h),
    // and again after each header record that may change them (pipe mode).
    EventIds ids_;
    bool stopped_ = false;  // the stages gave up (handoff aborted)
};

}  // namespace gilscan
