// The GNU build-id in an ELF note area (a SHT_NOTE section or PT_NOTE
// segment), for readers that walk the ELF headers themselves.
//
//   std::string id = gnu_build_id_hex(Bytes(p + sh_offset, sh_size));  // "" if none
//   build_id_debug_path(id)   // "/usr/lib/debug/.build-id/93/ac61....debug"
//
// Its own header, apart from elf_file.h: the debuginfo cache includes the
// system <elf.h>, whose PT_LOAD and friends are macros.
#pragma once

#include <string>
#include <string_view>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

// Lower-case hex of the first NT_GNU_BUILD_ID note named "GNU"; notes are
// read through the checked Cursor and a malformed tail ends the walk.
std::string gnu_build_id_hex(Bytes notes);

// Where distributions install a build's separate debug file (Debian's
// *-dbgsym, libc6-dbg): ROOT/usr/lib/debug/.build-id/<first 2 hex>/<rest>.debug;
// "" for an id too short to split.
inline std::string build_id_debug_path(std::string_view id, std::string_view root = "") {
    if (id.size() <= 2) return {};
    return std::string(root) + "/usr/lib/debug/.build-id/" + std::string(id.substr(0, 2)) + "/" +
           std::string(id.substr(2)) + ".debug";
}

}  // namespace gilscan
