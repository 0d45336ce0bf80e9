#include "gilscan/perfdata/session.h"

#include <algorithm>

#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/reader.h"

namespace gilscan {

namespace {
constexpr uint64_t PERF_EVENT_UPDATE__NAME = 2;
}  // namespace

Session::Session(const std::string& path) : file_(path) { open(); }

Session::Session(const std::string& name, Bytes memory) : file_(name, memory), tracefs_fallback_(false) { open(); }

Session::Session(const std::string& name, MappedFile::Stream stream, std::function<uint64_t()> flushed)
    : file_(name, MappedFile::Stream{stream.fd, [this](uint64_t idle) { stream_waiting(idle); }}),
      flushed_(std::move(flushed)), stream_waiting_(std::move(stream.waiting)) {
    // Only the 16-byte pipe header is held: a file's header (size 104)
    // would read as cut short, where it is the wrong kind of recording.
    const Bytes b = file_.bytes();
    const bool perf = b.size() >= 8 && (load<uint64_t>(b.data(), false) == PERF_MAGIC2 ||
                                        load<uint64_t>(b.data(), false) == PERF_MAGIC2_SWAPPED);
    const bool pipe = b.size() >= 16 && (load<uint64_t>(b.data() + 8, false) == PERF_PIPE_HEADER_SIZE ||
                                         load<uint64_t>(b.data() + 8, true) == PERF_PIPE_HEADER_SIZE);
    if (perf && !pipe) throw Error(name, 8, "not a pipe-mode recording (perf record -o -)");
    open();
}

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

// Called after each read that brought bytes (idle_ns 0) and after each
// wait that found none (MappedFile's poll, begun after the last call). perf
// had written every record up to flushed_before_wait_ to the stream before
// that wait began, and the wait found it empty: all of them are read, and
// no record up to there can still come. Those waiting to be ordered go to
// the sink now rather than at the next round's end.
void Session::stream_waiting(uint64_t idle_ns) {
    if (flushed_) {
        if (idle_ns > 0 && live_reader_ && flushed_before_wait_ > delivered_to_) {
            live_reader_->deliver_until(flushed_before_wait_);
            delivered_to_ = flushed_before_wait_;
        }
        flushed_before_wait_ = flushed_();
    }
    if (stream_waiting_) stream_waiting_(idle_ns);
}

void Session::warn(std::string w) { stats_.warnings.push_back(std::move(w)); }

void Session::add_event(const PerfEventAttr& attr, std::vector<uint64_t> ids) {
    EventInfo ev;
    ev.index = static_cast<int>(events_.size());
    ev.attr = attr;
    ev.layout = sample_layout(attr);
    if (!ids_.add_event(attr, ids))
        throw Error(path(), Error::no_offset,
                    "events place their sample id at different positions; perf cannot read this file either");
    stack_samples_ |= (attr.sample_type & PERF_SAMPLE_STACK_USER) != 0;
    events_.push_back(std::move(ev));
    // Sized here, not checked per sample (deliver). In pipe mode this runs on
    // the reader thread while the stages are idle (Session::run).
    sample_cache_.resize(events_.size());
    stats_.samples_by_event.resize(events_.size());
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
            idx = ids_.find(id);
            if (idx >= 0) break;
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
        renamed(ev);
    }
}

void Session::renamed(EventInfo& ev) {
    ++ev.generation;
    ev.kind = event_kind(ev.format, ev.name);
    ev.gil_kind = gil_probe_kind(ev.name);
}

std::string Session::clock() const {
    for (const auto& ev : events_)
        if (ev.attr.use_clockid()) return clock_name(ev.attr.clockid);
    if (features_.clock_data) return clock_name(static_cast<int32_t>(features_.clock_data->clockid));
    return "perf_clock";  // the kernel's local clock (sched_clock)
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
            const int ev = ids_.find(id);
            if (ev >= 0) {
                events_[static_cast<size_t>(ev)].name = std::string(c.fixed_string(c.left()));
                events_[static_cast<size_t>(ev)].name_known = true;
                renamed(events_[static_cast<size_t>(ev)]);
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

}  // namespace gilscan
