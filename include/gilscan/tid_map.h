// IdMap — tid/pid/cpu -> value, the lookup every scheduler event does
// several times. TidMap is the common case: tid -> index.
//
//   TidMap m;
//   m.set(tid, index);
//   if (const uint32_t* i = m.find(tid)) ...;
//   m.erase(tid);
//   IdMap<uint64_t> last;   // e.g. cpu -> last event time
//
// Linux hands out ids below pid_max (at most 2^22): those are looked up in a
// flat table grown on demand (sizeof(V) bytes per id up to the largest seen);
// any other key (a corrupt or foreign recording) goes to a hash map. The
// largest V is the flat table's "no entry" mark and cannot be stored.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

namespace gilscan {

template <class V>
class IdMap {
public:
    static constexpr int64_t kFlatLimit = int64_t{1} << 22;  // PID_MAX_LIMIT on 64-bit kernels

    const V* find(int64_t key) const {
        if (key >= 0 && key < kFlatLimit) {
            const size_t k = static_cast<size_t>(key);
            return k < flat_.size() && flat_[k] != kNone ? &flat_[k] : nullptr;
        }
        auto it = other_.find(key);
        return it == other_.end() ? nullptr : &it->second;
    }
    void set(int64_t key, V value) {
        if (key >= 0 && key < kFlatLimit) {
            const size_t k = static_cast<size_t>(key);
            if (k >= flat_.size()) flat_.resize(std::max<size_t>(k + 1, flat_.size() * 2), kNone);
            if (flat_[k] == kNone) ++size_;
            flat_[k] = value;
            return;
        }
        if (other_.insert_or_assign(key, value).second) ++size_;
    }
    void erase(int64_t key) {
        if (key >= 0 && key < kFlatLimit) {
            const size_t k = static_cast<size_t>(key);
            if (k < flat_.size() && flat_[k] != kNone) {
                flat_[k] = kNone;
                --size_;
            }
            return;
        }
        size_ -= other_.erase(key);
    }
    size_t size() const { return size_; }
    // Calls f(key, value) for every entry (flat keys ascending, then the rest).
    template <class F>
    void for_each(F&& f) const {
        for (size_t k = 0; k < flat_.size(); ++k)
            if (flat_[k] != kNone) f(static_cast<int64_t>(k), flat_[k]);
        for (const auto& [k, v] : other_) f(k, v);
    }

private:
    static constexpr V kNone = std::numeric_limits<V>::max();
    std::vector<V> flat_;
    std::unordered_map<int64_t, V> other_;
    size_t size_ = 0;
};

using TidMap = IdMap<uint32_t>;

}  // namespace gilscan
