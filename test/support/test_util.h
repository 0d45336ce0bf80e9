// Helpers shared by the synthetic-recording tests.
#pragma once

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gilscan/gil/gil_probes.h"
#include "gilscan/gil/gil_stacks.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/perfdata/session.h"
#include "gilscan/sched/timeline.h"
#include "support/perf_writer.h"

namespace gilscan::test {

// What a shell command prints on stdout (objdump, cat of a tracefs file).
inline std::string shell_output(const std::string& cmd) {
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed: " + cmd);
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
    return out;
}

inline constexpr uint64_t kTpSampleType =
    PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID | PERF_SAMPLE_CPU | PERF_SAMPLE_PERIOD |
    PERF_SAMPLE_RAW;

struct SchedRecording {
    PerfWriter w;
    int sw = 0, wk = 0;
    explicit SchedRecording(bool swap = false) {
        w.swap = swap;
        sw = w.add_tracepoint("sched", kSchedSwitchFormat, kTpSampleType);
        wk = w.add_tracepoint("sched", kSchedWakingFormat, kTpSampleType);
    }
    // sched_switch sampled in the context of `prev` (pid/tid of the sample).
    void switch_(uint64_t t, uint32_t cpu, int32_t pid, int32_t prev, int64_t state, int32_t next,
                 const std::string& next_comm = "other") {
        TestSample s;
        s.pid = pid;
        s.tid = prev;
        s.time = t;
        s.cpu = cpu;
        s.raw = w.raw(sw, {{"prev_pid", prev},
                           {"prev_state", state},
                           {"next_pid", next},
                           {"prev_comm", 0, "worker", true},
                           {"next_comm", 0, next_comm, true}});
        w.sample(sw, s);
    }
    void waking(uint64_t t, uint32_t cpu, int32_t waker_pid, int32_t waker, int32_t target) {
        TestSample s;
        s.pid = waker_pid;
        s.tid = waker;
        s.time = t;
        s.cpu = cpu;
        s.raw = w.raw(wk, {{"pid", target}, {"comm", 0, "worker", true}, {"target_cpu", cpu}});
        w.sample(wk, s);
    }
    // A switch record (perf record --switch-events) in tid's own context.
    void switch_record(uint64_t t, uint32_t cpu, int32_t pid, int32_t tid, bool out = false, bool preempt = false) {
        uint16_t misc = 0;
        if (out) misc |= PERF_RECORD_MISC_SWITCH_OUT;
        if (preempt) misc |= PERF_RECORD_MISC_SWITCH_OUT_PREEMPT;
        w.context_switch(sw, pid, tid, t, cpu, misc);
    }
};

// A uprobe's format as perf probe writes it (take_gil, take_gil__return, ...).
// An event whose samples carry a group read (PERF_FORMAT_GROUP | ID) and a
// callchain: the layout parse_sample walks with the cursor, where a group
// count larger than the record makes a malformed sample.
inline int add_group_read_event(PerfWriter& w) {
    PerfEventAttr attr;
    attr.sample_type = PERF_SAMPLE_TIME | PERF_SAMPLE_READ | PERF_SAMPLE_CALLCHAIN;
    attr.read_format = PERF_FORMAT_GROUP | PERF_FORMAT_ID;
    return w.add_event(attr, "cycles");
}

// gil_field: the entry probe reads the GIL's address as `gilscan probe` places
// it on 3.12+ ("gil=+16(+16(%di)):x64"), with the kernel's format for it.
inline std::string probe_format(const std::string& name, uint32_t id, bool ret, bool gil_field = false) {
    std::string f = "name: " + name + "\nID: " + std::to_string(id) + "\nformat:\n"
                    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
                    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
                    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";
    if (ret)
        f += "\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n"
             "\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n\n"
             "print fmt: \"(%lx <- %lx)\", REC->__probe_func, REC->__probe_ret_ip\n";
    else if (gil_field)
        f += "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
             "\tfield:u64 gil;\toffset:16;\tsize:8;\tsigned:0;\n\n"
             "print fmt: \"(%lx) gil=0x%Lx\", REC->__probe_ip, REC->gil\n";
    else
        f += "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\n"
             "print fmt: \"(%lx)\", REC->__probe_ip\n";
    return f;
}

// A scheduler recording with GIL uprobes (entry and return of take_gil and drop_gil).
struct GilRecording {
    SchedRecording r;
    int take, take_ret, drop, drop_ret;
    bool gil_field = false;
    explicit GilRecording(const std::string& group = "python", const std::string& suffix = "",
                          bool with_gil_field = false)
        : gil_field(with_gil_field) {
        take = r.w.add_tracepoint(group, probe_format("take_gil" + suffix, 2001, false, gil_field), kTpSampleType);
        take_ret = r.w.add_tracepoint(group, probe_format("take_gil" + suffix + "__return", 2002, true), kTpSampleType);
        drop = r.w.add_tracepoint(group, probe_format("drop_gil" + suffix, 2003, false), kTpSampleType);
        drop_ret = r.w.add_tracepoint(group, probe_format("drop_gil" + suffix + "__return", 2004, true), kTpSampleType);
    }
    // gil: the take_gil entry's address of the GIL (with gil_field).
    void ev(int which, uint64_t t, int32_t tid, int32_t pid = 10, uint64_t gil = 0) {
        TestSample s;
        s.pid = pid;
        s.tid = tid;
        s.time = t;
        if (which == take && gil_field)
            s.raw = r.w.raw(which, {{"gil", static_cast<int64_t>(gil)}});
        else
            s.raw = r.w.raw(which, {});
        r.w.sample(which, s);
    }
};


struct CollectedSpan {
    int32_t tgid, tid;
    uint64_t start, end;
    SpanKind kind;
    std::string name;
    int32_t waker;
    bool cut, woken_before;
    bool has_stack = false;
};

inline bool operator==(const CollectedSpan& a, const CollectedSpan& b) {
    return a.tgid == b.tgid && a.tid == b.tid && a.start == b.start && a.end == b.end && a.kind == b.kind &&
           a.name == b.name && a.waker == b.waker && a.cut == b.cut && a.woken_before == b.woken_before &&
           a.has_stack == b.has_stack;
}

struct Collect : SpanSink {
    std::vector<CollectedSpan> spans;
    void span(const Span& s) override {
        spans.push_back({s.tgid, s.tid, s.start, s.end, s.kind, std::string(s.name), s.waker, s.cut_at_end,
                         s.woken_before_switch, !s.stack_json.empty()});
    }
    std::vector<CollectedSpan> of(int32_t tid, SpanKind k) const {
        std::vector<CollectedSpan> out;
        for (auto& s : spans)
            if (s.tid == tid && s.kind == k) out.push_back(s);
        return out;
    }
};

struct Analysis {
    Collect spans;
    std::vector<ThreadStats> threads;
    std::vector<GilThreadStats> gil;
    std::vector<GilProcessStats> gils;  // per GIL, by pid and index
    GilAnomalies gil_anomalies;
    DecodeStats stats;
    bool cpu_wide = false;  // Timeline::cpu_wide()
    const GilThreadStats* gil_thread(int32_t tid) const {
        for (auto& t : gil)
            if (t.tid == tid) return &t;
        return nullptr;
    }
    const ThreadStats* thread(int32_t tid) const {
        for (auto& t : threads)
            if (t.tid == tid) return &t;
        return nullptr;
    }
};

// chunk_size: bytes per read of the data section (0: the default);
// threaded: force the reader thread on or off (default: by size).
inline Analysis analyse(const std::string& path, size_t chunk_size = 0, std::optional<bool> threaded = {}) {
    Analysis a;
    Session s(path);
    if (chunk_size) s.set_chunk_size(chunk_size);
    if (threaded) s.set_threaded(*threaded);
    GilTracker gil(nullptr, s.swap());
    Timeline tl(s, a.spans);
    tl.set_classifier(gil_probe_classifier(gil));
    FanOutOf<GilTracker, Timeline> stages(gil, tl);
    s.run(stages);
    gil.finish(s.stats().last_time);
    tl.finish(s.stats().last_time);
    for (const ThreadStats* t : tl.threads()) a.threads.push_back(*t);
    a.gil = gil.threads();
    a.gils = gil.processes();
    a.gil_anomalies = gil.anomalies();
    a.stats = s.stats();
    a.cpu_wide = tl.cpu_wide();
    return a;
}

// The same pipeline as `gilscan --gil-evidence stacks`: sleeps labelled from
// DWARF-unwound stacks.
struct StackAnalysis : Analysis {
    StackStats stack_stats;
    std::vector<std::string> module_problems;
};

inline StackAnalysis analyse_with_stacks(const std::string& path, const std::string& symfs = "") {
    StackAnalysis a;
    Session s(path);
    ProcessMaps maps;
    ModuleOptions mo;
    mo.symfs = symfs;
    ModuleCache modules(mo);
    GilStackClassifier gsc(&maps, modules);
    Timeline tl(s, a.spans);
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        gsc.classify(smp, ev, ps, label);
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
    tl.finish(s.stats().last_time);
    for (const ThreadStats* t : tl.threads()) a.threads.push_back(*t);
    a.stats = s.stats();
    a.stack_stats = gsc.stats();
    a.module_problems = modules.problems();
    return a;
}

inline Analysis analyse_bytes(const std::vector<uint8_t>& bytes, size_t chunk_size = 0,
                              std::optional<bool> threaded = {}) {
    TempFile f(bytes);
    return analyse(f.path, chunk_size, threaded);
}

// Frames named so far in a shared name cache (all layouts).
inline size_t named_frames(GilStackClassifier::NameCache& names) {
    std::lock_guard<std::mutex> l(names.mu);
    size_t n = 0;
    for (const auto& [layout, pcs] : names.names) n += pcs.size();
    return n;
}

// Runs a recording through `maps` and a Timeline whose classifier labels
// every switch-out with two classifiers side by side: each(ps, a's label,
// b's label) for each of them.
template <class F>
void classify_side_by_side(Session& s, ProcessMaps& maps, GilStackClassifier& a, GilStackClassifier& b, F&& each) {
    Collect sink;
    Timeline tl(s, sink);
    tl.set_classifier([&](const Sample& smp, const EventInfo& ev, const PrevState& ps, SleepLabel& label) {
        SleepLabel other;
        a.classify(smp, ev, ps, label);
        b.classify(smp, ev, ps, other);
        each(ps, label, other);
    });
    FanOutOf<ProcessMaps, Timeline> stages(maps, tl);
    s.run(stages);
}

}  // namespace gilscan::test
