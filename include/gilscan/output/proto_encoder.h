// ProtoEncoder — protocol buffers' wire format, appended to a byte string:
// what the .pftrace writer (pftrace_writer.h) makes Perfetto's packets of.
// No schema, no generated code: a field is its number and wire type.
//
//   std::string buf;
//   ProtoEncoder e(buf);
//   e.varint(8, ts);                 // TracePacket.timestamp
//   size_t m = e.begin(11);          // TracePacket.track_event { ...
//   e.varint(9, 1);                  //   type: TYPE_SLICE_BEGIN
//   e.end(m);                        // }  (its length put in front, minimal)
//
// Wire types: 0 varint (int32/int64/uint*/bool/enum: a negative int32 or
// int64 is its 64-bit two's complement, ten bytes), 1 fixed64/double,
// 2 length-delimited (strings, bytes, nested messages, packed repeated
// fields). A nested message's length is not known until it ends: begin()
// leaves kLengthRoom bytes for it, end() writes the length's varint there
// and moves the body back over what the varint did not use, so the bytes
// are what any protobuf library writes (test/output/proto_encoder_test.cc
// checks them byte by byte).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gilscan {

class ProtoEncoder {
public:
    explicit ProtoEncoder(std::string& out) : out_(out) {}

    static constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2;
    // Room left for a nested message's length: four varint bytes, up to
    // 2^28 - 1 bytes of body (a longer one is moved forward at its end).
    static constexpr size_t kLengthRoom = 4;

    static size_t varint_size(uint64_t v) {
        size_t n = 1;
        while (v >= 0x80) {
            v >>= 7;
            ++n;
        }
        return n;
    }
    // The varint of v at p (room for 10 bytes); returns the end.
    static char* put_varint(char* p, uint64_t v) {
        while (v >= 0x80) {
            *p++ = static_cast<char>((v & 0x7f) | 0x80);
            v >>= 7;
        }
        *p++ = static_cast<char>(v);
        return p;
    }

    void raw_varint(uint64_t v) {
        char tmp[10];
        out_.append(tmp, static_cast<size_t>(put_varint(tmp, v) - tmp));
    }
    void tag(uint32_t field, int wire) { raw_varint((uint64_t{field} << 3) | static_cast<uint64_t>(wire)); }

    void varint(uint32_t field, uint64_t v) {
        tag(field, kVarint);
        raw_varint(v);
    }
    // int32 and int64 fields: a negative value as its 64-bit two's complement.
    void int64(uint32_t field, int64_t v) { varint(field, static_cast<uint64_t>(v)); }
    void boolean(uint32_t field, bool v) { varint(field, v ? 1 : 0); }
    void fixed64(uint32_t field, uint64_t v) {
        tag(field, kFixed64);
        char b[8];
        for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
        out_.append(b, 8);
    }
    void dbl(uint32_t field, double v) {
        uint64_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        fixed64(field, bits);
    }
    void bytes(uint32_t field, std::string_view s) {
        tag(field, kLengthDelimited);
        raw_varint(s.size());
        out_.append(s);
    }
    void string(uint32_t field, std::string_view s) { bytes(field, s); }

    // A nested message (or a packed field): its tag now, its length at end().
    size_t begin(uint32_t field) {
        tag(field, kLengthDelimited);
        const size_t at = out_.size();
        out_.append(kLengthRoom, '\0');
        return at;
    }
    void end(size_t at) {
        const size_t body = at + kLengthRoom;
        const size_t len = out_.size() - body;
        char tmp[10];
        const size_t n = static_cast<size_t>(put_varint(tmp, len) - tmp);
        if (n > kLengthRoom) out_.insert(body, n - kLengthRoom, '\0');
        std::memcpy(&out_[at], tmp, n);
        if (n < kLengthRoom) {
            std::memmove(&out_[at + n], &out_[body], len);
            out_.resize(out_.size() - (kLengthRoom - n));
        }
    }

    std::string& out() { return out_; }

private:
    std::string& out_;
};

}  // namespace gilscan
