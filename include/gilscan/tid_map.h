// IdMap — tid/pid/cpu -> value, the lookup every scheduler event does
// several times. The timeline and the GIL tracker map a tid to its entry
// itself (IdMap<Thread*>: entries live in a deque and never move); TidMap
// is tid -> index.
//
//   TidMap m;
//   m.set(tid, index);
//   if (const uint32_t* i = m.find(tid)) ...;
//   m.erase(tid);
//   IdMap<uint64_t> last;   // e.g. cpu -> last event time
//
// An open-addressing hash table (linear probing, at most half full, erase by
// backward shift: no tombstones). Its size follows the number of ids, not
// their values: a recording holds some thousands of threads, but on a
// machine with pid_max = 2^22 (systemd's default) their tids run into the
// millions, and a table indexed by tid would be megabytes per map with
// every lookup a cache miss. A thousand threads fit in 32 KB here.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace gilscan {

template <class V>
class IdMap {
public:
    const V* find(int64_t key) const {
        if (key == kEmpty) [[unlikely]]
            return has_min_ ? &min_value_ : nullptr;
        if (slots_.empty()) return nullptr;
        for (size_t i = home(key);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == key) return &s.value;
            if (s.key == kEmpty) return nullptr;
        }
    }
    void set(int64_t key, V value) {
        if (key == kEmpty) [[unlikely]] {
            size_ += !has_min_;
            has_min_ = true;
            min_value_ = value;
            return;
        }
        if ((used_ + 1) * 2 > slots_.size()) grow();
        for (size_t i = home(key);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (s.key == key) {
                s.value = value;
                return;
            }
            if (s.key == kEmpty) {
                s = {key, value};
                ++used_;
                ++size_;
                return;
            }
        }
    }
    void erase(int64_t key) {
        if (key == kEmpty) [[unlikely]] {
            size_ -= has_min_;
            has_min_ = false;
            return;
        }
        if (slots_.empty()) return;
        size_t i = home(key);
        for (;; i = (i + 1) & mask_) {
            if (slots_[i].key == key) break;
            if (slots_[i].key == kEmpty) return;
        }
        // Backward shift: move later members of the probe run into the hole
        // when their home does not lie cyclically in (hole, their slot].
        for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
            if (slots_[j].key == kEmpty) break;
            const size_t h = home(slots_[j].key);
            const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
            if (stays) continue;
            slots_[i] = slots_[j];
            i = j;
        }
        slots_[i].key = kEmpty;
        --used_;
        --size_;
    }
    size_t size() const { return size_; }
    // Calls f(key, value) for every entry, in no particular order.
    template <class F>
    void for_each(F&& f) const {
        if (has_min_) f(kEmpty, min_value_);
        for (const Slot& s : slots_)
            if (s.key != kEmpty) f(s.key, s.value);
    }

private:
    // No tid, pid or cpu is INT64_MIN (they are 32-bit): the empty mark. The
    // key itself still works, held aside.
    static constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();
    struct Slot {
        int64_t key;
        V value;
    };
    size_t home(int64_t key) const {
        // Fibonacci hashing: tids of one process are consecutive; the
        // multiply spreads them over the table's top bits.
        return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
    }
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        const size_t n = old.empty() ? 64 : old.size() * 2;
        slots_.assign(n, Slot{kEmpty, V{}});
        mask_ = n - 1;
        shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(n));
        used_ = 0;
        for (const Slot& s : old) {
            if (s.key == kEmpty) continue;
            size_t i = home(s.key);
            while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
            slots_[i] = s;
            ++used_;
        }
    }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
    unsigned shift_ = 64;
    size_t used_ = 0;  // occupied slots
    size_t size_ = 0;  // entries, the INT64_MIN key included
    bool has_min_ = false;
    V min_value_{};
};

using TidMap = IdMap<uint32_t>;

}  // namespace gilscan
