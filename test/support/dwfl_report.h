// Test helper: one binary reported into a Dwfl of its own, offline, as
// gilscan's unwinder reports a mapped one (dwfl_report_elf at a load bias;
// debug files found by libdwfl's standard search).
//
//   ReportedElf r("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7f1234000000);
//   dwfl_module_addrinfo(r.mod, pc, ...);
#pragma once

#include <filesystem>
#include <string>

#include <elfutils/libdwfl.h>

namespace gilscan::test {

struct ReportedElf {
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    ReportedElf(const std::string& path, Dwarf_Addr base) {
        static char* debuginfo_path = nullptr;
        static const Dwfl_Callbacks callbacks = {dwfl_build_id_find_elf, dwfl_standard_find_debuginfo,
                                                 dwfl_offline_section_address, &debuginfo_path};
        dwfl = dwfl_begin(&callbacks);
        dwfl_report_begin(dwfl);
        mod = dwfl_report_elf(dwfl, std::filesystem::path(path).filename().c_str(), path.c_str(), -1, base, false);
        dwfl_report_end(dwfl, nullptr, nullptr);
    }
    ~ReportedElf() { dwfl_end(dwfl); }
    ReportedElf(const ReportedElf&) = delete;
    ReportedElf& operator=(const ReportedElf&) = delete;
};

}  // namespace gilscan::test
