// Temporary files gilscan writes beside the names they will take.
//
//   std::string name;
//   int fd = create_named_temporary(dir, "trace.json", O_WRONLY, 0666, &name);
//   ... write ...
//   rename(name, final) → forget_temporary(name);   or   remove_temporary(name);
//
// Each name is DIR/.BASE.gilscan-<16 random hex digits>, created with
// O_CREAT|O_EXCL|O_NOFOLLOW: a name planted in advance (a symlink to a file
// of root's) is never opened, only skipped for another random one. Until
// forgotten, a name is in a fixed table that the handler installed by
// remove_temporaries_on_signals() unlinks on SIGINT, SIGTERM or SIGHUP
// before the process dies of that signal as it would have: an interrupted
// run leaves no temporary behind, and nothing that gilscan did not create is
// removed.
#pragma once

#include <csignal>
#include <string>

#include <sys/types.h>

namespace gilscan {

// 16 lowercase hex digits from getrandom(2).
std::string random_hex();

// Where scratch files go: $TMPDIR when set and not empty, else /tmp.
std::string temp_dir();

// -1 with errno set when no file could be made (after a few EEXIST retries).
int create_named_temporary(const std::string& dir, const std::string& base, int flags, mode_t mode,
                           std::string* name);
void register_temporary(const std::string& name);  // made some other way (linkat)
void forget_temporary(const std::string& name);  // renamed into place: no longer ours to remove
void remove_temporary(const std::string& name);  // unlinked, and forgotten

// Installs the cleanup handler for SIGINT, SIGTERM and SIGHUP where their
// disposition is the default (a caller's own handler is left alone).
void remove_temporaries_on_signals();

// SIGINT, SIGTERM and SIGHUP held back for the life of the object (the
// calling thread), so that a link-then-rename completes or never starts.
class FatalSignalsHeld {
public:
    FatalSignalsHeld();
    ~FatalSignalsHeld();
    FatalSignalsHeld(const FatalSignalsHeld&) = delete;
    FatalSignalsHeld& operator=(const FatalSignalsHeld&) = delete;

private:
    sigset_t old_;
};

}  // namespace gilscan
