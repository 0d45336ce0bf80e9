#include "gilscan/event_ids.h"

#include <algorithm>

namespace gilscan {

bool EventIds::add_event(IdLayout layout, TimePos when, const std::vector<uint64_t>& ids) {
    if (when_.empty()) {
        layout_ = layout;
    } else if (layout.sample_index != layout_.sample_index || layout.trailer_index != layout_.trailer_index) {
        return false;
    }
    const int ev = static_cast<int>(when_.size());
    when_.push_back(when);
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
