// libFuzzer target over jitdump files (jitdump.h) and the CFI rows of each
// code they load (jit_cfi.h), the way PerfMaps uses them: any input must
// give codes and rows that keep the invariants below, never a crash, a hang
// or an exception out of the parser. The same input also goes to the
// parsers of the other files PerfMaps reads: perf maps (perf_map.h) and a
// running process's /proc/PID/status and maps (live_process.h).
//
//   clang++ -fsanitize=fuzzer,address,undefined ...   (meson -Dfuzz=true, see docs/testing.md)
//   build-fuzz/test/fuzz_jitdump -max_len=4096 test/fuzz/jitdump_corpus testdata/perf-maps
//
// Replayed over test/fuzz/jitdump_corpus and testdata/perf-maps by
// fuzz_replay.cc as an ordinary test in every build.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "gilscan/symbols/jit_cfi.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/live_process.h"
#include "gilscan/symbols/perf_map.h"

namespace {
void require(bool ok) {
    if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gilscan;
    const JitDump d = parse_jitdump(Bytes(data, size), "fuzz.dump");
    for (const JitCode& c : d.codes) {
        require(c.size > 0 && c.start + c.size > c.start);
        require(c.eh_frame_hdr_size <= c.eh_frame.size());
        const std::vector<JitCfiRow> rows = jit_cfi_rows(c);
        uint64_t last = 0;
        for (const JitCfiRow& r : rows) {
            // In order, inside the code, each a rule the fast unwinder can apply.
            require(r.from >= last && r.from < r.to && r.to <= c.size);
            require(r.rule.kind == CfiRule::Simple && r.rule.cfa_reg < CfiRule::kRegs);
            require(jit_cfi_at(rows, r.from) == &r.rule && jit_cfi_at(rows, r.to - 1) == &r.rule);
            last = r.to;
        }
        if (!rows.empty()) require(jit_cfi_at(rows, rows.back().to) == nullptr);
    }
    const PerfMap m = PerfMap::from_jitdump(d);
    require(m.size() == d.codes.size());
    for (const JitCode& c : d.codes) {
        const PerfMapSymbol* s = m.find(c.start);
        require(s && s->start <= c.start && c.start - s->start < s->size);
        m.cfi_at(c.start);
        m.cfi_at(c.start + c.size - 1);
    }

    // The same bytes as the text files PerfMaps reads besides jitdumps: a
    // perf map, and the procfs files of a process that still runs (its
    // status's NSpid line, its maps). No crash, no exception; a symbol found
    // covers the address it was found for.
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const PerfMap pm = PerfMap::parse(text);
    uint64_t word = 0;
    std::memcpy(&word, data, std::min(size, sizeof word));
    for (const uint64_t pc : {uint64_t{0}, uint64_t{0x1000}, word, word + 1, ~uint64_t{0}}) {
        if (const PerfMapSymbol* s = pm.find(pc)) require(s->start <= pc && pc - s->start < s->size && s->size > 0);
        require(pm.cfi_at(pc) == nullptr);  // a perf map carries no CFI
    }
    require(ns_pid_of_status(text) >= 0);
    in_executable_mapping(text, word);
    in_executable_mapping(text, 0x1000);
    return 0;
}
