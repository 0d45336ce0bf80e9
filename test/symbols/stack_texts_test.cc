// StackTexts: each distinct stack's text kept once, found by its whole key
// (not by hash alone), at an address that never moves, within a byte bound.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "gilscan/symbols/stack_texts.h"

using namespace gilscan;

TEST_CASE("StackTexts: a kept text is found by exactly its key") {
    StackTexts texts(1u << 20);
    const std::vector<uint64_t> a{7, 2, 0xffffffff81000130ull, 0xffffffff82265ec8ull, 0x7f0000001000ull};
    std::vector<uint64_t> b = a;
    b.back() += 1;  // one user pc different
    std::vector<uint64_t> c = a;
    c[1] = 1;  // the same words, split differently between kernel and user frames
    CHECK(texts.find(a, StackTexts::hash(a)) == nullptr);
    const std::string* ta = texts.add(a, StackTexts::hash(a), "[\"a\"]");
    REQUIRE(ta != nullptr);
    CHECK(*ta == "[\"a\"]");
    CHECK(texts.find(a, StackTexts::hash(a)) == ta);
    CHECK(texts.find(b, StackTexts::hash(b)) == nullptr);
    CHECK(texts.find(c, StackTexts::hash(c)) == nullptr);
    CHECK(StackTexts::hash(a) != StackTexts::hash(b));
    // A prefix is another key.
    const std::vector<uint64_t> prefix(a.begin(), a.end() - 1);
    CHECK(texts.find(prefix, StackTexts::hash(prefix)) == nullptr);
    CHECK(texts.size() == 1);
}

TEST_CASE("StackTexts: keys whose hashes collide are told apart by their words") {
    StackTexts texts(1u << 20);
    const uint64_t h = 42;  // every key filed under one hash
    std::vector<const std::string*> kept;
    for (uint64_t i = 0; i < 50; ++i) {
        const std::vector<uint64_t> key{1, 0, i};
        CHECK(texts.find(key, h) == nullptr);
        kept.push_back(texts.add(key, h, "[\"" + std::to_string(i) + "\"]"));
        REQUIRE(kept.back() != nullptr);
    }
    for (uint64_t i = 0; i < 50; ++i) {
        const std::vector<uint64_t> key{1, 0, i};
        const std::string* t = texts.find(key, h);
        CHECK(t == kept[i]);
        CHECK(*t == "[\"" + std::to_string(i) + "\"]");
    }
}

TEST_CASE("StackTexts: texts never move, short or long, however many follow") {
    StackTexts texts(64u << 20);
    std::vector<const std::string*> kept;
    std::vector<const char*> data;
    for (uint64_t i = 0; i < 20000; ++i) {
        const std::vector<uint64_t> key{i, 0};
        // Short texts live inside the entry (the small-string buffer).
        const std::string text = i % 3 ? std::to_string(i) : std::string(200, static_cast<char>('a' + i % 26));
        kept.push_back(texts.add(key, StackTexts::hash(key), text));
        REQUIRE(kept.back() != nullptr);
        data.push_back(kept.back()->data());
    }
    size_t same = 0;
    for (uint64_t i = 0; i < 20000; ++i) {
        const std::vector<uint64_t> key{i, 0};
        const std::string* t = texts.find(key, StackTexts::hash(key));
        same += t == kept[i] && t->data() == data[i] &&
                *t == (i % 3 ? std::to_string(i) : std::string(200, static_cast<char>('a' + i % 26)));
    }
    CHECK(same == 20000);
}

TEST_CASE("StackTexts: past its bound nothing more is kept, and what is kept stays") {
    StackTexts texts(64u << 10);
    const std::string text(1000, 'x');
    std::vector<const std::string*> kept;
    uint64_t i = 0;
    for (; i < 1000; ++i) {
        const std::vector<uint64_t> key{i, 0, i * 3};
        const std::string* t = texts.add(key, StackTexts::hash(key), text);
        if (!t) break;
        kept.push_back(t);
    }
    CHECK(i > 10);
    CHECK(i < 100);  // about 64 of 1 kB
    CHECK(texts.bytes() <= (64u << 10));
    CHECK(texts.refused() == 1);
    const std::vector<uint64_t> refused{i, 0, i * 3};
    CHECK(texts.find(refused, StackTexts::hash(refused)) == nullptr);
    const std::vector<uint64_t> first{0, 0, 0};
    CHECK(texts.find(first, StackTexts::hash(first)) == kept[0]);
    // A small text still fits where a large one did not; a lower bound keeps what is kept.
    const std::vector<uint64_t> small{5000, 0};
    CHECK(texts.add(small, StackTexts::hash(small), "[]") != nullptr);
    texts.set_max_bytes(0);
    const std::vector<uint64_t> more{5001, 0};
    CHECK(texts.add(more, StackTexts::hash(more), "[]") == nullptr);
    CHECK(texts.find(first, StackTexts::hash(first)) == kept[0]);
    CHECK(texts.find(small, StackTexts::hash(small)) != nullptr);
}
