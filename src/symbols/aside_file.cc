#include "gilscan/symbols/aside_file.h"

#include <cerrno>
#include <cstdlib>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gilscan {

AsideFile::AsideFile(const std::string& dir, const std::string& name)
    : tmp_(dir + "/." + name + ".XXXXXX"), path_(dir + "/" + name) {
    fd_ = ::mkostemp(tmp_.data(), O_CLOEXEC);
    // 0600: kernel addresses are what kptr_restrict hides from other users,
    // and the names of a user's binaries are the user's.
    ok_ = fd_ >= 0 && ::fchmod(fd_, 0600) == 0;
}

AsideFile::~AsideFile() {
    if (fd_ >= 0) ::close(fd_);
    if (fd_ >= 0 && !committed_) ::unlink(tmp_.c_str());
}

bool AsideFile::write(std::string_view s) {
    for (size_t at = 0; ok_ && at < s.size();) {
        const ssize_t n = ::write(fd_, s.data() + at, s.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) ok_ = false;
        else at += static_cast<size_t>(n);
    }
    return ok_;
}

bool AsideFile::commit() {
    if (!ok_ || committed_) return false;
    const int fd = fd_;
    fd_ = -1;
    ok_ = ::close(fd) == 0 && ::rename(tmp_.c_str(), path_.c_str()) == 0;
    committed_ = ok_;
    if (!ok_) ::unlink(tmp_.c_str());
    return ok_;
}

}  // namespace gilscan
