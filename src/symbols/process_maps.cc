#include "gilscan/symbols/process_maps.h"

#include "gilscan/symbols/kernel_symbols.h"

namespace gilscan {

const Mapping* AddressSpace::find(uint64_t addr) const {
    auto it = maps.upper_bound(addr);
    if (it == maps.begin()) return nullptr;
    --it;
    return addr < it->second.end ? &it->second : nullptr;
}

AddressSpace& ProcessMaps::fresh(int32_t pid) {
    auto s = std::make_shared<AddressSpace>();
    s->pid = pid;
    s->id = next_id_++;
    spaces_[pid] = s;
    return *s;
}

std::shared_ptr<const AddressSpace> ProcessMaps::snapshot(int32_t pid) const {
    auto it = spaces_.find(pid);
    return it == spaces_.end() ? nullptr : it->second;
}

AddressSpace& ProcessMaps::writable(std::shared_ptr<AddressSpace>& sp) {
    if (sp.use_count() > 1) sp = std::make_shared<AddressSpace>(*sp);  // a snapshot is out: copy
    return *sp;
}

const AddressSpace* ProcessMaps::space(int32_t pid) const {
    auto it = spaces_.find(pid);
    return it == spaces_.end() ? nullptr : it->second.get();
}

void ProcessMaps::on_mmap(const MmapEvent& e) {
    if (e.pid <= 0 || e.len == 0) {  // pid -1: the kernel's own maps
        if (kernel_log_) kernel_log_->add(e);
        return;
    }
    auto it = spaces_.find(e.pid);
    AddressSpace& as = it == spaces_.end() ? fresh(e.pid) : writable(it->second);
    Mapping m;
    m.start = e.start;
    m.end = e.start + e.len;
    m.pgoff = e.pgoff;
    m.path = std::string(e.filename);
    m.ino = e.ino;
    m.exec = e.executable;
    m.build_id = to_hex(Bytes(e.build_id, e.build_id_size));
    // A new mapping replaces whatever overlapped it (mmap MAP_FIXED semantics).
    auto lo = as.maps.lower_bound(m.start);
    if (lo != as.maps.begin()) {
        auto prev = std::prev(lo);
        if (prev->second.end > m.start) {
            Mapping tail = prev->second;
            prev->second.end = m.start;
            if (tail.end > m.end) {  // split: keep the part after the new mapping
                tail.pgoff += m.end - tail.start;
                tail.start = m.end;
                as.maps[tail.start] = tail;
            }
        }
    }
    for (auto cur = as.maps.lower_bound(m.start); cur != as.maps.end() && cur->first < m.end;) {
        if (cur->second.end > m.end) {
            Mapping tail = cur->second;
            tail.pgoff += m.end - tail.start;
            tail.start = m.end;
            cur = as.maps.erase(cur);
            as.maps[tail.start] = tail;
            break;
        }
        cur = as.maps.erase(cur);
    }
    as.maps[m.start] = std::move(m);
    ++as.version;
    as.layout = layout_key(as);  // once per mapping, not per unwound sample
}

void ProcessMaps::on_comm(const CommEvent& e) {
    // Only the exec of the process (its thread-group leader replaces the image).
    if (e.exec && e.pid > 0) fresh(e.pid);
}

void ProcessMaps::on_fork(const TaskEvent& e) {
    if (e.pid <= 0 || e.pid == e.ppid) return;  // a thread: shares the space
    auto parent = spaces_.find(e.ppid);
    AddressSpace& child = fresh(e.pid);
    if (parent != spaces_.end()) {
        child.maps = parent->second->maps;
        child.version = 1;
        child.layout = parent->second->layout;
    }
}

uint64_t layout_key(const AddressSpace& as) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    for (const auto& [start, m] : as.maps) {
        if (!m.exec || m.path.empty() || m.path[0] != '/') continue;
        mix(m.start);
        mix(m.end);
        mix(m.pgoff);
        mix(std::hash<std::string>{}(m.path));
    }
    return h;
}

}  // namespace gilscan
