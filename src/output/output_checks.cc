#include "gilscan/output/output_checks.h"

#include <filesystem>
#include <system_error>

#include <sys/stat.h>

#include "gilscan/error.h"

namespace gilscan {

namespace {
struct FileId {
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    bool device = false;
    std::string canonical;  // when it does not exist yet
    bool same(const FileId& o) const {
        if (exists != o.exists) return false;
        return exists ? dev == o.dev && ino == o.ino : canonical == o.canonical;
    }
};

FileId identify(const std::string& path) {
    FileId id;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        id.exists = true;
        id.dev = st.st_dev;
        id.ino = st.st_ino;
        id.device = S_ISCHR(st.st_mode);
        return id;
    }
    std::error_code ec;
    id.canonical = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec).string();
    if (ec) id.canonical = path;
    return id;
}
}  // namespace

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::string>& inputs) {
    std::vector<FileId> in;
    for (const auto& p : inputs) in.push_back(identify(p));
    std::vector<std::pair<FileId, size_t>> seen;
    for (size_t k = 0; k < outputs.size(); ++k) {
        const auto& [option, path] = outputs[k];
        if (path.empty() || path == "-") continue;
        const FileId id = identify(path);
        if (id.device) continue;
        for (size_t i = 0; i < in.size(); ++i)
            if (in[i].exists && id.same(in[i]))
                throw Error(path, Error::no_offset,
                            option + " names the input " + inputs[i] + "; refusing to write over a recording");
        for (const auto& [other, at] : seen)
            if (id.same(other))
                throw Error(path, Error::no_offset, option + " and " + outputs[at].first + " name the same file");
        seen.emplace_back(id, k);
    }
}

}  // namespace gilscan
