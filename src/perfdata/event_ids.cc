#include "gilscan/perfdata/event_ids.h"

#include <algorithm>
#include <bit>

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

bool EventIds::add_event(const PerfEventAttr& attr, const std::vector<uint64_t>& ids) {
    const IdLayout layout = id_layout(attr);
    if (when_.empty()) {
        layout_ = layout;
    } else if (layout.sample_index != layout_.sample_index || layout.trailer_index != layout_.trailer_index) {
        return false;
    }
    TimePos when;
    when.sample_time_index = sample_time_index(attr.sample_type);
    if (attr.sample_id_all() && (attr.sample_type & PERF_SAMPLE_TIME)) {
        // The trailer holds TID, TIME, ID, STREAM_ID, CPU, IDENTIFIER (those
        // selected), read from the end: TIME is itself plus what follows it.
        when.trailer_words = static_cast<int>(sample_id_trailer_size(attr.sample_type) / 8);
        when.trailer_time_index = 1 + std::popcount(attr.sample_type & (PERF_SAMPLE_ID | PERF_SAMPLE_STREAM_ID |
                                                                        PERF_SAMPLE_CPU | PERF_SAMPLE_IDENTIFIER));
    }
    const int ev = static_cast<int>(when_.size());
    when_.push_back(when);
    events_ = when_.size();
    for (uint64_t id : ids) by_id_[id] = ev;
    rebuild_dense();
    return true;
}

void EventIds::rebuild_dense() {
    dense_.clear();
    if (by_id_.empty()) return;
    uint64_t lo = ~uint64_t{0}, hi = 0;
    for (const auto& [id, ev] : by_id_) {
        lo = std::min(lo, id);
        hi = std::max(hi, id);
    }
    if (hi - lo >= (1u << 20)) return;  // scattered ids: the map alone
    dense_base_ = lo;
    dense_.assign(static_cast<size_t>(hi - lo + 1), -1);
    for (const auto& [id, ev] : by_id_) dense_[static_cast<size_t>(id - lo)] = ev;
}

}  // namespace gilscan
