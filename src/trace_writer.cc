#include "gilscan/trace_writer.h"

#include <charconv>
#include <map>

namespace gilscan {

void append_json_string(std::string& out, std::string_view s) {
    out.push_back('"');
    for (unsigned char ch : s) {
        switch (ch) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
            if (ch < 0x20 || ch >= 0x80) {
                // comm is raw bytes from the kernel: keep JSON valid UTF-8.
                static const char hex[] = "0123456789abcdef";
                out += "\\u00";
                out.push_back(hex[ch >> 4]);
                out.push_back(hex[ch & 15]);
            } else {
                out.push_back(static_cast<char>(ch));
            }
        }
    }
    out.push_back('"');
}

TraceWriter::TraceWriter(OutputFile& out, TraceOptions opt) : out_(out), opt_(std::move(opt)) {
    line_.reserve(512);
    out_.write(std::string_view("{\"traceEvents\":[\n"));
}

void TraceWriter::begin_event() {
    if (events_++ != 0) line_.append(",\n");
}

void TraceWriter::put_int(int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    line_.append(buf, r.ptr);
}

void TraceWriter::put_us(uint64_t ns) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, ns / 1000);
    line_.append(buf, r.ptr);
    unsigned frac = static_cast<unsigned>(ns % 1000);
    char f[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                 static_cast<char>('0' + frac % 10)};
    line_.append(f, 4);
}

void TraceWriter::put_str(std::string_view s) {
    // Most strings here are gilscan's own names ("S", "R+", "GIL wait"):
    // copy them straight when nothing in them needs escaping.
    for (unsigned char ch : s)
        if (ch < 0x20 || ch >= 0x80 || ch == '"' || ch == '\\') {
            append_json_string(line_, s);
            return;
        }
    line_.push_back('"');
    line_.append(s);
    line_.push_back('"');
}

void TraceWriter::flush_line() {
    out_.write(line_);
    line_.clear();
}

void TraceWriter::span(const Span& s) {
    if (!opt_.pids.empty() && !opt_.pids.count(s.tgid)) return;
    switch (s.kind) {
    case SpanKind::Running:
        if (!opt_.running) return;
        break;
    case SpanKind::Runnable:
        if (!opt_.runnable) return;
        break;
    case SpanKind::Sleep:
    case SpanKind::DiskSleep:
    case SpanKind::Other:
        if (!opt_.sleeping) return;
        break;
    case SpanKind::Unknown: break;
    }
    begin_event();
    put("{\"ph\":\"X\",\"cat\":\"process state\",\"name\":");
    put_str(s.name);
    put(",\"pid\":");
    put_int(s.tgid);
    put(",\"tid\":");
    put_int(s.tid);
    put(",\"ts\":");
    put_us(s.start);
    put(",\"dur\":");
    put_us(s.end - s.start);
    put(",\"args\":{\"state\":");
    put_str(s.state);
    if (s.cpu != ~0u) {
        put(",\"cpu\":");
        put_int(s.cpu);
    }
    if (s.waker > 0) {
        put(",\"waker\":");
        put_int(s.waker);
    }
    if (!s.evidence.empty()) {
        put(",\"evidence\":");
        put_str(s.evidence);
    }
    if (!s.stack_json.empty()) {
        put(",\"stack\":");
        put(s.stack_json);
    }
    if (s.cut_at_end) put(",\"cut_at_end\":true");
    if (s.woken_before_switch) put(",\"woken_before_switch_out\":true");
    put("}}");
    flush_line();
}

void TraceWriter::complete(int32_t pid, int32_t tid, std::string_view name, std::string_view cat, uint64_t start_ns,
                           uint64_t end_ns, std::string_view args_json) {
    if (!opt_.pids.empty() && !opt_.pids.count(pid)) return;
    begin_event();
    put("{\"ph\":\"X\",\"cat\":");
    put_str(cat);
    put(",\"name\":");
    put_str(name);
    put(",\"pid\":");
    put_int(pid);
    put(",\"tid\":");
    put_int(tid);
    put(",\"ts\":");
    put_us(start_ns);
    put(",\"dur\":");
    put_us(end_ns >= start_ns ? end_ns - start_ns : 0);
    if (!args_json.empty()) {
        put(",\"args\":");
        put(args_json);
    }
    put("}");
    flush_line();
}

void TraceWriter::counter(int32_t pid, std::string_view name, uint64_t ts_ns, std::string_view args_json) {
    if (!opt_.pids.empty() && !opt_.pids.count(pid)) return;
    begin_event();
    put("{\"ph\":\"C\",\"name\":");
    put_str(name);
    put(",\"pid\":");
    put_int(pid);
    put(",\"ts\":");
    put_us(ts_ns);
    put(",\"args\":");
    put(args_json);
    put("}");
    flush_line();
}

void TraceWriter::name_thread(int32_t pid, int32_t tid, std::string_view name) {
    if (!opt_.pids.empty() && !opt_.pids.count(pid)) return;
    begin_event();
    put("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
    put_int(pid);
    put(",\"tid\":");
    put_int(tid);
    put(",\"args\":{\"name\":");
    put_str(name);
    put("}}");
    flush_line();
}

void TraceWriter::finish(const std::vector<ThreadStats>& threads, const TraceMeta& meta) {
    // Process names: the main thread's comm (tid == pid), else the first seen.
    std::map<int32_t, std::string> process_names;
    for (const auto& t : threads) {
        if (!t.monitored) continue;
        int32_t pid = t.tgid > 0 ? t.tgid : t.tid;
        if (t.tid == pid || !process_names.count(pid)) process_names[pid] = t.comm;
    }
    for (const auto& [pid, name] : process_names) {
        if (!opt_.pids.empty() && !opt_.pids.count(pid)) continue;
        begin_event();
        put("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
        put_int(pid);
        put(",\"tid\":");
        put_int(pid);
        put(",\"args\":{\"name\":");
        put_str(name);
        put("}}");
        flush_line();
    }
    for (const auto& t : threads) {
        int32_t pid = t.tgid > 0 ? t.tgid : t.tid;
        if (!t.monitored || (!opt_.pids.empty() && !opt_.pids.count(pid))) continue;
        begin_event();
        put("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
        put_int(pid);
        put(",\"tid\":");
        put_int(t.tid);
        put(",\"args\":{\"name\":");
        put_str(t.comm);
        put("}}");
        flush_line();
    }
    put("\n],\"displayTimeUnit\":\"ns\",\"viztracer_metadata\":{\"version\":\"0.16.3\",\"overflow\":false,"
        "\"producer\":\"gilscan\"},\"otherData\":{\"source\":");
    put_str(meta.source_file);
    put(",\"clock\":");
    put_str(meta.clock);
    put(",\"hostname\":");
    put_str(meta.hostname);
    put(",\"cmdline\":");
    put_str(meta.cmdline);
    put("}}\n");
    flush_line();
}

}  // namespace gilscan
