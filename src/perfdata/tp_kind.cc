#include "gilscan/perfdata/tp_kind.h"

#include <initializer_list>
#include <string>

#include "gilscan/perfdata/tracepoint_format.h"

namespace gilscan {

TpKind gil_probe_kind(std::string_view name) {
    size_t colon = name.rfind(':');
    std::string_view ev = colon == std::string_view::npos ? name : name.substr(colon + 1);
    bool ret = false;
    if (ev.size() > 8 && ev.substr(ev.size() - 8) == "__return") {
        ret = true;
        ev.remove_suffix(8);
    }
    // perf probe's duplicate suffix: take_gil_1, take_gil_2, ...
    size_t us = ev.rfind('_');
    if (us != std::string_view::npos && us + 1 < ev.size()) {
        bool digits = true;
        for (char ch : ev.substr(us + 1)) digits &= ch >= '0' && ch <= '9';
        if (digits) ev = ev.substr(0, us);
    }
    if (ev == "take_gil") return ret ? TpKind::GilTakeReturn : TpKind::GilTake;
    if (ev == "drop_gil") return ret ? TpKind::GilDropReturn : TpKind::GilDrop;
    return TpKind::Other;
}

TpKind event_kind(const TpFormat* fmt, std::string_view name) {
    // Without a format no field can be read: not even a uprobe's sample is
    // decoded then (the GIL tracker goes by the name alone: EventInfo::gil_kind).
    if (!fmt) return TpKind::Other;
    const std::string n = fmt->full_name();
    auto has = [&](std::initializer_list<const char*> names) {
        for (const char* x : names)
            if (!fmt->field(x)) return false;
        return true;
    };
    // A scheduler tracepoint without the fields it is read by is nothing
    // this analysis can use.
    if (n == "sched:sched_switch") return has({"prev_pid", "next_pid", "prev_state"}) ? TpKind::SchedSwitch : TpKind::Other;
    if (n == "sched:sched_waking") return has({"pid"}) ? TpKind::SchedWaking : TpKind::Other;
    if (n == "sched:sched_wakeup") return has({"pid"}) ? TpKind::SchedWakeup : TpKind::Other;
    if (n == "sched:sched_wakeup_new") return has({"pid"}) ? TpKind::SchedWakeupNew : TpKind::Other;
    if (n == "sched:sched_process_fork") return has({"parent_pid", "child_pid"}) ? TpKind::SchedProcessFork : TpKind::Other;
    if (n == "sched:sched_process_exit") return has({"pid"}) ? TpKind::SchedProcessExit : TpKind::Other;
    if (n == "sched:sched_process_exec") return TpKind::SchedProcessExec;
    return gil_probe_kind(name);
}

}  // namespace gilscan
