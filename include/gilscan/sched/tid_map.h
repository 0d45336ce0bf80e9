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
#include <cstdlib>
#include <limits>
#include <new>
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

// PtrIdMap — tid/pid -> T* (never nullptr), for the lookups of every
// scheduler event and GIL probe: the timeline's and the GIL tracker's
// thread entries. Ids below 2^22 (PID_MAX_LIMIT on 64-bit Linux: every
// tid and pid a kernel hands out) are indexed directly, by pages of 256
// made as ids in them are first set; any other id goes to an IdMap. A
// lookup is a range test and two loads, where the hash table's was some
// 17 instructions (hash, probe, empty-table test). Pages are 2 KB: a
// thousand threads with tids scattered over the whole range (a server
// after some uptime) take at most 2 MB of pages; tids handed out together
// (one process's threads) share pages. The page index is 128 KB of
// calloc'd pointers, touched only where ids are.
//
//   PtrIdMap<Thread> m;
//   m.set(tid, &th);
//   if (Thread* const* p = m.find(tid)) (*p)->...;
template <class T>
class PtrIdMap {
public:
    PtrIdMap() : pages_(static_cast<Page*>(std::calloc(kPages, sizeof(Page)))) {
        if (!pages_) throw std::bad_alloc();
    }
    ~PtrIdMap() {
        for (size_t i = 0; i < kPages; ++i) delete[] pages_[i];
        std::free(pages_);
    }
    PtrIdMap(const PtrIdMap&) = delete;
    PtrIdMap& operator=(const PtrIdMap&) = delete;

    T* const* find(int64_t key) const {
        const uint64_t k = static_cast<uint64_t>(key);
        if (k < kDirect) [[likely]] {
            const Page page = pages_[k >> kPageBits];
            if (!page) return nullptr;
            T* const* v = &page[k & kPageMask];
            return *v ? v : nullptr;
        }
        return rest_.find(key);
    }
    void set(int64_t key, T* value) {  // value: not nullptr
        const uint64_t k = static_cast<uint64_t>(key);
        if (k >= kDirect) return rest_.set(key, value);
        Page& page = pages_[k >> kPageBits];
        if (!page) page = new T*[kPageSize]();
        T*& v = page[k & kPageMask];
        direct_ += v == nullptr;
        v = value;
    }
    void erase(int64_t key) {
        const uint64_t k = static_cast<uint64_t>(key);
        if (k >= kDirect) return rest_.erase(key);
        if (Page page = pages_[k >> kPageBits]) {
            T*& v = page[k & kPageMask];
            direct_ -= v != nullptr;
            v = nullptr;
        }
    }
    size_t size() const { return direct_ + rest_.size(); }
    // Calls f(key, value) for every entry: direct ids in order, then the rest.
    template <class F>
    void for_each(F&& f) const {
        for (size_t i = 0; i < kPages; ++i)
            if (const Page page = pages_[i])
                for (size_t j = 0; j < kPageSize; ++j)
                    if (page[j]) f(static_cast<int64_t>(i << kPageBits | j), page[j]);
        rest_.for_each(f);
    }

private:
    static constexpr unsigned kPageBits = 8;
    static constexpr uint64_t kPageSize = uint64_t{1} << kPageBits, kPageMask = kPageSize - 1;
    static constexpr uint64_t kDirect = uint64_t{1} << 22;  // PID_MAX_LIMIT
    static constexpr size_t kPages = kDirect >> kPageBits;
    using Page = T**;
    Page* pages_;
    size_t direct_ = 0;
    IdMap<T*> rest_;  // negative ids and ids from 2^22 on (a corrupt file's, or a kernel with a larger limit)
};

}  // namespace gilscan
