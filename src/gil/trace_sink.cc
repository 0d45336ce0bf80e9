// InOrderTraceSink: the GIL tracker's events held behind the spans a -j 3
// timeline is still waiting to label (trace_sink.h).
#include "gilscan/gil/trace_sink.h"

namespace gilscan {

void InOrderTraceSink::gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns,
                                uint64_t end_ns, bool cut) {
    if (!tl_.holding()) return next_.gil_span(pid, tid, what, gil, start_ns, end_ns, cut);
    tl_.defer({this, kSpan, static_cast<uint8_t>(what), cut, pid, tid, static_cast<int32_t>(gil), 0, start_ns, end_ns});
}

void InOrderTraceSink::gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                                  std::string_view culprit) {
    if (!tl_.holding()) return next_.gil_holder(pid, track_tid, holder, start_ns, end_ns, culprit);
    tl_.defer({this, kHolder, 0, false, pid, track_tid, holder, 0, start_ns, end_ns});
}

void InOrderTraceSink::gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) {
    if (!tl_.holding()) return next_.gil_waiters(pid, gil, ts_ns, waiting);
    tl_.defer({this, kWaiters, 0, false, pid, static_cast<int32_t>(gil), 0, waiting, ts_ns, 0});
}

void InOrderTraceSink::replay(const DeferredEvent& e) {
    switch (e.kind) {
    case kSpan:
        next_.gil_span(e.pid, e.tid, static_cast<GilSpan>(e.what), static_cast<uint32_t>(e.other), e.start, e.end, e.cut);
        break;
    case kHolder: next_.gil_holder(e.pid, e.tid, e.other, e.start, e.end, {}); break;
    case kWaiters: next_.gil_waiters(e.pid, static_cast<uint32_t>(e.tid), e.start, e.count); break;
    }
}

}  // namespace gilscan
