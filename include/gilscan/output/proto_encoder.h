// ProtoEncoder — protocol buffers' wire format in a buffer of its own: what
// the .pftrace writer (pftrace_writer.h) makes Perfetto's packets of. No
// schema, no generated code: a field is its number and wire type.
//
//   ProtoEncoder e;
//   e.varint(8, ts);                 // TracePacket.timestamp
//   size_t m = e.begin(11);          // TracePacket.track_event { ...
//   e.varint(9, 1);                  //   type: TYPE_SLICE_BEGIN
//   e.end(m);                        // }  (its length put in front, minimal)
//   write(e.view());  e.clear();     // the bytes; the buffer kept for the next
//
// Wire types: 0 varint (int32/int64/uint*/bool/enum: a negative int32 or
// int64 is its 64-bit two's complement, ten bytes), 1 fixed64/double,
// 2 length-delimited (strings, bytes, nested messages, packed repeated
// fields). A nested message's length is not known until it ends: begin()
// leaves kLengthRoom bytes for it, end() writes the length's varint there
// and moves the body back over what the varint did not use, so the bytes
// are what any protobuf library writes (test/output/proto_encoder_test.cc
// checks them byte by byte). Every write reserves its worst case once and
// stores through a pointer: an event's dozen fields cost no appends.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gilscan {

class ProtoEncoder {
public:
    static constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2;
    // Room left for a nested message's length: four varint bytes, up to
    // 2^28 - 1 bytes of body (a longer one is moved forward at its end).
    static constexpr size_t kLengthRoom = 4;

    static size_t varint_size(uint64_t v) { return (static_cast<size_t>(std::bit_width(v | 1)) + 6) / 7; }
    // The varint of v at p (room for 10 bytes); returns the end.
    static char* put_varint(char* p, uint64_t v) {
        if (v < 0x80) [[likely]] {  // most fields: a small number, a key
            *p = static_cast<char>(v);
            return p + 1;
        }
        while (v >= 0x80) {
            *p++ = static_cast<char>((v & 0x7f) | 0x80);
            v >>= 7;
        }
        *p++ = static_cast<char>(v);
        return p;
    }
    static uint64_t key(uint32_t field, int wire) { return (uint64_t{field} << 3) | static_cast<uint64_t>(wire); }
    // The bytes of a varint field (its key and value): for a message whose
    // length is counted before it is written (no room left and moved back
    // at end()).
    static size_t varint_field_size(uint32_t field, uint64_t v) {
        return varint_size(key(field, kVarint)) + varint_size(v);
    }

    std::string_view view() const { return {buf_.data(), n_}; }
    size_t size() const { return n_; }
    void clear() { n_ = 0; }

    void raw_varint(uint64_t v) { n_ = static_cast<size_t>(put_varint(room(10), v) - buf_.data()); }
    void raw(std::string_view s) {
        std::memcpy(room(s.size()), s.data(), s.size());
        n_ += s.size();
    }
    void tag(uint32_t field, int wire) { raw_varint(key(field, wire)); }

    [[gnu::always_inline]] void varint(uint32_t field, uint64_t v) {
        char* p = put_varint(room(20), key(field, kVarint));
        n_ = static_cast<size_t>(put_varint(p, v) - buf_.data());
    }
    // int32 and int64 fields: a negative value as its 64-bit two's complement.
    void int64(uint32_t field, int64_t v) { varint(field, static_cast<uint64_t>(v)); }
    void boolean(uint32_t field, bool v) { varint(field, v ? 1 : 0); }
    void fixed64(uint32_t field, uint64_t v) {
        char* p = put_varint(room(18), key(field, kFixed64));
        for (int i = 0; i < 8; ++i) *p++ = static_cast<char>((v >> (8 * i)) & 0xff);
        n_ = static_cast<size_t>(p - buf_.data());
    }
    void dbl(uint32_t field, double v) {
        uint64_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        fixed64(field, bits);
    }
    void bytes(uint32_t field, std::string_view s) {
        char* p = put_varint(room(20 + s.size()), key(field, kLengthDelimited));
        p = put_varint(p, s.size());
        std::memcpy(p, s.data(), s.size());
        n_ = static_cast<size_t>(p - buf_.data()) + s.size();
    }
    void string(uint32_t field, std::string_view s) { bytes(field, s); }

    // A nested message (or a packed field): its tag now, its length at end().
    size_t begin(uint32_t field) {
        tag(field, kLengthDelimited);
        const size_t at = n_;
        std::memset(room(kLengthRoom), 0, kLengthRoom);
        n_ += kLengthRoom;
        return at;
    }
    void end(size_t at) {
        const size_t body = at + kLengthRoom;
        const size_t len = n_ - body;
        char tmp[10];
        const size_t k = static_cast<size_t>(put_varint(tmp, len) - tmp);
        if (k > kLengthRoom) {
            room(k - kLengthRoom);
            std::memmove(&buf_[body + (k - kLengthRoom)], &buf_[body], len);
            n_ += k - kLengthRoom;
        } else if (k < kLengthRoom) {
            std::memmove(&buf_[at + k], &buf_[body], len);
            n_ -= kLengthRoom - k;
        }
        std::memcpy(&buf_[at], tmp, k);
    }

    // At least k writable bytes at the end; the caller advances n_ itself
    // (through the writes above) or with advance().
    char* room(size_t k) {
        if (n_ + k > buf_.size()) [[unlikely]]
            grow(k);
        return buf_.data() + n_;
    }
    void advance(size_t k) { n_ += k; }

private:
    // Out of line: the writes above stay small enough to inline.
    [[gnu::noinline]] void grow(size_t k) { buf_.resize(std::max(2 * buf_.size(), n_ + k + 256)); }
    std::string buf_;
    size_t n_ = 0;
};

}  // namespace gilscan
