// Text taken from a recording (comm names, paths, symbol names, the cmdline)
// is bytes, not always UTF-8: the kernel cuts a comm at 15 bytes, possibly
// inside a character, and a damaged file can hold anything. Every output
// gilscan writes is UTF-8: well-formed sequences are kept, and each maximal
// ill-formed subpart becomes U+FFFD (Unicode 15, §3.9, "U+FFFD Substitution
// of Maximal Subparts"), which is also what nlohmann/json's
// error_handler_t::replace writes, so the summary JSON and the trace agree.
//
//   Utf8Step st = utf8_step(p, n);   // st.len bytes: a character (st.ok) or one U+FFFD
//   std::string s = valid_utf8(comm);
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gilscan {

struct Utf8Step {
    size_t len;  // >= 1 for n >= 1
    bool ok;     // a well-formed character of len bytes; else len bytes to replace
};

// One step through s[0, n), n >= 1: an ASCII byte, a well-formed character,
// or the ill-formed subpart that one U+FFFD replaces.
inline Utf8Step utf8_step(const unsigned char* s, size_t n) {
    const unsigned c = s[0];
    if (c < 0x80) return {1, true};
    // The second byte's range excludes overlong forms (E0, F0), surrogates
    // (ED) and code points above U+10FFFF (F4); the others are 80..BF.
    unsigned lo = 0x80, hi = 0xBF;
    size_t len = 0;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    }
    if (len == 0) return {1, false};  // 80..C1, F5..FF: never a lead byte
    for (size_t k = 1; k < len; ++k) {
        if (k >= n) return {k, false};  // cut short by the end
        const unsigned b = s[k];
        if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) return {k, false};
    }
    return {len, true};
}

// s with each ill-formed subpart replaced by U+FFFD.
inline std::string valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    const auto* d = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size();) {
        const Utf8Step st = utf8_step(d + i, s.size() - i);
        if (st.ok) out.append(s.substr(i, st.len));
        else out.append("\xEF\xBF\xBD");
        i += st.len;
    }
    return out;
}

}  // namespace gilscan
