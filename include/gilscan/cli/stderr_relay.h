// The channel `gilscan record -q` gives perf and the program as their
// stderr, so that perf's own "[ perf record: ... ]" lines can be left out
// while its errors and everything the program writes pass through.
//
//   StderrRelay relay;                 // a pseudo-terminal or a pipe
//   ... child: dup2(relay.writer(), 2)
//   relay.close_writer();
//   while (relay.pump(100)) { ... }    // forward, filtered, until end of input
//
// When our stderr is a terminal the relay is a pseudo-terminal of the same
// size (output processing off, so bytes pass as written), and the program
// still finds a terminal on its stderr (isatty(2), progress bars); a resize
// of our terminal is copied onto it. Otherwise, or if no pseudo-terminal can
// be had, a pipe.
#pragma once

#include <string>

namespace gilscan {

class StderrRelay {
public:
    StderrRelay();  // throws gilscan::Error when not even a pipe can be had
    ~StderrRelay();
    StderrRelay(const StderrRelay&) = delete;
    StderrRelay& operator=(const StderrRelay&) = delete;

    int writer() const { return writer_; }  // close-on-exec; dup2 it into children
    void close_writer();
    bool is_terminal() const { return pty_; }

    // Forwards to our stderr what arrives within timeout_ms, without perf's
    // lines; a partial line that cannot become one of perf's is not held
    // back (a progress line ending in '\r'). False once the input has ended
    // (every writer closed it). A signal ends the wait early.
    bool pump(int timeout_ms);
    // Forwards what is left and closes the reader.
    void finish();

private:
    void emit(const std::string& text) const;
    int reader_ = -1, writer_ = -1;
    bool pty_ = false;
    std::string pending_;
};

}  // namespace gilscan
