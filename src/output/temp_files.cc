#include "gilscan/output/temp_files.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

namespace gilscan {

namespace {

// The names the signal handler removes: fixed slots, no allocation, each
// slot's state changed with atomics so the handler sees a name whole or not
// at all. A process has few temporaries at once (the outputs, a cache entry,
// an unpacked archive per batch worker); past kSlots a name is not
// registered and only the ordinary paths remove it.
constexpr int kSlots = 64;
constexpr size_t kNameMax = 4096;
enum : int { kFree = 0, kFilling = 1, kLive = 2 };
struct Slot {
    std::atomic<int> state{kFree};
    char name[kNameMax];
};
// Constant-initialized (all zero, in .bss): its 256 KiB stay untouched
// until a name is registered, instead of a page fault per slot at start-up.
constinit Slot g_slots[kSlots]{};
const int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

void register_name(const std::string& name) {
    if (name.size() >= kNameMax) return;
    for (Slot& s : g_slots) {
        int expect = kFree;
        if (!s.state.compare_exchange_strong(expect, kFilling)) continue;
        std::memcpy(s.name, name.c_str(), name.size() + 1);
        s.state.store(kLive);
        return;
    }
}

void on_fatal_signal(int sig) {
    const int saved = errno;
    for (Slot& s : g_slots)
        if (s.state.load() == kLive) ::unlink(s.name);
    errno = saved;
    // Die of the signal, as without the handler (the exit status says so).
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

}  // namespace

std::string temp_dir() {
    const char* t = std::getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

std::string random_hex() {
    unsigned char b[8];
    size_t got = 0;
    while (got < sizeof b) {
        const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    if (got < sizeof b) {  // no getrandom: the clock and the pid, still not guessable in advance by name alone
        const uint64_t v = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull ^
                           static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&got)) ^
                           static_cast<uint64_t>(::time(nullptr)) << 20;
        std::memcpy(b, &v, sizeof b);
    }
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (unsigned char c : b) {
        s += hex[c >> 4];
        s += hex[c & 15];
    }
    return s;
}

int create_named_temporary(const std::string& dir, const std::string& base, int flags, mode_t mode,
                           std::string* name) {
    for (int attempt = 0; attempt < 16; ++attempt) {
        std::string n = (dir.empty() ? std::string(".") : dir) + "/." + base + ".gilscan-" + random_hex();
        {
            FatalSignalsHeld held;  // created and registered as one step
            const int fd = ::open(n.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
            if (fd >= 0) {
                register_name(n);
                *name = std::move(n);
                return fd;
            }
        }
        if (errno != EEXIST) return -1;
    }
    errno = EEXIST;
    return -1;
}

void register_temporary(const std::string& name) { register_name(name); }

void forget_temporary(const std::string& name) {
    for (Slot& s : g_slots) {
        if (s.state.load() != kLive || std::strcmp(s.name, name.c_str()) != 0) continue;
        s.state.store(kFree);
        return;
    }
}

void remove_temporary(const std::string& name) {
    FatalSignalsHeld held;
    ::unlink(name.c_str());
    forget_temporary(name);
}

void remove_temporaries_on_signals() {
    for (int sig : kSignals) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa {};
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        for (int other : kSignals) sigaddset(&sa.sa_mask, other);
        ::sigaction(sig, &sa, nullptr);
    }
}

FatalSignalsHeld::FatalSignalsHeld() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kSignals) sigaddset(&set, sig);
    ::pthread_sigmask(SIG_BLOCK, &set, &old_);
}

FatalSignalsHeld::~FatalSignalsHeld() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

}  // namespace gilscan
