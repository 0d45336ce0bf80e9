#include "gilscan/output_file.h"

#include <cerrno>
#include <cstring>
#include <unistd.h>

#include "gilscan/error.h"

namespace gilscan {

OutputFile::OutputFile(std::string path) : path_(std::move(path)), buf_(1u << 20) {
    if (path_ == "-") {
        stdout_ = true;
        f_ = stdout;
        return;
    }
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw Error(path_, Error::no_offset, std::string("cannot write: ") + std::strerror(errno));
}

OutputFile::~OutputFile() {
    if (stdout_) {
        flush_buffer();
        std::fflush(stdout);
        return;
    }
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
}

void OutputFile::flush_buffer() {
    if (used_ == 0) return;
    if (std::fwrite(buf_.data(), 1, used_, f_) != used_)
        throw Error(path_, Error::no_offset, std::string("write failed: ") + std::strerror(errno));
    used_ = 0;
}

void OutputFile::write(const char* data, size_t n) {
    written_ += n;
    if (n > buf_.size() - used_) {
        flush_buffer();
        if (n >= buf_.size()) {
            if (std::fwrite(data, 1, n, f_) != n)
                throw Error(path_, Error::no_offset, std::string("write failed: ") + std::strerror(errno));
            return;
        }
    }
    std::memcpy(buf_.data() + used_, data, n);
    used_ += n;
}

void OutputFile::commit() {
    flush_buffer();
    if (stdout_) {
        std::fflush(stdout);
        committed_ = true;
        return;
    }
    if (std::fclose(f_) != 0) {
        f_ = nullptr;
        throw Error(path_, Error::no_offset, std::string("write failed: ") + std::strerror(errno));
    }
    f_ = nullptr;
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
        throw Error(path_, Error::no_offset, std::string("cannot rename into place: ") + std::strerror(errno));
    committed_ = true;
}

}  // namespace gilscan
