#include "gilscan/output/output_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <zlib.h>
#include <zstd.h>

#include "gilscan/error.h"
#include "gilscan/output/temp_files.h"

namespace gilscan {

namespace {
constexpr size_t kMaxQueued = 3;  // full buffers waiting for the writer: bounded memory
constexpr uint64_t kExtendStep = 64u << 20;  // ftruncate ahead of asynchronous writes

// glibc has no wrappers for the Linux AIO system calls (libaio is a library
// of its own); these are the raw calls.
long sys_io_setup(unsigned nr, aio_context_t* ctx) { return ::syscall(SYS_io_setup, nr, ctx); }
long sys_io_destroy(aio_context_t ctx) { return ::syscall(SYS_io_destroy, ctx); }
long sys_io_submit(aio_context_t ctx, long n, iocb** cbs) { return ::syscall(SYS_io_submit, ctx, n, cbs); }
long sys_io_getevents(aio_context_t ctx, long min_nr, long nr, io_event* ev) {
    return ::syscall(SYS_io_getevents, ctx, min_nr, nr, ev, nullptr);
}
}

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

void OutputFile::open_codec() {
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
}

OutputFile::OutputFile(std::string path, bool writer_thread) : path_(std::move(path)), buf_(kBufferSize) {
    if (path_ != "-") open_codec();  // by name, whether written in place or not
    struct stat st {};
    if (path_ == "-") {
        in_place_ = true;
        std::fflush(stdout);
        fd_ = STDOUT_FILENO;
    } else if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        // /dev/null, a FIFO, a terminal: written as it is. A temporary renamed
        // over it would replace the device node itself with a regular file
        // (as root, `-o /dev/null` did). No atomicity there, as for stdout.
        in_place_ = true;
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd_ < 0) throw Error(path_, Error::no_offset, std::string("cannot write: ") + std::strerror(errno));
        owns_fd_ = true;
    } else {
        open_temporary();
    }
    if (!writer_thread) {
        may_aio_ = direct_ && !codec_ && !in_place_;
        return;
    }
    writer_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "gilscan-write");
        writer_loop();
    });
}

OutputFile::~OutputFile() {
    if (in_place_ && !committed_) {
        // Whatever was produced goes out (there is no temporary to drop).
        try {
            hand_off();
        } catch (...) {
        }
    }
    stop_writer();
    if (aio_) {
        drain_async();  // the kernel may still be reading the buffers
        sys_io_destroy(aio_);
        aio_ = 0;
    }
    if (!in_place_) {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_ && !tmp_.empty()) remove_temporary(tmp_);
    } else if (owns_fd_ && fd_ >= 0) {
        ::close(fd_);
    }
}

namespace {
std::string directory_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}
std::string base_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

// The bytes go to a file with no name yet (O_TMPFILE) in the target's
// directory, so a run that dies leaves nothing there and no name can be
// planted in advance; commit() names it. A filesystem without O_TMPFILE gets
// an exclusive, random name (temp_files.h) that a signal removes.
void OutputFile::open_temporary() {
    const std::string dir = directory_of(path_);
    // Uncompressed traces are large and written once: O_DIRECT skips the
    // page cache copy (direct I/O mostly waits for the disk where a buffered
    // write costs CPU for as long as the analysis). Filesystems without it
    // (tmpfs) get a buffered file.
    if (!codec_) {
        fd_ = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC | O_DIRECT, 0666);
        direct_ = fd_ >= 0;
    }
    if (fd_ < 0) fd_ = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
        throw Error(path_, Error::no_offset, std::string("cannot write: ") + std::strerror(errno));
    if (!codec_) {
        fd_ = create_named_temporary(dir, base_of(path_), O_WRONLY | O_DIRECT, 0666, &tmp_);
        direct_ = fd_ >= 0;
    }
    if (fd_ < 0) fd_ = create_named_temporary(dir, base_of(path_), O_WRONLY, 0666, &tmp_);
    if (fd_ < 0) throw Error(path_, Error::no_offset, std::string("cannot write: ") + std::strerror(errno));
}

// Names the finished file (an unnamed one is linked to a random name first:
// linkat cannot replace a name) and renames it over the target, with
// SIGINT/SIGTERM/SIGHUP held so the steps complete or never start.
void OutputFile::place_temporary() {
    FatalSignalsHeld held;
    auto fail = [&](const std::string& what, int err) {
        if (!tmp_.empty()) remove_temporary(tmp_);
        tmp_.clear();
        throw Error(path_, Error::no_offset, what + ": " + std::strerror(err));
    };
    if (tmp_.empty()) {
        const std::string dir = directory_of(path_), base = base_of(path_);
        const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
        for (int attempt = 0; attempt < 16 && tmp_.empty(); ++attempt) {
            std::string name = dir + "/." + base + ".gilscan-" + random_hex();
            // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc's link does not.
            int r = ::linkat(fd_, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH);
            if (r != 0 && errno != EEXIST) r = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW);
            if (r == 0) {
                tmp_ = std::move(name);
                register_temporary(tmp_);  // for a signal that another thread takes
            } else if (errno != EEXIST) {
                fail("cannot name the finished file", errno);
            }
        }
        if (tmp_.empty()) fail("cannot name the finished file", EEXIST);
    }
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("write failed", errno);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename into place", errno);
    forget_temporary(tmp_);
}

void OutputFile::stop_writer() {
    if (!writer_.joinable()) return;
    {
        std::lock_guard<std::mutex> l(mu_);
        done_ = true;
        if (!committed_ && !in_place_) full_.clear();  // an abandoned file: nothing more to write
    }
    cv_.notify_all();
    writer_.join();
}

void OutputFile::rethrow_writer_error() {
    std::lock_guard<std::mutex> l(mu_);
    if (error_) std::rethrow_exception(error_);
}

void OutputFile::writer_loop() {
    for (;;) {
        ChunkBytes b;
        bool failed;
        {
            std::unique_lock<std::mutex> l(mu_);
            cv_.wait(l, [&] { return done_ || !full_.empty(); });
            if (full_.empty()) return;
            b = std::move(full_.front());
            full_.pop_front();
            busy_ = true;
            failed = static_cast<bool>(error_);
        }
        try {
            if (!failed) sink(reinterpret_cast<const char*>(b.data()), b.size(), false);
        } catch (...) {
            std::lock_guard<std::mutex> l(mu_);
            error_ = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> l(mu_);
            busy_ = false;
            b.clear();
            spare_.push_back(std::move(b));
        }
        cv_.notify_all();
    }
}

void OutputFile::hand_off() {
    fill_ = written_ >= kAsyncFrom ? kBufferSize : kBufferSize / 2;
    rethrow_writer_error();
    if (used_ == 0) return;
    // Direct I/O writes whole 4 KiB blocks from 4 KiB-aligned memory (the
    // buffers are 2 MiB-aligned): the tail moves to the next buffer.
    const size_t send = direct_ ? used_ / kDirectBlock * kDirectBlock : used_;
    if (send == 0) return;
    const size_t tail = used_ - send;
    if (may_aio_ && !aio_ && direct_ && file_off_ >= kAsyncFrom) {
        // Large enough to pay for the context's teardown (see kAsyncFrom).
        aio_context_t ctx = 0;
        if (sys_io_setup(kAioDepth, &ctx) == 0)
            aio_ = ctx;
        else
            may_aio_ = false;
    }
    if (aio_ && direct_) {  // no writer thread: submitted here, written meanwhile
        submit_async(send);
        return;
    }
    if (!writer_.joinable()) {  // no writer thread: written here, the tail moved to the front
        sink(reinterpret_cast<const char*>(buf_.data()), send, false);
        file_off_ += send;
        if (tail) std::memmove(buf_.data(), buf_.data() + send, tail);
        used_ = tail;
        return;
    }
    ChunkBytes next = next_buffer(send, tail);
    buf_.resize(send);
    {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return full_.size() < kMaxQueued || error_; });
        full_.push_back(std::move(buf_));
    }
    cv_.notify_all();
    buf_ = std::move(next);
    used_ = tail;
}

std::string OutputFile::write_failed(int err) { return std::string("write failed: ") + std::strerror(err); }

void OutputFile::fail_write() const { throw Error(path_, Error::no_offset, write_failed(errno)); }

// A buffer for what comes next (a spare one if any), starting with the
// `tail` bytes after the first `send` of the current one.
ChunkBytes OutputFile::next_buffer(size_t send, size_t tail) {
    ChunkBytes next;
    {
        std::lock_guard<std::mutex> l(mu_);  // the writer thread hands spares back
        if (!spare_.empty()) {
            next = std::move(spare_.back());
            spare_.pop_back();
        }
    }
    next.resize(kBufferSize);
    if (tail) std::memcpy(next.data(), buf_.data() + send, tail);
    return next;
}

void OutputFile::submit_async(size_t send) {
    if (!aio_error_.empty()) throw Error(path_, Error::no_offset, aio_error_);
    const size_t tail = used_ - send;
    if (file_off_ + send > extended_to_) {
        const uint64_t to = (file_off_ + send + kExtendStep - 1) / kExtendStep * kExtendStep;
        if (::ftruncate(fd_, static_cast<off_t>(to)) != 0)
            fail_write();
        extended_to_ = to;
    }
    while (inflight_.size() >= kAioDepth) reap_one();
    ChunkBytes next = next_buffer(send, tail);
    InFlight f;
    f.buf = std::move(buf_);
    f.len = send;
    f.id = ++next_id_;
    iocb cb{};
    cb.aio_data = f.id;
    cb.aio_lio_opcode = IOCB_CMD_PWRITE;
    cb.aio_fildes = static_cast<uint32_t>(fd_);
    cb.aio_buf = reinterpret_cast<uint64_t>(f.buf.data());
    cb.aio_nbytes = send;
    cb.aio_offset = static_cast<int64_t>(file_off_);
    iocb* cbs[1] = {&cb};
    long r;
    for (;;) {
        r = sys_io_submit(aio_, 1, cbs);
        if (r == 1) break;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN && !inflight_.empty()) {  // out of resources: make room
            reap_one();
            continue;
        }
        break;
    }
    buf_ = std::move(next);
    used_ = tail;
    if (r != 1) {
        // Refused (an old kernel, a filesystem without async direct I/O):
        // what is in flight completes, then this buffer and the rest are
        // written plainly, at the right offset.
        end_async();
        sink(reinterpret_cast<const char*>(f.buf.data()), send, false);
        file_off_ += send;
        f.buf.clear();
        spare_.push_back(std::move(f.buf));
        return;
    }
    file_off_ += send;
    inflight_.push_back(std::move(f));
}

void OutputFile::reap_one() {
    while (!inflight_.front().done) {
        io_event ev{};
        const long n = sys_io_getevents(aio_, 1, 1, &ev);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1) {
            if (aio_error_.empty()) aio_error_ = write_failed(errno);
            for (auto& f : inflight_) f.done = true;  // nothing more will come back
            break;
        }
        for (auto& f : inflight_) {
            if (f.id != ev.data) continue;
            f.done = true;
            if (ev.res != static_cast<int64_t>(f.len) && aio_error_.empty())
                aio_error_ = ev.res < 0 ? write_failed(static_cast<int>(-ev.res)) : "write failed: short write";
        }
    }
    InFlight f = std::move(inflight_.front());
    inflight_.pop_front();
    f.buf.clear();
    spare_.push_back(std::move(f.buf));
    if (!aio_error_.empty()) throw Error(path_, Error::no_offset, aio_error_);
}

void OutputFile::drain_async() noexcept {
    while (!inflight_.empty()) {
        try {
            reap_one();
        } catch (const Error&) {
        }
    }
}

void OutputFile::end_async() {
    drain_async();
    sys_io_destroy(aio_);
    aio_ = 0;
    may_aio_ = false;
    if (!aio_error_.empty()) throw Error(path_, Error::no_offset, aio_error_);
    // Plain writes from here on go where the asynchronous ones ended.
    if (::lseek(fd_, static_cast<off_t>(file_off_), SEEK_SET) < 0)
        fail_write();
}

void OutputFile::no_direct() {
    if (!direct_) return;
    const int fl = ::fcntl(fd_, F_GETFL);
    if (fl >= 0) ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT);
    direct_ = false;
}

void OutputFile::raw_write(const char* p, size_t k) {
    while (k) {
        ssize_t r = ::write(fd_, p, k);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL && direct_) {  // direct I/O refused after all: buffered from here on
            no_direct();
            continue;
        }
        if (r <= 0) fail_write();
        p += r;
        k -= static_cast<size_t>(r);
    }
}

void OutputFile::sink(const char* data, size_t n, bool finish) {
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

void OutputFile::write(const char* data, size_t n) {
    while (n) {
        const size_t k = std::min(n, kBufferSize / 2);
        char* p = room(k);
        std::memcpy(p, data, k);
        advance(k);
        data += k;
        n -= k;
    }
}

void OutputFile::commit() {
    // The last buffer is not handed to the writer thread: that would take a
    // fresh buffer for the unaligned tail, whose first touch zeroes a huge
    // page (milliseconds on a VM, most of a small trace's run) to carry less
    // than 4 KiB. It is written here once the writer is idle.
    if (!writer_.joinable() || aio_) hand_off();
    if (aio_) end_async();
    {
        // Wait for the writer to finish everything queued.
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return (full_.empty() && !busy_) || error_; });
    }
    rethrow_writer_error();
    if (used_) {  // the writer is idle: whole direct-I/O blocks, then the unaligned tail buffered
        const size_t send = direct_ ? used_ / kDirectBlock * kDirectBlock : used_;
        if (send) sink(reinterpret_cast<const char*>(buf_.data()), send, false);
        if (used_ > send) {
            no_direct();
            raw_write(reinterpret_cast<const char*>(buf_.data()) + send, used_ - send);
        }
        used_ = 0;
    }
    if (codec_) sink(nullptr, 0, true);  // the writer is idle: safe to finish here
    // Asynchronous writes extended the file ahead of them: cut it to what was written.
    if (extended_to_ > written_ && ::ftruncate(fd_, static_cast<off_t>(written_)) != 0)
        fail_write();
    if (in_place_) {
        if (owns_fd_) {
            const int fd = fd_;
            fd_ = -1;
            if (::close(fd) != 0) fail_write();
        }
        committed_ = true;
        return;
    }
    place_temporary();
    committed_ = true;
}

}  // namespace gilscan
