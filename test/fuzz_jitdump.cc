// libFuzzer target over jitdump files (jitdump.h) and the CFI rows of each
// code they load (jit_cfi.h), the way PerfMaps uses them: any input must
// give codes and rows that keep the invariants below, never a crash, a hang
// or an exception out of the parser.
//
//   clang++ -fsanitize=fuzzer,address,undefined ...   (meson -Dfuzz=true, see README)
//   build-fuzz/test/fuzz_jitdump -max_len=4096 test/fuzz_jitdump_corpus testdata/perf-maps
//
// Replayed over test/fuzz_jitdump_corpus and testdata/perf-maps by
// fuzz_replay.cc as an ordinary test in every build.
#include <cstddef>
#include <cstdint>

#include "gilscan/jit_cfi.h"
#include "gilscan/jitdump.h"
#include "gilscan/perf_map.h"

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
    return 0;
}
