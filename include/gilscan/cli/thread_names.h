// The startup hook `gilscan record` gives a Python program so that its
// threads' OS names are their threading names (CPython before 3.14 leaves
// every thread named after the process): a sitecustomize.py in a private
// directory put first on PYTHONPATH. It names each threading.Thread's OS
// thread after Thread.name when it starts and when it is renamed (prctl
// PR_SET_NAME through ctypes, the first 15 bytes), so the recording's COMM
// events carry the names for every viewer. It then takes itself out of
// sys.path and of the environment the program's children inherit, and runs
// the sitecustomize it stands in front of, if there is one (Debian's).
//
// Pythons started with -S, -E or -I do not run it; 3.14 and later name
// their threads themselves, and the hook leaves them alone.
#pragma once

#include <optional>
#include <string>

namespace gilscan {

class ThreadNameHook {
public:
    // Writes the hook and sets PYTHONPATH (and two GILSCAN_ variables the
    // hook removes) in gilscan's environment, which the program inherits.
    ThreadNameHook();
    // Restores the environment; removes the hook, its compiled copies, and
    // the directory if nothing else is left in it.
    ~ThreadNameHook();
    ThreadNameHook(const ThreadNameHook&) = delete;
    ThreadNameHook& operator=(const ThreadNameHook&) = delete;

    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::optional<std::string> old_pythonpath_;
};

// The hook's source (exposed for tests).
const char* thread_name_hook_source();

}  // namespace gilscan
