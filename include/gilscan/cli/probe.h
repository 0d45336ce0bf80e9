// `gilscan probe`: place (or --print, or --remove) the GIL uprobes for the
// Pythons named on the command line (probe_plan.h does the work).
//
//   gilscan probe python3            // gilscan_python3_11:take_gil, ...
#pragma once

namespace gilscan {

int probe_main(int argc, char** argv);

}  // namespace gilscan
