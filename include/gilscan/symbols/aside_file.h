// Helper for the cache directory's small entries (kallsyms_cache,
// name_store): a file written beside its name and renamed into place, so
// that a reader sees the old entry or the whole new one, never a part.
//
//   AsideFile f(dir, "names-" + id);     // dir/.names-<id>.XXXXXX, mode 0600
//   f.write(bytes); ...                  // false once any write failed
//   bool ok = f.commit();                // renamed to dir/names-<id>
//   (not committed: the temporary is removed)
//
// A stale temporary (a run killed meanwhile) starts with '.' and is removed
// by prune_debuginfo_cache after an hour.
#pragma once

#include <string>
#include <string_view>

namespace gilscan {

class AsideFile {
public:
    AsideFile(const std::string& dir, const std::string& name);
    ~AsideFile();
    AsideFile(const AsideFile&) = delete;
    AsideFile& operator=(const AsideFile&) = delete;

    bool write(std::string_view bytes);
    bool ok() const { return ok_; }
    bool commit();

private:
    std::string tmp_, path_;
    int fd_ = -1;
    bool ok_ = false, committed_ = false;
};

}  // namespace gilscan
