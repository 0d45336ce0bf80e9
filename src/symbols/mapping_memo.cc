#include "gilscan/symbols/mapping_memo.h"

namespace gilscan {

void MappingMemo::bind(const AddressSpace& space, ModuleCache& modules) {
    modules_ = &modules;
    if (space_ == &space && space_id_ == space.id && space_version_ == space.version) return;
    for (Entry& e : entries_) e.map = nullptr;  // the contents stay: see entry()
    last_ = nullptr;
    space_ = &space;
    space_id_ = space.id;
    space_version_ = space.version;
}

const MappingMemo::Entry& MappingMemo::entry(const Mapping& m) {
    for (Entry& e : entries_)
        if (e.map == &m) return e;
    for (Entry& e : entries_)
        if (e.used && e.start == m.start && e.pgoff == m.pgoff && e.path == m.path && e.build_id == m.build_id) {
            e.map = &m;
            return e;
        }
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    e.map = &m;
    e.used = true;
    e.start = m.start;
    e.pgoff = m.pgoff;
    e.path = m.path;
    e.build_id = m.build_id;
    e.mod = modules_->get(m);
    e.bias = e.mod ? e.mod->bias_for(m) : std::nullopt;
    return e;
}

}  // namespace gilscan
