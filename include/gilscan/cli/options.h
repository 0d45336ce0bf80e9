// Numeric command-line values, checked whole: "2x", "", "-1", a value past
// the range or past 64 bits is a usage error naming the option, never a
// silently wrapped or truncated number.
//
//   unsigned jobs = cli_number<unsigned>("-j", text, 0, 256);   // throws UsageError
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gilscan {

class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

template <class T>
T cli_number(std::string_view option, std::string_view text, T min, T max) {
    uint64_t v = 0;
    const char* end = text.data() + text.size();
    auto r = std::from_chars(text.data(), end, v, 10);
    if (text.empty() || r.ec != std::errc() || r.ptr != end || v < static_cast<uint64_t>(min) ||
        v > static_cast<uint64_t>(max))
        throw UsageError(std::string(option) + " takes a whole number from " + std::to_string(min) + " to " +
                         std::to_string(max) + ", not '" + std::string(text) + "'");
    return static_cast<T>(v);
}

// Linux's PID_MAX_LIMIT: no pid or tid is larger.
inline constexpr int32_t kMaxPid = 4194304;

}  // namespace gilscan
