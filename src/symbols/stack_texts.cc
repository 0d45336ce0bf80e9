#include "gilscan/symbols/stack_texts.h"

#include <algorithm>

namespace gilscan {

uint64_t StackTexts::hash(std::span<const uint64_t> key) {
    // A multiply-xorshift per word (keys are a few dozen words: cheaper than
    // hashing the text, which is kilobytes). Collisions are harmless: find()
    // compares the whole key.
    uint64_t h = 0x9E3779B97F4A7C15ull ^ key.size();
    for (uint64_t w : key) {
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

const std::string* StackTexts::find(std::span<const uint64_t> key, uint64_t h) const {
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) return nullptr;
    for (uint32_t i = it->second; i != kNone; i = entries_[i].next) {
        const Entry& e = entries_[i];
        if (e.key.size() == key.size() && std::equal(key.begin(), key.end(), e.key.begin())) return &e.text;
    }
    return nullptr;
}

const std::string* StackTexts::add(std::span<const uint64_t> key, uint64_t h, std::string_view text) {
    // What an entry costs: its key, its text, and the bookkeeping around them.
    const size_t cost = key.size() * sizeof(uint64_t) + text.size() + sizeof(Entry) + 32;
    if (cost > max_bytes_ - std::min(bytes_, max_bytes_) || entries_.size() >= kNone) {
        ++refused_;
        return nullptr;
    }
    bytes_ += cost;
    Entry& e = entries_.emplace_back();
    e.key.assign(key.begin(), key.end());
    e.text.assign(text);
    const auto index = static_cast<uint32_t>(entries_.size() - 1);
    auto [it, fresh] = by_hash_.emplace(h, index);
    if (!fresh) {  // chained behind the hash's first entry
        e.next = entries_[it->second].next;
        entries_[it->second].next = index;
    }
    return &e.text;
}

}  // namespace gilscan
