// The GNU build-id in an ELF note area (a SHT_NOTE section or PT_NOTE
// segment), for readers that walk the ELF headers themselves.
//
//   std::string id = gnu_build_id_hex(Bytes(p + sh_offset, sh_size));  // "" if none
//
// Its own header, apart from elf_file.h: the debuginfo cache includes the
// system <elf.h>, whose PT_LOAD and friends are macros.
#pragma once

#include <string>

#include "gilscan/cursor.h"

namespace gilscan {

// Lower-case hex of the first NT_GNU_BUILD_ID note named "GNU"; notes are
// read through the checked Cursor and a malformed tail ends the walk.
std::string gnu_build_id_hex(Bytes notes);

}  // namespace gilscan
