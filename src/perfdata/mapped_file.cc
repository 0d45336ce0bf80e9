#include "gilscan/perfdata/mapped_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gilscan {

bool read_small_file(const std::string& path, std::string& text, bool& failed, int& err) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        return false;
    }
    text.clear();
    failed = false;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) failed = true;
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return true;
}

int open_foreign_file(const std::string& path, uid_t owner, uint64_t max_size, std::string* why, int* err) {
    why->clear();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        *err = errno;
        if (errno == ELOOP) *why = path + ": not read: a symbolic link";
        return -1;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) *why = path + ": not read: " + std::strerror(errno);
    else if (!S_ISREG(st.st_mode)) *why = path + ": not read: not a regular file";
    else if (st.st_uid != 0 && st.st_uid != owner)
        *why = path + ": not read: owned by uid " + std::to_string(st.st_uid) + ", neither root nor the recording's user (uid " +
               std::to_string(owner) + ")";
    else if (static_cast<uint64_t>(st.st_size) > max_size)
        *why = path + ": not read: " + std::to_string(st.st_size) + " bytes, more than " + std::to_string(max_size);
    if (why->empty()) return fd;
    ::close(fd);
    *err = EPERM;
    return -1;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: a FIFO's open() would wait for a writer for ever; it is
    // refused below as any file that is not regular (on a regular file the
    // flag changes nothing).
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(path, Error::no_offset, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        throw Error(path, Error::no_offset, std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        throw Error(path, Error::no_offset, "is a directory");
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path, Error::no_offset,
                    "not a regular file (save a pipe-mode recording to a file first: "
                    "perf record -o - ... > f.data)");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ == 0) {
        ::close(fd);
        throw Error(path, Error::no_offset, "empty file, not a perf.data recording");
    }
    // Only the header and feature sections are touched through the mapping
    // (a few pages); the data section is read with pread() through fd_.
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (p == MAP_FAILED) {
        ::close(fd);
        throw Error(path, Error::no_offset, std::string("mmap: ") + std::strerror(e));
    }
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    data_ = static_cast<const uint8_t*>(p);
    mapped_ = size_;
    fd_ = fd;
}

MappedFile::MappedFile(const std::string& name, Stream stream)
    : path_(name), size_(kStreamSize), fd_(stream.fd), stream_(true) {
    // The pipe header (magic, size 16), read before `waiting` is set: its
    // owner is still being made.
    head_.resize(16);
    const size_t got = read_stream(0, head_.data(), head_.size(), head_.size());
    if (got == 0) throw Error(path_, Error::no_offset, "the stream ended before any data (perf record wrote nothing)");
    head_.resize(got);
    data_ = head_.data();
    mapped_ = head_.size();
    waiting_ = std::move(stream.waiting);
}

MappedFile::MappedFile(const std::string& name, Bytes memory)
    : path_(name), data_(memory.data()), size_(memory.size()), mapped_(memory.size()), owned_(false) {
    if (size_ == 0) throw Error(name, Error::no_offset, "empty file, not a perf.data recording");
}

MappedFile::~MappedFile() {
    if (data_ && owned_ && !stream_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
}

size_t MappedFile::read(uint64_t offset, uint8_t* dst, size_t n, size_t need) const {
    if (stream_) return read_stream(offset, dst, n, std::min(need, n));
    if (offset >= size_) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
    if (n == 0) return 0;  // dst may be an empty buffer's null pointer: no memcpy with it
    if (fd_ < 0) {
        std::memcpy(dst, data_ + offset, n);
        return n;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw Error(path_, offset + done, std::string("read: ") + std::strerror(errno));
        if (r == 0) break;  // the file shrank under us
        done += static_cast<size_t>(r);
    }
    return done;
}

// Front to back: bytes before `offset` that were never asked for are read
// and dropped (a payload the reader skips); going back is a caller's bug.
size_t MappedFile::read_stream(uint64_t offset, uint8_t* dst, size_t n, size_t need) const {
    if (offset < stream_pos_)
        throw Error(path_, offset, "a stream cannot be read again behind byte " + std::to_string(stream_pos_));
    uint8_t sink[4096];
    size_t done = 0;
    uint64_t idle = 0;
    for (;;) {
        const bool skipping = stream_pos_ < offset;
        // Enough: take what has already arrived without waiting for more.
        const bool enough = !skipping && done >= need;
        if (!skipping && done == n) return done;
        pollfd p{fd_, POLLIN, 0};
        const int ready = ::poll(&p, 1, enough ? 0 : 100);
        if (ready < 0 && errno != EINTR) throw Error(path_, stream_pos_, std::string("poll: ") + std::strerror(errno));
        if (ready <= 0) {
            if (enough) return done;
            idle += ready == 0 ? 100'000'000 : 0;
            if (waiting_) waiting_(idle);
            continue;
        }
        uint8_t* to = skipping ? sink : dst + done;
        const size_t want = skipping ? static_cast<size_t>(std::min<uint64_t>(sizeof sink, offset - stream_pos_)) : n - done;
        const ssize_t r = ::read(fd_, to, want);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) throw Error(path_, stream_pos_, std::string("read: ") + std::strerror(errno));
        if (r == 0) return done;  // the writer closed it: the end
        stream_pos_ += static_cast<uint64_t>(r);
        if (!skipping) done += static_cast<size_t>(r);
        idle = 0;
        if (waiting_) waiting_(0);
    }
}

}  // namespace gilscan
