// Stage: the GIL releases a build inlined where no probe is, found so they
// can be probed (gilscan probe, gilscan record --gil).
//
//   GilLocation loc = locate_gil(elf);          // calls this itself
//   for (const GilFunction& f : loc.drop) if (f.site) f.vaddr, f.how
//
// Debian's python3.11 (LTO, a static _PyRuntime) releases the GIL from
// copies of drop_gil inlined into PyEval_SaveThread, _Py_read and three
// more functions. Each copy stores 0 to gil->locked and signals gil->cond,
// whose address is a constant there: `mov $0xa5b8c8,%edi; call
// pthread_cond_signal@plt`. The constant is read from the releases already
// located (PyEval_SaveThread's copy); every other call of
// pthread_cond_signal that passes it is a release. Each is probed where it
// signals, as a drop_gil entry (the GIL is free from the store just
// before). A build whose releases signal through a pointer (pyenv's, 3.12+'s
// per-interpreter GIL) has no such constant, and nothing is added.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gilscan/symbols/elf_file.h"
#include "gilscan/symbols/gil_locator.h"

namespace gilscan {

// The release sites outside loc's functions, as GilFunction{site = true}.
std::vector<GilFunction> inlined_release_sites(const ElfFile& elf, const GilLocation& loc,
                                               const std::map<uint64_t, std::string>& plt);

}  // namespace gilscan
