#include "gilscan/output_file.h"

#include <cerrno>
#include <cstring>
#include <vector>
#include <unistd.h>

#include <zlib.h>
#include <zstd.h>

#include "gilscan/error.h"

namespace gilscan {

struct OutputFile::Codec {
    bool gzip = false;
    z_stream z{};
    ZSTD_CCtx* zstd = nullptr;
    std::vector<char> out = std::vector<char>(1u << 20);
    ~Codec() {
        if (gzip) deflateEnd(&z);
        if (zstd) ZSTD_freeCCtx(zstd);
    }
};

OutputFile::OutputFile(std::string path) : path_(std::move(path)), buf_(1u << 20) {
    if (path_ == "-") {
        stdout_ = true;
        f_ = stdout;
        return;
    }
    if (path_.ends_with(".gz")) {
        codec_ = std::make_unique<Codec>();
        codec_->gzip = true;
        if (deflateInit2(&codec_->z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            throw Error(path_, Error::no_offset, "zlib initialisation failed");
    } else if (path_.ends_with(".zst")) {
        codec_ = std::make_unique<Codec>();
        codec_->zstd = ZSTD_createCCtx();
        ZSTD_CCtx_setParameter(codec_->zstd, ZSTD_c_compressionLevel, 3);
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

void OutputFile::sink(const char* data, size_t n, bool finish) {
    auto raw_write = [&](const char* p, size_t k) {
        if (k && std::fwrite(p, 1, k, f_) != k)
            throw Error(path_, Error::no_offset, std::string("write failed: ") + std::strerror(errno));
    };
    if (!codec_) {
        raw_write(data, n);
        return;
    }
    Codec& c = *codec_;
    if (c.gzip) {
        c.z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
        c.z.avail_in = static_cast<uInt>(n);
        int rc;
        do {
            c.z.next_out = reinterpret_cast<Bytef*>(c.out.data());
            c.z.avail_out = static_cast<uInt>(c.out.size());
            rc = deflate(&c.z, finish ? Z_FINISH : Z_NO_FLUSH);
            raw_write(c.out.data(), c.out.size() - c.z.avail_out);
        } while (c.z.avail_out == 0 || (finish && rc != Z_STREAM_END));
    } else {
        ZSTD_inBuffer in{data, n, 0};
        size_t left;
        do {
            ZSTD_outBuffer out{c.out.data(), c.out.size(), 0};
            left = ZSTD_compressStream2(c.zstd, &out, &in, finish ? ZSTD_e_end : ZSTD_e_continue);
            if (ZSTD_isError(left)) throw Error(path_, Error::no_offset, "zstd compression failed");
            raw_write(c.out.data(), out.pos);
        } while (finish ? left != 0 : in.pos < in.size);
    }
}

void OutputFile::flush_buffer() {
    if (used_ == 0) return;
    sink(buf_.data(), used_, false);
    used_ = 0;
}

void OutputFile::write(const char* data, size_t n) {
    written_ += n;
    if (n > buf_.size() - used_) {
        flush_buffer();
        if (n >= buf_.size()) {
            sink(data, n, false);
            return;
        }
    }
    std::memcpy(buf_.data() + used_, data, n);
    used_ += n;
}

void OutputFile::commit() {
    flush_buffer();
    if (codec_) sink(nullptr, 0, true);
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
