// A protobuf wire-format reader for the tests: a message's fields in order,
// each its number, wire type and value (a varint's number, a fixed64's
// bits, a length-delimited field's bytes). Throws on malformed input.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gilscan::test {

struct ProtoField {
    uint32_t number = 0;
    int wire = 0;
    uint64_t value = 0;     // varint, fixed64
    std::string_view bytes; // length-delimited
};

inline uint64_t read_varint(std::string_view s, size_t& i) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (i >= s.size()) throw std::runtime_error("varint past the end");
        const auto b = static_cast<uint8_t>(s[i++]);
        v |= uint64_t{b & 0x7fu} << shift;
        if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint longer than 10 bytes");
}

inline std::vector<ProtoField> proto_fields(std::string_view s) {
    std::vector<ProtoField> out;
    size_t i = 0;
    while (i < s.size()) {
        const uint64_t key = read_varint(s, i);
        ProtoField f;
        f.number = static_cast<uint32_t>(key >> 3);
        f.wire = static_cast<int>(key & 7);
        if (f.wire == 0) {
            f.value = read_varint(s, i);
        } else if (f.wire == 1) {
            if (s.size() - i < 8) throw std::runtime_error("fixed64 past the end");
            for (int k = 0; k < 8; ++k) f.value |= uint64_t{static_cast<uint8_t>(s[i + k])} << (8 * k);
            i += 8;
        } else if (f.wire == 2) {
            const uint64_t n = read_varint(s, i);
            if (n > s.size() - i) throw std::runtime_error("length past the end");
            f.bytes = s.substr(i, n);
            i += n;
        } else {
            throw std::runtime_error("wire type " + std::to_string(f.wire));
        }
        out.push_back(f);
    }
    return out;
}

// The fields numbered n, in order.
inline std::vector<ProtoField> fields_of(std::string_view s, uint32_t n) {
    std::vector<ProtoField> out;
    for (const ProtoField& f : proto_fields(s))
        if (f.number == n) out.push_back(f);
    return out;
}

// A packed repeated field's varints.
inline std::vector<uint64_t> packed_varints(std::string_view s) {
    std::vector<uint64_t> out;
    size_t i = 0;
    while (i < s.size()) out.push_back(read_varint(s, i));
    return out;
}

}  // namespace gilscan::test
