// gilscan::Error — the one exception for a malformed input file.
//
//   throw Error(path, offset, "attr section runs past the end of the file");
//   ...
//   catch (const gilscan::Error& e) { std::cerr << "gilscan: error: " << e.what(); }
//
// what() reads "FILE: reason (at byte N)". Per-sample trouble is never thrown:
// it is counted (see Warnings) and the analysis goes on.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gilscan {

class Error : public std::runtime_error {
public:
    static constexpr uint64_t no_offset = ~uint64_t{0};

    Error(const std::string& file, uint64_t offset, const std::string& reason)
        : std::runtime_error(format(file, offset, reason)), file_(file), offset_(offset) {}

    const std::string& file() const { return file_; }
    uint64_t offset() const { return offset_; }

private:
    static std::string format(const std::string& file, uint64_t offset, const std::string& reason) {
        std::string s = file.empty() ? reason : file + ": " + reason;
        if (offset != no_offset) s += " (at byte " + std::to_string(offset) + ")";
        return s;
    }
    std::string file_;
    uint64_t offset_;
};

}  // namespace gilscan
