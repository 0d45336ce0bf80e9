#include "gilscan/mapped_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gilscan {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
    // Files up to 256 MiB are mapped in one go (fewer page faults); larger
    // ones fault in as they stream past and are released behind the decoder.
    const int populate = size_ <= (256u << 20) ? MAP_POPULATE : 0;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | populate, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw Error(path, Error::no_offset, std::string("mmap: ") + std::strerror(e));
    ::madvise(p, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const uint8_t*>(p);
}

MappedFile::MappedFile(const std::string& name, Bytes memory)
    : path_(name), data_(memory.data()), size_(memory.size()), owned_(false) {
    if (size_ == 0) throw Error(name, Error::no_offset, "empty file, not a perf.data recording");
}

MappedFile::~MappedFile() {
    if (data_ && owned_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(uint64_t offset, uint64_t length) const {
    if (!owned_) return;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t begin = (offset + page - 1) / page * page;
    uint64_t end = std::min(offset + length, size_) / page * page;
    if (end > begin)
        ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace gilscan
