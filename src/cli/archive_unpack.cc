// gilscan batch's .zst archives (unpack_zstd_archive, batch.h): unpacked
// into a file with no name, bounded by --max-unpacked and the disk's free space.
#include "gilscan/cli/batch.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zstd.h>

#include "gilscan/error.h"
#include "gilscan/output/temp_files.h"

namespace gilscan {

namespace {

// How far an archive may unpack: --max-unpacked, and the free space of
// the directory it unpacks into less a reserve (a tenth of that filesystem,
// at most 1 GiB), so that a decompression bomb, or many archives unpacked at
// once, cannot fill the disk.
uint64_t free_beyond_reserve(const std::string& dir) {
    struct statvfs v {};
    if (::statvfs(dir.c_str(), &v) != 0) return UINT64_MAX;  // unknown: --max-unpacked alone bounds it
    const uint64_t total = uint64_t{v.f_blocks} * v.f_frsize, avail = uint64_t{v.f_bavail} * v.f_frsize;
    const uint64_t reserve = std::min<uint64_t>(total / 10, 1ull << 30);
    return avail > reserve ? avail - reserve : 0;
}

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

void write_all(int fd, const char* p, size_t n, const std::string& in) {
    while (n) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error(in, Error::no_offset, std::string("cannot unpack: write failed: ") + std::strerror(errno));
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// A file with no name under dir (O_TMPFILE; else a random exclusive name
// unlinked at once): nothing of it outlives the process.
int nameless_file(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
    std::string name;
    fd = create_named_temporary(dir, "gilscan-unpacked", O_RDWR, 0600, &name);
    if (fd >= 0) remove_temporary(name);
    return fd;
}

}  // namespace

// Unpacked into a nameless file, read by the caller as /proc/self/fd/N; a
// copy cut short, or one past the bound, is an error, never analysed as if
// whole.
int unpack_zstd_archive(const std::string& in, const std::string& dir, uint64_t max_bytes) {
    // O_NONBLOCK, then regular files only: a FIFO's open() would wait for a
    // writer for ever.
    const int src = ::open(in.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (src < 0) throw Error(in, Error::no_offset, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(src, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(src);
        throw Error(in, Error::no_offset, "not a regular file");
    }
    const int dst = nameless_file(dir);
    if (dst < 0) {
        const int e = errno;
        ::close(src);
        throw Error(in, Error::no_offset, "cannot create a temporary file in " + dir + ": " + std::strerror(e));
    }
    ZSTD_DCtx* d = ZSTD_createDCtx();
    struct Closer {
        int src;
        ZSTD_DCtx* d;
        ~Closer() {
            ::close(src);
            ZSTD_freeDCtx(d);
        }
    } closer{src, d};
    try {
        std::vector<char> ibuf(ZSTD_DStreamInSize()), obuf(ZSTD_DStreamOutSize());
        uint64_t limit = std::min(max_bytes, free_beyond_reserve(dir)), written = 0, checked_at = 0;
        auto too_large = [&] {
            return Error(in, Error::no_offset,
                         "unpacks to more than " + mib(limit) + " (--max-unpacked " + mib(max_bytes) +
                             ", and the free space of " + dir + " less a reserve); not analysed");
        };
        size_t last = 0;
        bool any = false, first = true;
        for (;;) {
            const ssize_t got = ::read(src, ibuf.data(), ibuf.size());
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) throw Error(in, Error::no_offset, std::string("read: ") + std::strerror(errno));
            if (got == 0) break;
            any = true;
            if (first) {  // a frame that states its size is refused before any byte is written
                const unsigned long long size = ZSTD_getFrameContentSize(ibuf.data(), static_cast<size_t>(got));
                if (size != ZSTD_CONTENTSIZE_UNKNOWN && size != ZSTD_CONTENTSIZE_ERROR && size > limit) throw too_large();
                first = false;
            }
            ZSTD_inBuffer ib{ibuf.data(), static_cast<size_t>(got), 0};
            while (ib.pos < ib.size) {
                ZSTD_outBuffer ob{obuf.data(), obuf.size(), 0};
                last = ZSTD_decompressStream(d, &ob, &ib);
                if (ZSTD_isError(last))
                    throw Error(in, Error::no_offset, std::string("not a zstd archive: ") + ZSTD_getErrorName(last));
                if (ob.pos > limit - written) throw too_large();
                write_all(dst, obuf.data(), ob.pos, in);
                written += ob.pos;
                if (written - checked_at >= (64u << 20)) {  // other unpackers share the disk
                    checked_at = written;
                    limit = std::min(limit, written + free_beyond_reserve(dir));
                }
            }
        }
        if (!any) throw Error(in, Error::no_offset, "empty file");
        if (last != 0) throw Error(in, Error::no_offset, "zstd archive is cut short");
    } catch (...) {
        ::close(dst);
        throw;
    }
    return dst;
}

}  // namespace gilscan
