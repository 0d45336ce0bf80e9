// libFuzzer target over the whole decode path: header, attrs, features,
// tracing formats, records (file mode, pipe mode, zstd), ordering and the
// thread state machines. Any input must end in results or a gilscan::Error.
//
//   clang++ -fsanitize=fuzzer,address,undefined ...   (meson -Dfuzz=true, see docs/testing.md)
//   build-fuzz/test/fuzz_decoder -max_total_time=600 corpus/
//
// The same function is replayed over test/fuzz/decoder_corpus and testdata by
// fuzz_replay.cc as an ordinary test in every build.
#include <cstddef>
#include <cstdint>

#include "gilscan/error.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/timeline.h"

namespace {
struct NullSpans : gilscan::SpanSink {
    uint64_t n = 0;
    void span(const gilscan::Span& s) override { n += s.end >= s.start; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        gilscan::Session s("fuzz.data", gilscan::Bytes(data, size));
        NullSpans spans;
        gilscan::Timeline tl(s, spans);
        s.run(tl);
        tl.finish(s.stats().last_time);
    } catch (const gilscan::Error&) {
    }
    return 0;
}
