// Stage (probe side): which GIL a take_gil / drop_gil call is on, read by
// the uprobe itself as a fetch argument, from libpython's DWARF.
//
//   std::optional<GilArgPath> a = gil_arg_path("/.../libpython3.13.so.1.0", "take_gil", vaddr, &why);
//   a->fetcharg()   // "gil=+16(+16(%di)):x64": tstate->interp->ceval.gil
//
// Since 3.12 each interpreter may own its GIL (PEP 684: subinterpreters
// created with the "isolated" config), so threads of one process no longer
// serialise on one lock. take_gil(PyThreadState *tstate) takes
// tstate->interp->ceval.gil (its drop_gil and return probes need no address:
// the analysis pairs them with the thread's last take). The offsets differ
// between versions and builds,
// so they come from the DWARF types of the function's first parameter, and
// only where that parameter reaches a `gil` POINTER member (3.9-3.11 keep
// one GIL in _PyRuntime: no argument, one GIL per process). Only an
// out-of-line copy named exactly take_gil/drop_gil is used: a compiler clone
// (.isra, .constprop) may receive other arguments in other registers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gilscan {

struct GilArgPath {
    std::string reg;               // the first argument's register in uprobe syntax: "%di" (x86-64), "%x0" (arm64)
    std::vector<uint32_t> derefs;  // loads from the register outwards: {16, 16} = *(*(%di + 16) + 16)
    // "gil=+16(+16(%di)):x64" for uprobe_events and perf probe.
    std::string fetcharg() const;
};

// The field name the probes' formats carry ("gil"), read back by the analysis.
inline constexpr std::string_view kGilArgField = "gil";

// nullopt, with the reason in *why, when the file has no DWARF, the
// function or its parameter's type is not described, or the GIL is not
// reached through pointers (one GIL per process).
std::optional<GilArgPath> gil_arg_path(const std::string& elf_path, std::string_view function, uint64_t vaddr,
                                       std::string* why);

}  // namespace gilscan
