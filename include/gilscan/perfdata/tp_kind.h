// TpKind — what a sample's event is to the analysis: a scheduler
// tracepoint, a GIL uprobe, or neither. The session works it out once per
// event (EventInfo::kind and EventInfo::gil_kind, session.h), whenever the
// event's name or format may have changed, so the stages read it from the
// event instead of each keeping a table of their own by event index.
//
//   switch (ev.kind) { case TpKind::SchedSwitch: ...; }
//   if (is_gil_probe(ev.gil_kind)) ...
#pragma once

#include <cstdint>
#include <string_view>

namespace gilscan {

enum class TpKind : uint8_t {
    Other,
    SchedSwitch,
    SchedWakeup,
    SchedWakeupNew,
    SchedWaking,
    SchedProcessFork,
    SchedProcessExit,
    SchedProcessExec,
    GilTake,  // GilTake .. GilDropReturn together, in this order: is_gil_probe()
    GilTakeReturn,
    GilDrop,
    GilDropReturn,
};

// Uprobe event names: take_gil, take_gil__return, take_gil_1 (perf's suffix
// for an inlined function placed several times), take_gil_1__return_2 (one
// of several exits, each probed: exit_sites.h), any group.
TpKind gil_probe_kind(std::string_view event_name);
struct TpFormat;

// What an event is to the analysis, by its format's name and fields (what
// TracepointDecoder can decode) or, for a uprobe, its name: worked out by
// the session when an event's name or format changes (EventInfo::kind).
TpKind event_kind(const TpFormat* format, std::string_view event_name);

// One of take_gil / drop_gil, entry or return.
inline bool is_gil_probe(TpKind k) { return k >= TpKind::GilTake && k <= TpKind::GilDropReturn; }

}  // namespace gilscan
