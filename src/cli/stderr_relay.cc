#include "gilscan/cli/stderr_relay.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "gilscan/error.h"

namespace gilscan {

namespace {

constexpr std::string_view kPerf = "[ perf record:";

volatile sig_atomic_t g_resized = 0;

void note_resize(int) { g_resized = 1; }

// Our stderr's window size onto the pseudo-terminal pty (either end).
// True when it was set, or when our stderr has none to give.
bool copy_window_size(int pty) {
    winsize ws{};
    return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) != 0 || ::ioctl(pty, TIOCSWINSZ, &ws) == 0;
}

bool perfs(std::string_view line) { return line.substr(0, kPerf.size()) == kPerf; }

// A pseudo-terminal like our stderr's terminal: fds[0] the master (read
// here), fds[1] the slave; both close-on-exec. False when none can be had.
bool open_terminal(int fds[2]) {
    const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master >= 0 && ::grantpt(master) == 0 && ::unlockpt(master) == 0) {
        char name[128];
        const int slave = ::ptsname_r(master, name, sizeof name) == 0 ? ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC) : -1;
        termios t{};
        if (slave >= 0 && ::tcgetattr(STDERR_FILENO, &t) == 0) {
            t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
            if (::tcsetattr(slave, TCSANOW, &t) == 0 && copy_window_size(slave)) {
                fds[0] = master;
                fds[1] = slave;
                return true;
            }
        }
        if (slave >= 0) ::close(slave);
    }
    if (master >= 0) ::close(master);
    return false;
}

}  // namespace

StderrRelay::StderrRelay() {
    int fds[2] = {-1, -1};
    pty_ = ::isatty(STDERR_FILENO) && open_terminal(fds);
    if (!pty_ && ::pipe2(fds, O_CLOEXEC) != 0)
        throw Error("gilscan record", Error::no_offset, std::string("pipe: ") + std::strerror(errno));
    reader_ = fds[0];
    writer_ = fds[1];
    if (pty_) {
        // Setting the size on a pseudo-terminal that is nobody's controlling
        // terminal signals no one: the program reads it the next time it asks
        // (os.get_terminal_size(2), a progress bar's width).
        struct sigaction wa {};
        wa.sa_handler = note_resize;  // no SA_RESTART: pump's poll returns at once
        ::sigaction(SIGWINCH, &wa, nullptr);
        g_resized = 1;  // a resize between the opening and here
    }
}

StderrRelay::~StderrRelay() {
    close_writer();
    if (reader_ >= 0) ::close(reader_);
    if (pty_) ::signal(SIGWINCH, SIG_DFL);
}

void StderrRelay::close_writer() {
    if (writer_ >= 0) ::close(writer_);
    writer_ = -1;
}

void StderrRelay::emit(const std::string& text) const {
    std::string_view rest = text;
    while (!rest.empty()) {
        const ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        rest.remove_prefix(static_cast<size_t>(n));
    }
}

// A pipe's end of file, or a pseudo-terminal's EIO once every writer has
// closed it, ends the input.
bool StderrRelay::pump(int timeout_ms) {
    if (reader_ < 0) return false;
    if (pty_ && g_resized) {
        g_resized = 0;
        copy_window_size(reader_);
    }
    pollfd p{reader_, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready <= 0) return true;  // nothing yet, or a signal
    char buf[4096];
    const ssize_t n = ::read(reader_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) return true;
    if (n <= 0) return false;
    pending_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
        const std::string line = pending_.substr(start, nl + 1 - start);
        if (!perfs(line)) emit(line);
    }
    pending_.erase(0, start);
    // The rest of a line: out now unless it may still become perf's.
    const std::string_view rest = pending_;
    if (!rest.empty() && kPerf.substr(0, std::min(rest.size(), kPerf.size())) != rest.substr(0, kPerf.size())) {
        emit(pending_);
        pending_.clear();
    }
    return true;
}

// Whatever is there now: a process the program left running may hold the
// relay open for as long as it lives, and is not waited for.
void StderrRelay::finish() {
    close_writer();
    if (reader_ < 0) return;
    for (;;) {
        pollfd p{reader_, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0 || !pump(0)) break;
    }
    if (!perfs(pending_)) emit(pending_);
    pending_.clear();
    ::close(reader_);
    reader_ = -1;
}

}  // namespace gilscan
