#include "gilscan/cli/thread_names.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gilscan/cli/record_run.h"
#include "gilscan/error.h"
#include "gilscan/output/temp_files.h"

namespace gilscan {

namespace {

// Python 2.7 to 3.13. GILSCAN_PYTHONPATH is "=" and the program's own
// PYTHONPATH, or "-" when it had none.
constexpr const char* kHook = R"PY(# gilscan record's thread-name hook (gilscan/cli/thread_names.h).
import os
import sys


def _gilscan_hook():
    here = os.environ.pop("GILSCAN_HOOK_DIR", None)
    given = os.environ.pop("GILSCAN_PYTHONPATH", None)
    if given is not None:
        if given.startswith("="):
            os.environ["PYTHONPATH"] = given[1:]
        else:
            os.environ.pop("PYTHONPATH", None)
    if here:
        sys.path[:] = [p for p in sys.path if p != here]
    if sys.version_info >= (3, 14):
        return
    try:
        import ctypes
        import threading
        # PyDLL: the call keeps the GIL (a CDLL call drops and takes it
        # again, a GIL wait of the hook's own in the recording).
        prctl = ctypes.PyDLL(None).prctl
    except Exception:
        return

    def set_os_name(name):
        try:
            if not isinstance(name, bytes):
                name = name.encode("utf-8", "replace")
            name = name[:15].decode("utf-8", "ignore").encode("utf-8")
            prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        except Exception:
            pass

    cls = threading.Thread
    inner = "_bootstrap_inner" if hasattr(cls, "_bootstrap_inner") else "_Thread__bootstrap_inner"
    started = getattr(cls, inner, None)
    if started is None:
        return

    def bootstrap_inner(self):
        set_os_name(self.name)
        return started(self)

    setattr(cls, inner, bootstrap_inner)
    prop = cls.__dict__.get("name")
    if isinstance(prop, property) and prop.fset is not None:
        def set_name(self, value):
            prop.fset(self, value)
            if self is threading.current_thread() and not isinstance(self, threading._MainThread):
                set_os_name(self.name)

        cls.name = property(prop.fget, set_name, prop.fdel, prop.__doc__)


try:
    _gilscan_hook()
except Exception:
    pass
del _gilscan_hook

# The sitecustomize behind this one, if any, runs as it would have.
_gilscan_self = sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401
except ImportError as e:
    if _gilscan_self is not None:
        sys.modules["sitecustomize"] = _gilscan_self
    if getattr(e, "name", "sitecustomize") != "sitecustomize":
        raise
)PY";

[[noreturn]] void fail(const std::string& what) { throw Error("gilscan record", Error::no_offset, what); }

}  // namespace

const char* thread_name_hook_source() { return kHook; }

namespace {

// The hook and what Python compiled of it (Python 2 beside it, Python 3 in
// __pycache__), then the directory if that left it empty: anything else the
// program put there stays.
void remove_hook_dir(const std::string& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::remove(dir + "/sitecustomize.py", ec);
    fs::remove(dir + "/sitecustomize.pyc", ec);
    const fs::path cache = dir + "/__pycache__";
    std::vector<fs::path> compiled;
    for (fs::directory_iterator it(cache, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.starts_with("sitecustomize.") && name.ends_with(".pyc")) compiled.push_back(it->path());
    }
    for (const fs::path& f : compiled) fs::remove(f, ec);
    ::rmdir(cache.c_str());
    ::rmdir(dir.c_str());
}

// The hook directories (gilscan-hook-<pid>-XXXXXX) of record runs that were
// killed before they could remove them: their pid is no longer a gilscan.
void remove_stale_hooks(const std::string& tmp) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<std::string> stale;
    for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.starts_with("gilscan-hook-")) continue;
        if (left_by_ended_run(name.substr(13, name.find('-', 13) - 13))) stale.push_back(it->path().string());
    }
    for (const std::string& d : stale) remove_hook_dir(d);
}

}  // namespace

ThreadNameHook::ThreadNameHook() {
    const std::string tmp = temp_dir();
    remove_stale_hooks(tmp);
    std::string pattern = tmp + "/gilscan-hook-" + std::to_string(::getpid()) + "-XXXXXX";
    if (!::mkdtemp(pattern.data())) fail("cannot make the thread-name hook's directory " + pattern + ": " + std::strerror(errno));
    dir_ = pattern;
    const std::string file = dir_ + "/sitecustomize.py";
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    const size_t len = std::strlen(kHook);
    const bool written = fd >= 0 && ::write(fd, kHook, len) == static_cast<ssize_t>(len);
    if (fd >= 0) ::close(fd);
    if (!written) {
        ::unlink(file.c_str());
        ::rmdir(dir_.c_str());
        fail("cannot write the thread-name hook " + file + " (--no-thread-names records without it)");
    }
    // Readable by a program that changes its user.
    ::chmod(dir_.c_str(), 0755);
    if (const char* p = std::getenv("PYTHONPATH")) old_pythonpath_ = p;
    ::setenv("GILSCAN_PYTHONPATH", old_pythonpath_ ? ("=" + *old_pythonpath_).c_str() : "-", 1);
    ::setenv("GILSCAN_HOOK_DIR", dir_.c_str(), 1);
    const std::string path = old_pythonpath_ && !old_pythonpath_->empty() ? dir_ + ":" + *old_pythonpath_ : dir_;
    ::setenv("PYTHONPATH", path.c_str(), 1);
}

ThreadNameHook::~ThreadNameHook() {
    ::unsetenv("GILSCAN_PYTHONPATH");
    ::unsetenv("GILSCAN_HOOK_DIR");
    if (old_pythonpath_) ::setenv("PYTHONPATH", old_pythonpath_->c_str(), 1);
    else ::unsetenv("PYTHONPATH");
    remove_hook_dir(dir_);
}

}  // namespace gilscan
