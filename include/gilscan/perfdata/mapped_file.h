// MappedFile — a read-only mmap of one input file.
//
//   MappedFile f("perf.data");          // throws gilscan::Error if it cannot be opened
//   Cursor c(f.bytes(), false, &f.path(), 0);   // header, attrs, features: zero-copy
//   size_t n = f.read(offset, buf, len);        // the data section: copied in chunks
//
// The header and feature sections are read in place through the mapping.
// The data section streams through read() (pread, or memcpy for bytes
// already in memory) into RecordStream's reusable chunks: see
// record_stream.h for why that beats faulting the mapping in.
#pragma once

#include <cstdint>
#include <string>

#include <sys/types.h>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

// A small text file read whole into text (a perf map; a procfs file, which
// reports size 0: read to the end). False when it cannot be opened (errno
// in err); failed: a read error part way.
bool read_small_file(const std::string& path, std::string& text, bool& failed, int& err);

// A file another program left for gilscan to read (a perf map, a jitdump),
// opened as perf does: O_NOFOLLOW (not through a symlink), O_NONBLOCK (a
// FIFO never hangs the run), then accepted only if it is a regular file of at
// most max_size bytes owned by root or by `owner` (the recording's user).
// -1 with the reason in *why otherwise (ENOENT: errno in *err, why empty).
int open_foreign_file(const std::string& path, uid_t owner, uint64_t max_size, std::string* why, int* err);

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

    // Copies up to n bytes at `offset` into dst; returns how many (fewer
    // only at the end of the file). Throws gilscan::Error on an I/O error.
    size_t read(uint64_t offset, uint8_t* dst, size_t n) const;

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    bool owned_ = true;
    int fd_ = -1;
};

}  // namespace gilscan
