// OutputFile — all-or-nothing output: bytes go to a file without a name
// (O_TMPFILE) in NAME's directory, named and renamed to NAME only by
// commit(); an error, an exception or a signal before that leaves nothing
// behind, so no half-written trace is ever seen. Where the filesystem has no
// O_TMPFILE, the temporary is an exclusive random name (temp_files.h).
//
//   OutputFile out("trace.json");
//   out.write(buf, n);        // buffered
//   char* p = out.room(64);   // or format in place: at least 64 bytes free
//   out.advance(k);           //   ... k of them used
//   out.commit();             // flush, fsync-free rename into place
//
// "-" writes to stdout, and a NAME that exists and is not a regular file
// (/dev/null, a FIFO) is written as it is: no atomicity possible there. A name ending in
// ".gz" is written gzip-compressed (zlib), ".zst" zstd-compressed, streamed.
//
// Full buffers (2 MiB, then 4 MiB from 64 MiB on) are compressed and
// written by a background thread, so the writes and the compression
// overlap the analysis; an uncompressed file
// is written with O_DIRECT where the filesystem allows (no page-cache copy,
// which costs CPU for as long as the analysis). An
// error there is raised by the next write() or by commit(). Without the
// writer thread (-j 1: OutputFile(path, false)) the same happens on the
// caller's thread whenever a buffer is full. From 64 MiB on, a direct-I/O
// file is then written with Linux AIO (io_submit), so the disk works while
// the caller formats the next buffer. ext4 completes an O_DIRECT
// write that extends the file inside io_submit, so the file is extended
// (ftruncate) in 64 MiB steps ahead of the writes and cut to size by
// commit(). Smaller files are written plainly: tearing an AIO context down
// waits for an RCU grace period, which a small file does not win back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gilscan/perfdata/byte_buffer.h"

namespace gilscan {

class OutputFile {
public:
    // writer_thread = false: every write on the caller's thread (-j 1).
    explicit OutputFile(std::string path, bool writer_thread = true);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    void write(const char* data, size_t n);
    void write(std::string_view s) { write(s.data(), s.size()); }
    // At least n (<= kBufferSize / 2) writable bytes at the returned pointer;
    // advance(k) makes k of them part of the output.
    char* room(size_t n) {
        if (used_ + n > fill_) hand_off();
        return reinterpret_cast<char*>(buf_.data()) + used_;
    }
    void advance(size_t k) {
        used_ += k;
        written_ += k;
    }
    void commit();
    uint64_t bytes_written() const { return written_; }
    const std::string& path() const { return path_; }

    static constexpr size_t kBufferSize = 4u << 20;
    // Whether full buffers are now written asynchronously on the caller's
    // thread (no writer thread, direct I/O, kAsyncFrom written). For the tests.
    bool async_io() const { return aio_ != 0; }
    static constexpr uint64_t kAsyncFrom = 64u << 20;

private:
    void hand_off();  // queue the current buffer for the writer thread
    void writer_loop();
    void open_codec();  // by the name's ending: .gz, .zst, else none
    void open_temporary();   // unnamed (O_TMPFILE) or an exclusive random name
    void place_temporary();  // named, closed, renamed over path_
    void sink(const char* data, size_t n, bool finish);  // compress (or not) and write
    void raw_write(const char* p, size_t n);
    void stop_writer();
    void no_direct();  // back to buffered writes (for an unaligned tail)
    static constexpr size_t kDirectBlock = 4096;
    std::atomic<bool> direct_{false};  // the file was opened with O_DIRECT
    void rethrow_writer_error();
    static std::string write_failed(int err);  // "write failed: <strerror>"
    [[noreturn]] void fail_write() const;       // throws write_failed(errno)
    ChunkBytes next_buffer(size_t send, size_t tail);
    // Linux AIO (no writer thread, direct I/O): up to kAioDepth buffers in
    // flight, each written at its offset; the file extended ahead of them.
    static constexpr size_t kAioDepth = 2;
    struct InFlight {
        ChunkBytes buf;
        size_t len = 0;
        uint64_t id = 0;
        bool done = false;
    };
    void submit_async(size_t send);
    void reap_one();              // waits for the oldest write in flight
    void drain_async() noexcept;  // waits for all, keeping the first error
    void end_async();             // drains, then plain writes at file_off_
    unsigned long aio_ = 0;       // aio_context_t, 0: none
    bool may_aio_ = false;        // no writer thread, direct I/O, not given up
    std::deque<InFlight> inflight_;
    uint64_t next_id_ = 0;
    uint64_t file_off_ = 0;       // bytes of whole blocks written or submitted (no codec)
    uint64_t extended_to_ = 0;    // the file's size after the last ftruncate ahead
    std::string aio_error_;       // the first failed write's message
    struct Codec;
    std::unique_ptr<Codec> codec_;
    std::string path_, tmp_;  // tmp_: the temporary's name, empty while it has none
    int fd_ = -1;
    ChunkBytes buf_;
    size_t used_ = 0;
    // A buffer is handed off once filled to here (room() serves one request
    // past it). Half a buffer, one huge page, until kAsyncFrom bytes are
    // written: a buffer's memory is zeroed by the kernel at its first touch,
    // and a small trace (most) then touches half as much of each buffer;
    // large files get whole buffers, for the disk's sake.
    size_t fill_ = kBufferSize / 2;
    uint64_t written_ = 0;
    bool committed_ = false;
    bool in_place_ = false;  // no temporary: "-" (stdout) or a target that is not a regular file
    bool owns_fd_ = false;   // in place, opened here (not stdout): closed by commit()

    // Writer thread: full buffers in, empty buffers back.
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<ChunkBytes> full_;
    std::vector<ChunkBytes> spare_;
    bool done_ = false;
    bool busy_ = false;
    std::exception_ptr error_;
    std::thread writer_;
};

}  // namespace gilscan
