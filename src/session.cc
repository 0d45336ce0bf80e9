#include "gilscan/session.h"

#include <algorithm>
#include <bit>
#include <exception>
#include <thread>

#include <pthread.h>

#include "gilscan/handoff.h"

#include "gilscan/perf_abi.h"

namespace gilscan {

namespace {
constexpr uint64_t PERF_EVENT_UPDATE__NAME = 2;
}  // namespace

Session::Session(const std::string& path) : file_(path) { open(); }

Session::Session(const std::string& name, Bytes memory) : file_(name, memory), tracefs_fallback_(false) { open(); }

void Session::open() {
    const std::string& path = file_.path();
    header_ = read_file_header(file_.bytes(), path);
    if (header_.pipe) return;  // everything else arrives as records
    for (auto& ea : read_attrs(file_.bytes(), header_, path)) add_event(ea.attr, std::move(ea.ids));
    if (header_.data_size_was_zero)
        warn("the header's data size is 0 (perf was killed?): data read to the end of the file, "
             "header features unavailable");
    if (header_.truncated)
        warn("the file is shorter than its header says (data should end at byte " +
             std::to_string(header_.declared_data_end) + ", file has " + std::to_string(file_.size()) +
             "): decoding what is there; header features are lost");
    for (const auto& fs : read_feature_table(file_.bytes(), header_, path)) {
        Cursor c(file_.bytes().subspan(fs.section.offset, fs.section.size), header_.swap, &file_.path(),
                 fs.section.offset);
        try {
            parse_feature(features_, fs.feature, c);
        } catch (const Error& e) {
            warn(std::string("header feature ") + std::to_string(fs.feature) + " unreadable: " + e.what());
        }
    }
    if (!features_.tracing_data.empty()) set_tracing(features_.tracing_data, features_.tracing_data_offset);
    resolve_names_and_formats();
}

Session::~Session() = default;

void Session::warn(std::string w) { stats_.warnings.push_back(std::move(w)); }

void Session::add_event(const PerfEventAttr& attr, std::vector<uint64_t> ids) {
    EventInfo ev;
    ev.index = static_cast<int>(events_.size());
    ev.attr = attr;
    IdLayout l = id_layout(attr);
    if (!layout_set_) {
        layout_ = l;
        layout_set_ = true;
    } else if (l.sample_index != layout_.sample_index || l.trailer_index != layout_.trailer_index) {
        throw Error(path(), Error::no_offset,
                    "events place their sample id at different positions; perf cannot read this file either");
    }
    ev.sample_time_index = sample_time_index(attr.sample_type);
    if (attr.sample_id_all() && (attr.sample_type & PERF_SAMPLE_TIME))
        ev.trailer_words = static_cast<int>(sample_id_trailer_size(attr.sample_type) / 8),
        ev.trailer_time_index = 1 + std::popcount(attr.sample_type & (PERF_SAMPLE_ID | PERF_SAMPLE_STREAM_ID |
                                                                      PERF_SAMPLE_CPU | PERF_SAMPLE_IDENTIFIER));
    for (uint64_t id : ids) id_to_event_[id] = ev.index;
    events_.push_back(std::move(ev));
    rebuild_dense_ids();
}

void Session::rebuild_dense_ids() {
    dense_ids_.clear();
    if (id_to_event_.empty()) return;
    uint64_t lo = ~uint64_t{0}, hi = 0;
    for (const auto& [id, ev] : id_to_event_) {
        lo = std::min(lo, id);
        hi = std::max(hi, id);
    }
    if (hi - lo >= (1u << 20)) return;  // scattered ids: the map alone
    dense_base_ = lo;
    dense_ids_.assign(static_cast<size_t>(hi - lo + 1), -1);
    for (const auto& [id, ev] : id_to_event_) dense_ids_[static_cast<size_t>(id - lo)] = ev;
}

void Session::set_tracing(Bytes data, uint64_t offset) {
    try {
        tracing_ = parse_tracing_data(data, path(), offset);
        have_tracing_ = true;
        for (auto& w : tracing_.warnings) warn("tracing data: " + w);
    } catch (const Error& e) {
        warn(std::string("tracing data unreadable: ") + e.what());
    }
}

void Session::resolve_names_and_formats() {
    bool need_tracing = false;
    for (auto& ev : events_)
        if (ev.attr.type == PERF_TYPE_TRACEPOINT && !ev.format) need_tracing = true;
    if (need_tracing && !have_tracing_ && !header_.pipe && tracefs_fallback_) {
        std::vector<uint64_t> ids;
        for (auto& ev : events_)
            if (ev.attr.type == PERF_TYPE_TRACEPOINT) ids.push_back(ev.attr.config);
        tracing_ = tracing_data_from_tracefs(ids);
        have_tracing_ = true;
        warn("the recording carries no tracepoint formats; took " + std::to_string(tracing_.events.size()) +
             " of them from this machine's tracefs by id (wrong if recorded on another kernel)");
    }
    // EVENT_DESC names, matched by id (or by position when ids are absent).
    for (size_t i = 0; i < features_.event_desc.size(); ++i) {
        const EventDesc& d = features_.event_desc[i];
        int idx = -1;
        for (uint64_t id : d.ids) {
            auto it = id_to_event_.find(id);
            if (it != id_to_event_.end()) {
                idx = it->second;
                break;
            }
        }
        if (idx < 0 && d.ids.empty() && i < events_.size()) idx = static_cast<int>(i);
        if (idx >= 0 && !events_[idx].name_known) {
            events_[idx].name = d.name;
            events_[idx].name_known = true;
        }
    }
    for (auto& ev : events_) {
        if (ev.attr.type == PERF_TYPE_TRACEPOINT && !ev.format) ev.format = tracing_.by_id(ev.attr.config);
        if (!ev.name_known) {
            // Until EVENT_DESC or the formats arrive (pipe mode), a placeholder.
            if (ev.format) {
                ev.name = ev.format->full_name();
                ev.name_known = true;
            } else {
                ev.name = "type" + std::to_string(ev.attr.type) + ":config" + std::to_string(ev.attr.config);
            }
        }
    }
}

std::string Session::clock() const {
    for (const auto& ev : events_)
        if (ev.attr.use_clockid()) return clock_name(ev.attr.clockid);
    if (features_.clock_data) return clock_name(static_cast<int32_t>(features_.clock_data->clockid));
    return "perf_clock";  // the kernel's local clock (sched_clock)
}

int Session::event_for_id(uint64_t id) {
    if (id == 0) return 0;  // records perf synthesizes itself carry id 0: perf maps them to the first event
    const uint64_t rel = id - dense_base_;
    if (rel < dense_ids_.size()) {
        int ev = dense_ids_[static_cast<size_t>(rel)];
        if (ev >= 0) return ev;
    }
    auto it = id_to_event_.find(id);
    return it == id_to_event_.end() ? -2 : it->second;
}

int Session::event_for(const RawRecord& r) {
    if (events_.size() == 1) return 0;
    if (events_.empty()) return -1;
    const bool sample = r.type == PERF_RECORD_SAMPLE;
    int index = sample ? layout_.sample_index : layout_.trailer_index;
    if (index < 0) return 0;  // no id in the record: perf uses the first event
    uint64_t pos = sample ? static_cast<uint64_t>(index) * 8 : r.body.size() - static_cast<uint64_t>(index) * 8;
    if (r.body.size() < static_cast<uint64_t>(index + 1) * 8 || pos + 8 > r.body.size()) return -2;
    return event_for_id(load<uint64_t>(r.body.data() + pos, header_.swap));
}

void Session::handle_user_record(const RawRecord& r) {
    Cursor c(r.body, header_.swap, &file_.path(), r.offset + 8);
    switch (r.type) {
    case PERF_RECORD_HEADER_ATTR: {
        PerfEventAttr attr = read_perf_event_attr(c);
        std::vector<uint64_t> ids;
        while (c.left() >= 8) ids.push_back(c.read<uint64_t>());
        add_event(attr, std::move(ids));
        resolve_names_and_formats();
        break;
    }
    case PERF_RECORD_HEADER_TRACING_DATA:
        set_tracing(r.extra, r.offset + r.size);
        for (auto& ev : events_) ev.format = nullptr;
        resolve_names_and_formats();
        break;
    case PERF_RECORD_HEADER_FEATURE: {
        uint64_t feat = c.read<uint64_t>();
        if (feat < HEADER_FEAT_BITS) parse_feature(features_, static_cast<unsigned>(feat), c);
        if (feat == HEADER_EVENT_DESC) resolve_names_and_formats();
        break;
    }
    case PERF_RECORD_EVENT_UPDATE: {
        uint64_t type = c.read<uint64_t>();
        uint64_t id = c.read<uint64_t>();
        if (type == PERF_EVENT_UPDATE__NAME) {
            auto it = id_to_event_.find(id);
            if (it != id_to_event_.end()) {
                events_[static_cast<size_t>(it->second)].name = std::string(c.fixed_string(c.left()));
                events_[it->second].name_known = true;
            }
        }
        break;
    }
    case PERF_RECORD_HEADER_BUILD_ID: {
        // Same layout as a HEADER_BUILD_ID feature entry, header included.
        Bytes whole(r.body.data() - 8, r.size);
        parse_feature(features_, HEADER_BUILD_ID, Cursor(whole, header_.swap, &file_.path(), r.offset));
        break;
    }
    default: break;  // FINISHED_INIT, ID_INDEX, THREAD_MAP, CPU_MAP, TIME_CONV, STAT*, AUXTRACE*: not needed
    }
}

namespace {

// One record on its way from the reader thread to the stages: a pointer into
// a chunk the reader keeps alive until the batch comes back.
struct Handed {
    const uint8_t* rec;
    uint64_t offset;
    uint32_t chunk;
    bool compressed;
};
// A batch goes over at 4096 records or 1 MiB of record bytes, whichever
// comes first, so at most 64 batches (64 MiB of chunks) are ever in flight,
// also when every record is an 8 KiB DWARF stack sample.
constexpr size_t kBatch = 4096;
constexpr size_t kBatchBytes = 1u << 20;
constexpr uint64_t kThreadedFrom = 4u << 20;  // data sections from 4 MiB get the reader thread

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
    ChunkTable chunks;
    RecordStream rs(file_, begin, end, header_.swap, chunks, chunk_size_);
    OrderedQueue q(chunks, 4u << 20, header_.swap);
    // Up to 64 batches in flight: the reader produces a whole round at each
    // FINISHED_ROUND and nothing while it reads the next one; the slack keeps
    // both threads busy through those bursts. Bounded in bytes too (kBatchBytes).
    Handoff<Handed> handoff(64);
    // Reader-side counts, merged with the stages' after both are done (the
    // stages write stats_ per record: sharing its cache lines would cost more
    // than the second thread gains).
    uint64_t reader_records = 0, reader_unknown_ids = 0;
    uint64_t reader_malformed = 0, reader_unknown_types = 0, reader_first_malformed = 0;
    std::string reader_malformed_reason;
    std::exception_ptr reader_error;

    // The stages' side: records of one batch to the sink.
    auto consume = [&](const std::vector<Handed>& batch) {
        RawRecord r;
        const size_t n = batch.size();
        for (size_t i = 0; i < n; ++i) {
            // The reader's core read these bytes last: ask for them early.
            if (i + 8 < n) {
                __builtin_prefetch(batch[i + 8].rec);
                __builtin_prefetch(batch[i + 8].rec + 64);
            }
            const Handed& h = batch[i];
            r.type = load<uint32_t>(h.rec, header_.swap);
            r.misc = load<uint16_t>(h.rec + 4, header_.swap);
            r.size = load<uint16_t>(h.rec + 6, header_.swap);
            r.body = Bytes(h.rec + PERF_EVENT_HEADER_SIZE, r.size - PERF_EVENT_HEADER_SIZE);
            r.offset = h.offset;
            r.compressed = h.compressed;
            r.chunk = h.chunk;
            deliver(r, sink);
        }
    };
    // Small recordings are read inline: a second thread would cost more than
    // it overlaps. Same code either way; only send() differs.
    const bool threaded = threaded_.value_or(end - begin >= kThreadedFrom);

    auto read_all = [&] {
        std::vector<Handed> batch, back;
        batch.reserve(kBatch);
        size_t batch_bytes = 0;
        bool stopped = false;
        auto send = [&] {
            if (batch.empty() || stopped) return;
            if (!threaded) {
                consume(batch);  // exceptions go straight to run()'s caller
                for (const Handed& h : batch) chunks.release(h.chunk);
                batch.clear();
                batch_bytes = 0;
                return;
            }
            if (!handoff.push(std::move(batch))) stopped = true;
            batch.clear();
            batch_bytes = 0;
            if (handoff.take_done(back)) {  // recycle the consumer's batches and their chunks
                for (const Handed& h : back) chunks.release(h.chunk);
                back.clear();
                batch.swap(back);
            }
            batch.reserve(kBatch);
        };
        auto hand = [&](const RawRecord& rec) {
            chunks.retain(rec.chunk);
            batch.push_back({rec.body.data() - PERF_EVENT_HEADER_SIZE, rec.offset, rec.chunk, rec.compressed});
            batch_bytes += rec.size;
            if (batch.size() >= kBatch || batch_bytes >= kBatchBytes) send();
        };
        try {
            uint64_t next_progress = begin;
            const uint64_t progress_step = std::max<uint64_t>((end - begin) / 100, 1u << 20);
            RawRecord r;
            while (!stopped && rs.next(r)) {
                if (progress_ && rs.position() >= next_progress) {
                    progress_(rs.position() - begin, end - begin);
                    next_progress = rs.position() + progress_step;
                }
                ++reader_records;
                if (r.type == PERF_RECORD_FINISHED_ROUND) {
                    q.finished_round(hand);
                    continue;
                }
                if (r.type >= PERF_RECORD_KERNEL_MAX) {
                    send();
                    if (threaded && !handoff.wait_idle()) break;  // the stages are idle: safe to change attrs and formats
                    try {
                        handle_user_record(r);
                    } catch (const Error& e) {
                        if (reader_malformed++ == 0) {
                            reader_first_malformed = r.offset;
                            reader_malformed_reason = e.what();
                        }
                    }
                    if (r.type > PERF_RECORD_COMPRESSED2) ++reader_unknown_types;
                    continue;
                }
                int ev = event_for(r);
                if (ev < 0) {
                    ++reader_unknown_ids;
                    continue;
                }
                // Timestamp: a sample's TIME field, else the sample_id_all trailer.
                const EventInfo& info = events_[static_cast<size_t>(ev)];
                const size_t words = r.body.size() / 8;
                const uint8_t* tp = nullptr;
                if (r.type == PERF_RECORD_SAMPLE) {
                    if (info.sample_time_index >= 0 && static_cast<size_t>(info.sample_time_index) < words)
                        tp = r.body.data() + info.sample_time_index * 8;
                } else if (info.trailer_time_index > 0 && static_cast<size_t>(info.trailer_words) <= words) {
                    tp = r.body.data() + r.body.size() - info.trailer_time_index * 8;
                }
                if (!tp) {
                    hand(r);  // as perf does for records without a time: delivered at once
                    continue;
                }
                q.push(load<uint64_t>(tp, header_.swap), r, hand);
            }
            q.flush_all(hand);
            send();
        } catch (...) {
            if (!threaded) throw;
            reader_error = std::current_exception();
        }
        handoff.close();
    };

    if (!threaded) {
        read_all();
    } else {
        std::thread reader([&] {
            pthread_setname_np(pthread_self(), "gilscan-read");
            read_all();
        });
        std::vector<Handed> batch;
        try {
            while (handoff.pop(batch)) {
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
    if (reader_error) std::rethrow_exception(reader_error);
    if (reader_malformed) {
        if (stats_.malformed == 0 || reader_first_malformed < stats_.first_malformed_offset) {
            stats_.first_malformed_offset = reader_first_malformed;
            stats_.first_malformed_reason = reader_malformed_reason;
        }
        stats_.malformed += reader_malformed;
    }
    stats_.unknown_types += reader_unknown_types;
    stats_.records += reader_records;
    stats_.unknown_ids += reader_unknown_ids;
    if (progress_) progress_(end - begin, end - begin);
    stats_.out_of_order = q.out_of_order();
    stats_.compressed_records = rs.compressed_records();
    for (const auto& w : rs.warnings()) warn(w);
    if (rs.stopped()) {
        stats_.truncated = true;
        warn(rs.stop_reason() + " at byte " + std::to_string(rs.stop_offset()) +
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
    if (stats_.lost_samples) warn(std::to_string(stats_.lost_samples) + " sample(s) dropped by the kernel (LOST_SAMPLES)");
}

void Session::deliver(const RawRecord& r, EventSink& sink) {
    const int event_index = event_for(r);
    if (event_index < 0) return;  // counted when it was read
    const EventInfo& ev = events_[static_cast<size_t>(event_index)];
    const bool swap = header_.swap;
    // A record that does not decode is counted and skipped; what the stages
    // throw (an output that cannot be written) ends the run: only the
    // decoding is guarded.
    auto decoded = [&](auto&& decode) {
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
    };
    switch (r.type) {
    case PERF_RECORD_SAMPLE: {
        // One Sample per attr, reused: the same fields are written every time.
        if (sample_cache_.size() <= static_cast<size_t>(event_index)) sample_cache_.resize(events_.size());
        Sample& s = sample_cache_[static_cast<size_t>(event_index)];
        if (!decoded([&] { parse_sample(Cursor(r.body, swap, &file_.path(), r.offset + 8), ev.attr, s); })) return;
        if (stats_.samples_by_event.size() <= static_cast<size_t>(event_index))
            stats_.samples_by_event.resize(events_.size());
        ++stats_.samples_by_event[static_cast<size_t>(event_index)];
        if (s.has_time) {
            if (!stats_.have_time || s.time < stats_.first_time) stats_.first_time = s.time;
            stats_.last_time = std::max(stats_.last_time, s.time);
            stats_.have_time = true;
        }
        sink.on_sample(s, ev);
        break;
    }
    case PERF_RECORD_COMM: {
        CommEvent e;
        if (!decoded([&] { decode_comm(r.body, r.misc, ev.attr, swap, e); })) return;
        sink.on_comm(e);
        break;
    }
    case PERF_RECORD_FORK:
    case PERF_RECORD_EXIT: {
        TaskEvent e;
        if (!decoded([&] { decode_task(r.body, ev.attr, swap, e); })) return;
        if (r.type == PERF_RECORD_FORK)
            sink.on_fork(e);
        else
            sink.on_exit(e);
        break;
    }
    case PERF_RECORD_MMAP:
    case PERF_RECORD_MMAP2: {
        MmapEvent e;
        if (!decoded([&] { decode_mmap(r.body, r.type, r.misc, ev.attr, swap, e); })) return;
        sink.on_mmap(e);
        break;
    }
    case PERF_RECORD_LOST:
    case PERF_RECORD_LOST_SAMPLES: {
        LostEvent e;
        if (!decoded([&] { decode_lost(r.body, r.type, ev.attr, swap, e); })) return;
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
