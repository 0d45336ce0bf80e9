// walk — the floor for decoding speed: mmap a perf.data file and visit every
// record header of its data section (no decoding, no ordering). gilscan's
// target is to stay within 10x of this on the same file.
//
//   walk big.data      # prints the record count
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: walk FILE\n");
        return 2;
    }
    int fd = ::open(argv[1], O_RDONLY);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size < 104) return 1;
    const size_t size = static_cast<size_t>(st.st_size);
    auto* p = static_cast<const uint8_t*>(::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0));
    if (p == MAP_FAILED) return 1;
    ::madvise(const_cast<uint8_t*>(p), size, MADV_SEQUENTIAL);
    uint64_t hdr_size, off, len;
    std::memcpy(&hdr_size, p + 8, 8);
    if (hdr_size == 16) {  // pipe mode: to the end
        off = 16;
        len = size - 16;
    } else {
        std::memcpy(&off, p + 40, 8);
        std::memcpy(&len, p + 48, 8);
    }
    uint64_t records = 0, sum = 0;
    for (uint64_t pos = off; pos + 8 <= off + len && pos + 8 <= size;) {
        uint32_t type;
        uint16_t rsize;
        std::memcpy(&type, p + pos, 4);
        std::memcpy(&rsize, p + pos + 6, 2);
        if (rsize < 8) break;
        sum += type;
        ++records;
        pos += rsize;
        if (type == 66) {  // HEADER_TRACING_DATA: its payload follows outside header.size
            uint32_t extra;
            std::memcpy(&extra, p + pos - rsize + 8, 4);
            pos += extra;
        }
    }
    std::printf("%llu records (type sum %llu)\n", static_cast<unsigned long long>(records),
                static_cast<unsigned long long>(sum));
    return 0;
}
