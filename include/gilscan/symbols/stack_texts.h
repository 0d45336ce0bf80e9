// StackTexts — a classifier's sleep-stack texts, each distinct stack's kept
// once.
//
//   StackTexts texts(16u << 20);
//   // key: the layout, the number of kernel frames, the kernel addresses, the user pcs
//   const uint64_t h = StackTexts::hash(key);
//   if (const std::string* t = texts.find(key, h)) label.stack_shared = t;          // no naming, no copy
//   else if (const std::string* t = texts.add(key, h, built)) label.stack_shared = t;
//   else label.stack_json = built;                                                  // full: the label owns it
//
// Why: with --sleep-stacks a sleep's label carries its stack as JSON text,
// kilobytes a sleep (two thirds of a DWARF capture's trace), yet the same
// few stacks recur at nearly every sleep: a generated capture's 56,626
// stacks are 6 distinct texts, and a real program's GIL waits come from a
// handful of call paths. Built per sleep, each text cost a hash lookup and
// an append per frame, and at -j 2 it was copied three more times on its
// way to the trace (the reader's note to the thread's label, the label into
// the trace relay's block, the block into the output). Interned, a label
// holds a pointer: the text is built once per distinct stack, and the trace
// relay hands the pointer on (Span::stack_stable).
//
// A stack's text is a function of its key: user frames are named by
// (layout, pc) and kernel frames by address, each through a cache that keeps
// a name once made. So a found text is byte for byte what building it again
// would give.
//
// Texts never move and are never freed while the StackTexts lives (a deque
// of entries): a label's pointer stays valid until the classifier that made
// it is destroyed, which is after the trace is written. Memory is bounded:
// past max_bytes (keys and texts) add() keeps nothing and returns nullptr,
// and the caller's label owns its text as before.
//
// One thread's: a classifier's own, unsynchronised. Other threads read a
// text only through a label handed to them (a handoff's lock orders that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gilscan {

class StackTexts {
public:
    explicit StackTexts(size_t max_bytes) : max_bytes_(max_bytes) {}
    StackTexts(const StackTexts&) = delete;
    StackTexts& operator=(const StackTexts&) = delete;

    // A lower bound keeps what is kept: add() only refuses more.
    void set_max_bytes(size_t max_bytes) { max_bytes_ = max_bytes; }

    static uint64_t hash(std::span<const uint64_t> key);
    // The text kept for exactly this key (compared word by word, not by hash alone), or nullptr.
    const std::string* find(std::span<const uint64_t> key, uint64_t h) const;
    // Keeps `text` for `key` (not already kept) and returns where; nullptr
    // when that would pass max_bytes.
    const std::string* add(std::span<const uint64_t> key, uint64_t h, std::string_view text);

    size_t size() const { return entries_.size(); }
    size_t bytes() const { return bytes_; }
    uint64_t refused() const { return refused_; }  // add() calls turned away (full)

private:
    static constexpr uint32_t kNone = ~0u;
    struct Entry {
        std::vector<uint64_t> key;
        std::string text;
        uint32_t next = kNone;  // the next entry with the same hash
    };
    std::deque<Entry> entries_;                  // a deque: entries (and short texts in them) never move
    std::unordered_map<uint64_t, uint32_t> by_hash_;  // hash -> its first entry
    size_t bytes_ = 0;
    size_t max_bytes_;
    uint64_t refused_ = 0;
};

}  // namespace gilscan
