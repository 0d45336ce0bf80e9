// The outputs a command names, checked against its inputs before anything
// is written: gilscan never writes over a recording.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gilscan {

// Refuses (gilscan::Error, before anything is opened for writing) an output
// that is one of the inputs — the same file by device and inode, whatever
// the spelling: another path, a hard link, a symlink to it — and two outputs
// that are one file. "-" and empty names are not files; character devices
// (/dev/null) may take any number of outputs.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,  // {option, path}
                   const std::vector<std::string>& inputs);

}  // namespace gilscan
