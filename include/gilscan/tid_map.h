// TidMap — tid/pid/cpu -> index, the lookup every scheduler event does
// several times.
//
//   TidMap m;
//   m.set(tid, index);
//   if (const uint32_t* i = m.find(tid)) ...;
//   m.erase(tid);
//
// Linux hands out ids below pid_max (at most 2^22): those are looked up in a
// flat table grown on demand (4 bytes per id up to the largest seen); any
// other key (a corrupt or foreign recording) goes to a hash map.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace gilscan {

class TidMap {
public:
    static constexpr int64_t kFlatLimit = int64_t{1} << 22;  // PID_MAX_LIMIT on 64-bit kernels

    const uint32_t* find(int64_t key) const {
        if (key >= 0 && key < kFlatLimit) {
            const size_t k = static_cast<size_t>(key);
            return k < flat_.size() && flat_[k] != kNone ? &flat_[k] : nullptr;
        }
        auto it = other_.find(key);
        return it == other_.end() ? nullptr : &it->second;
    }
    void set(int64_t key, uint32_t value) {
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
    static constexpr uint32_t kNone = ~0u;
    std::vector<uint32_t> flat_;
    std::unordered_map<int64_t, uint32_t> other_;
    size_t size_ = 0;
};

}  // namespace gilscan
