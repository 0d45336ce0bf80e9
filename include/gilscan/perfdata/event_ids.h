// EventIds — which event (attr) a record belongs to, by the sample id it
// carries, and where its timestamp is.
//
//   EventIds ids;
//   ids.add_event(attr, {101, 102});        // the attr's index is ids.events() before the call
//   int ev = ids.event_for(record, swap);   // >= 0, or -2: an id no attr has, -1: no attrs
//   const uint8_t* t = ids.time_of(record, ev);   // nullptr: the record has no time
//
// Session keeps one for the stages; the reader thread keeps a copy of its
// own (delivery.cc), made on the reader thread, so that its lookups (one or
// two per record) read only memory the reader allocated. The session's
// tables are small heap blocks made on the main thread, whose neighbours may
// be anything the stages allocate and write for every record (a thread
// table, a comm string); one shared cache line would be a transfer between
// the cores per record (as the trace filter was: trace_writer.h).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gilscan/perfdata/record_stream.h"
#include "gilscan/perfdata/sample.h"

namespace gilscan {

class EventIds {
public:
    // The next event's index is events(). False (nothing added): the attr
    // places its id elsewhere than the events before it (perf cannot read
    // such a file either).
    bool add_event(const PerfEventAttr& attr, const std::vector<uint64_t>& ids);
    size_t events() const { return events_; }

    int event_for_id(uint64_t id) const {
        if (id == 0) return 0;  // records perf synthesizes itself carry id 0: perf maps them to the first event
        const uint64_t rel = id - dense_base_;
        if (rel < dense_.size()) {
            const int ev = dense_[static_cast<size_t>(rel)];
            if (ev >= 0) return ev;
        }
        auto it = by_id_.find(id);
        return it == by_id_.end() ? -2 : it->second;
    }
    int event_for(const RawRecord& r, bool swap) const {
        if (events_ == 1) return 0;
        if (events_ == 0) return -1;
        const bool sample = r.type == PERF_RECORD_SAMPLE;
        const int index = sample ? layout_.sample_index : layout_.trailer_index;
        if (index < 0) return 0;  // no id in the record: perf uses the first event
        if (r.body.size() < static_cast<uint64_t>(index + 1) * 8) return -2;
        const uint64_t pos = sample ? static_cast<uint64_t>(index) * 8 : r.body.size() - static_cast<uint64_t>(index) * 8;
        if (pos + 8 > r.body.size()) return -2;  // a trailer index of 0
        return event_for_id(load<uint64_t>(r.body.data() + pos, swap));
    }
    // The record's timestamp (8 bytes, the file's byte order), nullptr when it has none.
    const uint8_t* time_of(const RawRecord& r, int ev) const {
        const TimePos& w = when_[static_cast<size_t>(ev)];
        const size_t words = r.body.size() / 8;
        if (r.type == PERF_RECORD_SAMPLE) {
            if (w.sample_time_index >= 0 && static_cast<size_t>(w.sample_time_index) < words)
                return r.body.data() + w.sample_time_index * 8;
        } else if (w.trailer_time_index > 0 && static_cast<size_t>(w.trailer_words) <= words) {
            return r.body.data() + r.body.size() - w.trailer_time_index * 8;
        }
        return nullptr;
    }
    // event_for() and time_of() in one: the reader's lookup, once per record.
    // Samples, nearly every record, find their id and TIME at fixed words
    // (one test of the body's length for both); other records go the
    // general way.
    int event_and_time(const RawRecord& r, bool swap, const uint8_t*& time) const {
        if (r.type == PERF_RECORD_SAMPLE && events_ > 1 && layout_.sample_index >= 0) {
            const size_t words = r.body.size() / 8;
            const auto idx = static_cast<size_t>(layout_.sample_index);
            time = nullptr;
            if (words <= idx) return -2;
            const int ev = event_for_id(load<uint64_t>(r.body.data() + idx * 8, swap));
            if (ev < 0) return ev;
            const int tw = when_[static_cast<size_t>(ev)].sample_time_index;
            if (tw >= 0 && static_cast<size_t>(tw) < words) time = r.body.data() + static_cast<size_t>(tw) * 8;
            return ev;
        }
        const int ev = event_for(r, swap);
        time = ev >= 0 ? time_of(r, ev) : nullptr;
        return ev;
    }
    // An id's event (the map, not the dense table: for set-up code).
    int find(uint64_t id) const {
        auto it = by_id_.find(id);
        return it == by_id_.end() ? -1 : it->second;
    }

private:
    // Where a record of one event holds its timestamp.
    struct TimePos {
        int sample_time_index = -1;   // u64 index of TIME in a SAMPLE body, -1: none
        int trailer_time_index = -1;  // u64 index of TIME counted from the end of other records' bodies
        int trailer_words = 0;        // u64s in the sample_id_all trailer
    };
    void rebuild_dense();
    IdLayout layout_;
    std::vector<TimePos> when_;  // by event index
    size_t events_ = 0;          // when_.size(): tested per record, where size() divides by 12
    std::unordered_map<uint64_t, int> by_id_;
    // Sample ids of one recording are mostly a small dense range (the kernel
    // hands them out in sequence): looked up in a flat table, not the map.
    uint64_t dense_base_ = 0;
    std::vector<int32_t> dense_;  // id - dense_base_ -> event index, -1: not in the table
};

}  // namespace gilscan
