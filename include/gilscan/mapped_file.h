// MappedFile — a read-only mmap of one input file.
//
//   MappedFile f("perf.data");          // throws gilscan::Error if it cannot be opened
//   Cursor c(f.bytes(), false, &f.path(), 0);
//   f.release(0, consumed);             // drop pages already decoded (bounded RSS)
//
// The mapping is never copied; decoders hold spans into it. release() tells
// the kernel that a prefix will not be read again, so a multi-gigabyte capture
// does not stay resident while it streams past.
#pragma once

#include <cstdint>
#include <string>

#include "gilscan/cursor.h"

namespace gilscan {

class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    // Bytes already in memory (fuzzing, tests); not owned, never unmapped.
    MappedFile(const std::string& name, Bytes memory);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    Bytes bytes() const { return {data_, size_}; }
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }

    // Advise the kernel that [offset, offset+length) is done with.
    void release(uint64_t offset, uint64_t length) const;

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    bool owned_ = true;
};

}  // namespace gilscan
