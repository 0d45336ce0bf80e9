#include "gilscan/output/trace_writer.h"

#include <cstring>
#include <map>
#include <set>

#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/perfdata/cursor.h"
#include "gilscan/gil/gil_probes.h"
#include "gilscan/output/decimal.h"
#include "gilscan/output/utf8.h"

// The helpers marked always_inline run several times per event: inlined
// into each event's formatter they save a call, and its register saves and
// restores, each. The compiler left them out
// of line on its own.
namespace gilscan {

namespace {

// Formatting into a raw buffer that begin() sized for the worst case.
[[gnu::always_inline]] inline char* put(char* p, std::string_view s) {
    std::memcpy(p, s.data(), s.size());
    return p + s.size();
}

// Non-zero when one of the 8 bytes of x needs escaping in a JSON string: a
// control character (< 0x20), non-ASCII (>= 0x80), '"' or '\\' (cursor.h's
// byte-parallel tests: exact as a yes/no answer).
[[gnu::always_inline]] inline uint64_t json_bad_bytes(uint64_t x) {
    return (x & kByteHighs) | bytes_below(x, 0x20) | zero_bytes(x ^ (kByteOnes * '"')) |
           zero_bytes(x ^ (kByteOnes * '\\'));
}

// Whether s goes into a JSON string as it is: 8 bytes at a time (the last
// word overlapping), reading only [0, n). Several strings per event: byte
// by byte this was a tenth of a scheduler trace's instructions.
[[gnu::always_inline]] inline bool json_plain(std::string_view s) {
    const auto* d = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    if (n >= 8) {
        uint64_t bad = json_bad_bytes(load<uint64_t>(d + n - 8, false));
        for (size_t i = 0; i + 8 < n; i += 8) bad |= json_bad_bytes(load<uint64_t>(d + i, false));
        return bad == 0;
    }
    if (n >= 4) return json_bad_bytes(load<uint32_t>(d, false) | uint64_t{load<uint32_t>(d + n - 4, false)} << 32) == 0;
    uint64_t w = 0x6161616161616161ull;  // 0-3 bytes shifted into a word of 'a's
    for (size_t i = 0; i < n; ++i) w = w << 8 | d[i];
    return json_bad_bytes(w) == 0;
}

// The escaping copy, for a string json_plain() said needs it (out of line:
// rare, and it would bloat every event's formatter it were inlined into).
// Well-formed UTF-8 (a thread's or a Python function's non-ASCII name) is
// copied as it is, anything else from 0x80 up becomes U+FFFD (utf8.h): the
// trace is valid JSON in UTF-8 whatever the recording holds.
__attribute__((noinline)) char* put_escaped(char* p, std::string_view s) {
    const auto* d = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char ch = d[i];
        if (ch >= 0x20 && ch < 0x80 && ch != '"' && ch != '\\') {
            *p++ = static_cast<char>(ch);
            continue;
        }
        if (ch >= 0x80) {
            const Utf8Step st = utf8_step(d + i, s.size() - i);
            // U+FFFD as its 3 bytes: within str_bound's 6 per input byte.
            p = st.ok ? put(p, s.substr(i, st.len)) : put(p, "\xEF\xBF\xBD");
            i += st.len - 1;
            continue;
        }
        *p++ = '\\';
        switch (ch) {
        case '"': *p++ = '"'; break;
        case '\\': *p++ = '\\'; break;
        case '\n': *p++ = 'n'; break;
        case '\t': *p++ = 't'; break;
        case '\r': *p++ = 'r'; break;
        default: {
            static const char hex[] = "0123456789abcdef";
            p = put(p, "u00");
            *p++ = hex[ch >> 4];
            *p++ = hex[ch & 15];
        }
        }
    }
    return p;
}

// A JSON string: most are gilscan's own names ("S", "R+", "GIL wait") and
// are copied straight; comm names and paths may need escaping.
[[gnu::always_inline]] inline char* put_str(char* p, std::string_view s) {
    *p++ = '"';
    if (json_plain(s)) {
        copy_short(p, s.data(), s.size());
        p += s.size();
    } else {
        p = put_escaped(p, s);
    }
    *p++ = '"';
    return p;
}

constexpr size_t kFixed = 256;  // every event's fixed text and numbers fit in this
inline size_t str_bound(std::string_view s) { return 6 * s.size() + 2; }

// ,"pid":P and, with_tid, ,"tid":T into text (a track cache slot's refill:
// out of line, as it is rare); its length.
__attribute__((noinline)) uint32_t track_text(char* text, int32_t pid, int32_t tid, bool with_tid) {
    char* e = put(text, ",\"pid\":");
    e = put_int(e, pid);
    if (with_tid) {
        e = put(e, ",\"tid\":");
        e = put_int(e, tid);
    }
    return static_cast<uint32_t>(e - text);
}

// A span's colour: catapult's reserved colour names (cname), fixed per
// state, so every viewer draws a state alike (README's legend): the
// scheduler's states in its thread_state_* colours, a GIL wait's sleep in
// "terrible", a hand-off's in "bad".
std::string_view cname_of(const Span& s) {
    switch (s.kind) {
    case SpanKind::Running: return "thread_state_running";
    case SpanKind::Runnable: return "thread_state_runnable";
    case SpanKind::Sleep:
        if (s.name.size() > 5 && s.name.substr(0, 5) == "S(GIL")
            return s.name == "S(GIL handoff)" ? "bad" : "terrible";
        return "thread_state_sleeping";
    case SpanKind::DiskSleep: return "thread_state_uninterruptible";
    case SpanKind::Other:
    case SpanKind::Unknown: break;
    }
    return "thread_state_unknown";
}

}  // namespace

// The slot's text, made first if it holds another track: ,"pid":P and,
// with_tid (in tracks_, not in pids_), ,"tid":T.
[[gnu::always_inline]] inline char* TraceWriter::put_cached(char* p, TrackText& t, int32_t pid, int32_t tid, bool with_tid) {
    if (t.len == 0 || t.tid != tid || t.pid != pid) [[unlikely]] {
        t.pid = pid;
        t.tid = tid;
        t.len = track_text(t.text, pid, tid, with_tid);
    }
    std::memcpy(p, t.text, sizeof t.text);  // a fixed size: a few moves (kFixed leaves room)
    return p + t.len;
}

[[gnu::always_inline]] inline char* TraceWriter::put_track(char* p, int32_t pid, int32_t tid) {
    // By tid modulo the slots: a process's tids are mostly consecutive. Bits
    // from 20 up are folded in first: a process's "GIL holder" track is
    // pid + 2^30 (gil_track_tid), which by the low bits alone shares the main
    // thread's slot, and the two alternate (4% of a uprobe capture's events
    // missed the cache, each formatting its ids again).
    const auto t = static_cast<uint32_t>(tid);
    return put_cached(p, tracks_[(t ^ (t >> 20)) % kTrackSlots], pid, tid, true);
}

[[gnu::always_inline]] inline char* TraceWriter::put_pid(char* p, int32_t pid) {
    return put_cached(p, pids_[static_cast<uint32_t>(pid) % kPidSlots], pid, 0, false);
}

[[gnu::always_inline]] inline char* TraceWriter::put_ts(char* p, uint64_t ns) {
    const uint64_t high = ns / 10'000'000;  // 10 ms: the microseconds above their last four digits
    if (high == 0) return put_us(p, ns);  // no leading digits to keep
    if (high != ts_high_) {
        ts_high_ = high;
        ts_len_ = static_cast<uint32_t>(put_uint(ts_text_, high) - ts_text_);
    }
    std::memcpy(p, ts_text_, sizeof ts_text_);
    p += ts_len_;
    // The last 10 ms in 32 bits: four digits of microseconds, three of nanoseconds.
    const auto low = static_cast<uint32_t>(ns - high * 10'000'000);
    const uint32_t us = low / 1000, frac = low - us * 1000;
    p = put_pair(p, us / 100);
    p = put_pair(p, us % 100);
    *p++ = '.';
    *p++ = static_cast<char>('0' + frac / 100);
    return put_pair(p, frac % 100);
}

// ,"ts":start,"dur":end-start (never negative)
[[gnu::always_inline]] inline char* TraceWriter::put_interval(char* p, uint64_t start_ns, uint64_t end_ns) {
    p = put(p, ",\"ts\":");
    p = put_ts(p, start_ns);
    p = put(p, ",\"dur\":");
    return put_us(p, end_ns >= start_ns ? end_ns - start_ns : 0);
}

void append_json_string(std::string& out, std::string_view s) {
    const size_t at = out.size();
    out.resize(at + str_bound(s));
    char* end = put_str(out.data() + at, s);
    out.resize(static_cast<size_t>(end - out.data()));
}

TraceWriter::TraceWriter(OutputFile& out, TraceOptions opt)
    : out_(out), filter_{std::move(opt)},
      state_row_offset_(filter_.opt.viztracer ? static_cast<uint32_t>(state_row_tid(0)) : 0) {
    out_.write(std::string_view("{\"traceEvents\":[\n"));
}

[[gnu::always_inline]] inline char* TraceWriter::begin(size_t bound) {
    bound += 2;  // ",\n"
    if (bound <= OutputFile::kBufferSize / 2) {
        start_ = out_.room(bound);
    } else {
        big_.resize(bound);
        start_ = big_.data();
    }
    char* p = start_;
    if (events_++ != 0) p = put(p, ",\n");
    return p;
}

[[gnu::always_inline]] inline void TraceWriter::end(char* p) {
    const size_t n = static_cast<size_t>(p - start_);
    if (!big_.empty()) {
        out_.write(big_.data(), n);
        big_.clear();
    } else {
        out_.advance(n);
    }
}

void TraceWriter::span(const Span& s) {
    // A span of no length draws nothing, and some viewers drop or flag it.
    if (!filter_.wanted(s) || s.end <= s.start) return;
    // The function and its key are beyond kFixed's fixed text (all of the
    // rest at once is 249 bytes at most): 6 a byte and 14 more, as arithmetic
    // rather than a branch on every span.
    char* p = begin(kFixed + str_bound(s.name) + str_bound(s.state) + str_bound(s.evidence) + s.stack_json.size() +
                    6 * s.function.size() + 14);
    p = put(p, "{\"ph\":\"X\",\"cat\":\"process state\",\"name\":");
    p = put_str(p, s.name);
    p = put(p, ",\"cname\":\"");
    p = put(p, cname_of(s));
    *p++ = '"';
    // The thread's own row, or with viztracer its state row (VizTracer's functions are on its own).
    p = put_track(p, s.tgid, static_cast<int32_t>(static_cast<uint32_t>(s.tid) + state_row_offset_));
    p = put_interval(p, s.start, s.end);
    p = put(p, ",\"args\":{\"state\":");
    p = put_str(p, s.state);
    if (s.cpu != ~0u) {
        p = put(p, ",\"cpu\":");
        p = put_int(p, s.cpu);
    }
    if (s.waker > 0) {
        p = put(p, ",\"waker\":");
        p = put_int(p, s.waker);
    }
    if (!s.evidence.empty()) {
        p = put(p, ",\"evidence\":");
        p = put_str(p, s.evidence);
        // Only a GIL wait has a function (a labelled sleep: it has evidence).
        if (!s.function.empty()) [[unlikely]] {
            p = put(p, ",\"function\":");
            p = put_str(p, s.function);
        }
    }
    if (!s.stack_json.empty()) {
        p = put(p, ",\"stack\":");
        p = put(p, s.stack_json);
    }
    if (s.cut_at_end) p = put(p, ",\"cut_at_end\":true");
    if (s.woken_before_switch) p = put(p, ",\"woken_before_switch_out\":true");
    p = put(p, "}}");
    end(p);
}

void TraceWriter::gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns,
                           bool cut) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    char* p = begin(kFixed);
    p = what == GilSpan::Wait ? put(p, R"({"ph":"X","cat":"GIL state","name":"GIL wait","cname":"terrible")")
                              : put(p, R"({"ph":"X","cat":"GIL state","name":"LOCK","cname":"good")");
    // The thread's GIL row, beside its state row: a GIL wait or hold
    // partially overlaps the sleeps and runs there.
    p = put_track(p, pid, gil_row_tid(tid));
    p = put_interval(p, start_ns, end_ns);
    if (gil > 0) {
        p = put(p, R"(,"args":{"gil":)");
        p = put_int(p, static_cast<int64_t>(gil) + 1);
        p = cut ? put(p, R"(,"cut_at_end":true}})") : put(p, "}}");
    } else {
        p = cut ? put(p, R"(,"args":{"cut_at_end":true}})") : put(p, "}");
    }
    end(p);
}

void TraceWriter::gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                             std::string_view culprit) {
    if (!filter_.wanted(pid) || end_ns <= start_ns) return;
    char* p = begin(kFixed + (culprit.empty() ? 0 : 6 * culprit.size() + 14));
    p = put(p, R"({"ph":"X","cat":"GIL holder","cname":"good","name":"GIL held by )");
    char* const holder_text = p;
    p = put_int(p, holder);
    const auto holder_len = static_cast<size_t>(p - holder_text);
    *p++ = '"';
    p = put_track(p, pid, track_tid);
    p = put_interval(p, start_ns, end_ns);
    p = put(p, R"(,"args":{"holder":)");
    // The same digits again, copied (at most 11 and a sign: 12 bytes, which
    // kFixed leaves room for; the track's text after them is longer).
    std::memcpy(p, holder_text, 12);
    p += holder_len;
    if (!culprit.empty()) {
        p = put(p, ",\"culprit\":");
        p = put_str(p, culprit);
    }
    p = put(p, "}}");
    end(p);
}

void TraceWriter::gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) {
    if (!filter_.wanted(pid)) return;
    char* p = begin(kFixed);
    // One counter per GIL: a process whose subinterpreters own their GILs
    // (3.12+) has several; the first keeps the plain name.
    if (gil == 0) {
        p = put(p, R"({"ph":"C","name":"GIL waiters")");
    } else {
        p = put(p, R"({"ph":"C","name":"GIL waiters (GIL )");
        p = put_int(p, static_cast<int64_t>(gil) + 1);
        p = put(p, ")\"");
    }
    p = put_pid(p, pid);
    p = put(p, ",\"ts\":");
    p = put_ts(p, ts_ns);
    p = put(p, R"(,"args":{"waiting":)");
    p = put_int(p, waiting);
    p = put(p, "}}");
    end(p);
}

// With viztracer, the thread's state row: its own row is VizTracer's to name.
void TraceWriter::name_thread(int32_t pid, int32_t tid, std::string_view name) {
    if (filter_.opt.viztracer) metadata("thread_name", pid, state_row_tid(tid), "state \xC2\xB7 " + std::string(name));
    else metadata("thread_name", pid, tid, name);
}

// A "M" event: {"ph":"M","name":what,"pid":P,"tid":T,"args":{args}} with
// args JSON text that needs no escaping.
void TraceWriter::meta_event(std::string_view what, int32_t pid, int32_t tid, std::string_view args) {
    if (!filter_.wanted(pid)) return;
    char* p = begin(kFixed + what.size() + args.size());
    p = put(p, "{\"ph\":\"M\",\"name\":\"");
    p = put(p, what);
    p = put(p, "\"");
    p = put_track(p, pid, tid);
    p = put(p, ",\"args\":{");
    p = put(p, args);
    p = put(p, "}}");
    end(p);
}

// what = "thread_name" or "process_name".
void TraceWriter::metadata(std::string_view what, int32_t pid, int32_t tid, std::string_view name) {
    std::string args = "\"name\":";
    append_json_string(args, name);
    meta_event(what, pid, tid, args);
}

// what = "process_sort_index" or "thread_sort_index".
void TraceWriter::sort_index(std::string_view what, int32_t pid, int32_t tid, int64_t index) {
    meta_event(what, pid, tid, "\"sort_index\":" + std::to_string(index));
}

// A process's thread rows, by tid, the main thread first: each thread's
// row ("<comm> <tid>": its own name when the program set one), then its GIL
// row. With viztracer, each thread's state row comes between them, and the
// thread's own row, where gilscan writes no span, is left to VizTracer to
// name (it only sorts it first).
void TraceWriter::name_process_rows(int32_t pid, const std::map<std::pair<bool, int32_t>, const ThreadStats*>& members,
                                    const std::set<std::pair<int32_t, int32_t>>& gil_rows) {
    const bool viztracer = filter_.opt.viztracer;
    const int64_t rows = viztracer ? 3 : 2;
    int64_t rank = 0;
    for (const auto& [key, t] : members) {
        const std::string name = std::string(t->comm) + " " + std::to_string(t->tid);
        if (!viztracer) metadata("thread_name", pid, t->tid, name);
        sort_index("thread_sort_index", pid, t->tid, rows * rank);
        if (viztracer) {
            metadata("thread_name", pid, state_row_tid(t->tid), "state \xC2\xB7 " + name);
            sort_index("thread_sort_index", pid, state_row_tid(t->tid), rows * rank + 1);
        }
        if (gil_rows.count({pid, t->tid})) {
            metadata("thread_name", pid, gil_row_tid(t->tid), "GIL \xC2\xB7 " + name);
            sort_index("thread_sort_index", pid, gil_row_tid(t->tid), rows * rank + rows - 1);
        }
        ++rank;
    }
}

// Names and order: a process by its main thread's comm (else the first
// seen), Python processes first; in each, the holder track, then its
// threads' rows (name_process_rows). With viztracer, VizTracer names a
// Python process (its script), so gilscan does not.
void TraceWriter::finish(const std::vector<const ThreadStats*>& threads, const TraceMeta& meta) {
    std::map<int32_t, std::string_view> process_names;
    std::map<int32_t, std::map<std::pair<bool, int32_t>, const ThreadStats*>> by_process;  // (not main, tid)
    for (const ThreadStats* t : threads) {
        if (!t->monitored) continue;
        const int32_t pid = t->tgid > 0 ? t->tgid : t->tid;
        if (t->tid == pid || !process_names.count(pid)) process_names[pid] = t->comm;
        by_process[pid][{t->tid != pid, t->tid}] = t;
    }
    for (const auto& [pid, name] : process_names) {
        const bool python = meta.python_pids.count(pid) != 0;
        if (!filter_.opt.viztracer || !python) metadata("process_name", pid, pid, name);
        sort_index("process_sort_index", pid, pid, python ? 0 : 1);
    }
    for (const HolderTrack& h : meta.holder_tracks) {
        metadata("thread_name", h.pid, h.track_tid, h.name);
        sort_index("thread_sort_index", h.pid, h.track_tid, -1);
    }
    std::set<std::pair<int32_t, int32_t>> gil_rows(meta.gil_rows.begin(), meta.gil_rows.end());
    for (const auto& [pid, members] : by_process) name_process_rows(pid, members, gil_rows);
    std::string tail =
        "\n],\"displayTimeUnit\":\"ns\",\"viztracer_metadata\":{\"version\":\"0.16.3\",\"overflow\":false,"
        "\"producer\":\"gilscan\"},\"otherData\":{\"source\":";
    append_json_string(tail, meta.source_file);
    tail += ",\"clock\":";
    append_json_string(tail, meta.clock);
    tail += ",\"hostname\":";
    append_json_string(tail, meta.hostname);
    tail += ",\"cmdline\":";
    append_json_string(tail, meta.cmdline);
    tail += "}}\n";
    out_.write(tail);
}

}  // namespace gilscan
