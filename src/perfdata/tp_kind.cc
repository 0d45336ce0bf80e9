#include "gilscan/perfdata/tp_kind.h"

#include <initializer_list>
#include <string>

#include "gilscan/perfdata/tracepoint_format.h"

namespace gilscan {

TpKind gil_probe_kind(std::string_view name) {
    size_t colon = name.rfind(':');
    std::string_view ev = colon == std::string_view::npos ? name : name.substr(colon + 1);
    // perf probe's duplicate suffix: take_gil_1, take_gil_2, ...
    auto without_index = [](std::string_view e) {
        size_t us = e.rfind('_');
        if (us == std::string_view::npos || us + 1 >= e.size()) return e;
        for (char ch : e.substr(us + 1))
            if (ch < '0' || ch > '9') return e;
        return e.substr(0, us);
    };
    // A return, as perf probe names one (take_gil__return), or one of a
    // function's several exits, each a plain probe (take_gil__return_1).
    bool ret = false;
    if (std::string_view r = without_index(ev); r.size() > 8 && r.substr(r.size() - 8) == "__return") {
        ret = true;
        ev = r.substr(0, r.size() - 8);
    }
    ev = without_index(ev);
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
