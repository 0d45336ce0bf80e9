// walk — the floor for decoding speed: mmap a perf.data file and visit every
// record header of its data section (no decoding, no ordering). gilscan's
// target is to stay within 10x of this on the same file.
//
//   walk big.data           # prints the record count
//   walk --pread big.data   # the same walk over 4 MiB pread() buffers, as
//                           # gilscan reads the data section (compare the two)
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

struct Counts {
    uint64_t records = 0, sum = 0;
};

// Walks the headers in [p+pos, p+end); returns where the first incomplete one starts.
uint64_t walk(const uint8_t* p, uint64_t pos, uint64_t end, Counts& c) {
    while (pos + 8 <= end) {
        uint32_t type;
        uint16_t rsize;
        std::memcpy(&type, p + pos, 4);
        std::memcpy(&rsize, p + pos + 6, 2);
        if (rsize < 8 || pos + rsize > end) break;
        uint64_t next = pos + rsize;
        if (type == 66) {  // HEADER_TRACING_DATA: its payload follows outside header.size
            uint32_t extra;
            std::memcpy(&extra, p + pos + 8, 4);
            next += extra;
        }
        c.sum += type;
        ++c.records;
        pos = next;
    }
    return pos;
}

}  // namespace

int main(int argc, char** argv) {
    const bool use_pread = argc == 3 && std::strcmp(argv[1], "--pread") == 0;
    if (argc != 2 && !use_pread) {
        std::fprintf(stderr, "usage: walk [--pread] FILE\n");
        return 2;
    }
    int fd = ::open(argv[argc - 1], O_RDONLY);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size < 104) return 1;
    const size_t size = static_cast<size_t>(st.st_size);
    uint8_t head[104];
    if (::pread(fd, head, sizeof head, 0) != static_cast<ssize_t>(sizeof head)) return 1;
    uint64_t hdr_size, off, len;
    std::memcpy(&hdr_size, head + 8, 8);
    if (hdr_size == 16) {  // pipe mode: to the end
        off = 16;
        len = size - 16;
    } else {
        std::memcpy(&off, head + 40, 8);
        std::memcpy(&len, head + 48, 8);
    }
    const uint64_t end = std::min<uint64_t>(off + len, size);
    Counts c;
    if (use_pread) {
        // A record never straddles two buffers: each read starts at the first
        // header the previous buffer did not hold whole.
        std::vector<uint8_t> buf(4u << 20);
        for (uint64_t at = off; at < end;) {
            const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), end - at));
            ssize_t got = ::pread(fd, buf.data(), want, static_cast<off_t>(at));
            if (got <= 0) break;
            const uint64_t used = walk(buf.data(), 0, static_cast<uint64_t>(got), c);
            if (used == 0) break;  // a payload larger than the buffer: not in these captures
            at += used;
        }
    } else {
        auto* p = static_cast<const uint8_t*>(::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0));
        if (p == MAP_FAILED) return 1;
        ::madvise(const_cast<uint8_t*>(p), size, MADV_SEQUENTIAL);
        walk(p, off, end, c);
    }
    std::printf("%llu records (type sum %llu)\n", static_cast<unsigned long long>(c.records),
                static_cast<unsigned long long>(c.sum));
    return 0;
}
