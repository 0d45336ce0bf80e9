#include "gilscan/sched/sched_events.h"

#include <charconv>

namespace gilscan {

PrevStateTable PrevStateTable::from_print_fmt(std::string_view fmt) {
    PrevStateTable t;
    // Pairs like { 0x00000001, "S" } or { 1, "S" } inside __print_flags(...).
    size_t pos = fmt.find("__print_flags");
    if (pos == std::string_view::npos) {
        t.flags = {{0x1, "S"}, {0x2, "D"}, {0x4, "T"}, {0x8, "t"}, {0x10, "X"}, {0x20, "Z"}, {0x40, "P"}, {0x80, "I"}};
        return t;
    }
    uint64_t highest = 0;
    while ((pos = fmt.find('{', pos)) != std::string_view::npos) {
        size_t close = fmt.find('}', pos);
        if (close == std::string_view::npos) break;
        std::string_view pair = fmt.substr(pos + 1, close - pos - 1);
        pos = close + 1;
        size_t comma = pair.find(',');
        size_t q1 = pair.find('"'), q2 = pair.rfind('"');
        if (comma == std::string_view::npos || q1 == std::string_view::npos || q2 <= q1) continue;
        std::string_view num = pair.substr(0, comma);
        while (!num.empty() && num.front() == ' ') num.remove_prefix(1);
        while (!num.empty() && num.back() == ' ') num.remove_suffix(1);
        int base = 10;
        if (num.size() > 2 && num[0] == '0' && (num[1] == 'x' || num[1] == 'X')) {
            num.remove_prefix(2);
            base = 16;
        }
        uint64_t v = 0;
        auto r = std::from_chars(num.data(), num.data() + num.size(), v, base);
        if (r.ec != std::errc() || v == 0) continue;
        t.flags.emplace_back(v, std::string(pair.substr(q1 + 1, q2 - q1 - 1)));
        highest = std::max(highest, v);
    }
    // The "+" bit is the next power of two above the last state letter
    // (TASK_REPORT_MAX on >= 4.14, TASK_STATE_MAX before).
    if (highest) t.preempt_bit = highest << 1;
    return t;
}

PrevState PrevStateTable::decode(int64_t prev_state) const {
    PrevState s;
    uint64_t v = static_cast<uint64_t>(prev_state);
    s.preempted = (v & preempt_bit) != 0;
    uint64_t bits = v & (preempt_bit - 1);
    if (bits == 0) {
        s.cls = StateClass::Runnable;
        s.letters = s.preempted ? "R+" : "R";
        return s;
    }
    bool first = true;
    uint64_t known = 0;
    for (const auto& [mask, letter] : flags) {
        if (!(bits & mask)) continue;
        known |= mask;
        if (!first) s.letters += '|';
        s.letters += letter;
        first = false;
    }
    if (bits & ~known) {
        if (!first) s.letters += '|';
        char buf[24];
        auto r = std::to_chars(buf, buf + sizeof buf, bits & ~known, 16);
        s.letters += "0x" + std::string(buf, r.ptr);
    }
    if (s.preempted) s.letters += '+';
    // Classify by the most telling letter.
    auto has = [&](std::string_view l) {
        for (const auto& [mask, letter] : flags)
            if (letter == l && (bits & mask)) return true;
        return false;
    };
    if (has("D"))
        s.cls = StateClass::DiskSleep;
    else if (has("S"))
        s.cls = StateClass::Sleeping;
    else if (has("T") || has("t"))
        s.cls = StateClass::Stopped;
    else if (has("X") || has("Z"))
        s.cls = StateClass::Dead;
    else if (has("I"))
        s.cls = StateClass::Idle;
    else if (has("P"))
        s.cls = StateClass::Parked;
    else
        s.cls = StateClass::Other;
    return s;
}

TracepointDecoder::Fields& TracepointDecoder::prepare(const EventInfo& ev) {
    if (by_event_.size() <= static_cast<size_t>(ev.index)) by_event_.resize(static_cast<size_t>(ev.index) + 1);
    auto& slot = by_event_[static_cast<size_t>(ev.index)];
    if (!slot) slot = std::make_unique<Fields>();
    Fields& f = *slot;
    if (f.ready && f.generation == ev.generation) return f;
    // First sight, or the event's name or formats changed (the old field
    // pointers may point into freed formats). PrevStates already handed out
    // stay in decoded_, so their letters remain valid.
    f = Fields();
    f.ready = true;
    f.generation = ev.generation;
    const TpFormat* fmt = ev.format;
    f.kind = event_kind(fmt, ev.name);
    // Whether fields sit at fixed places (ints of 4 or 8 bytes, strings
    // char[N]; absent ones do not count), and the raw bytes they need.
    auto plain = [](const TpField* x) { return !x || (!x->data_loc && !x->rel_loc); };
    auto int_ok = [&](const TpField* x) { return plain(x) && (!x || x->size == 4 || x->size == 8); };
    // In 64 bits: a format's offset and size are the file's word, and their
    // 32-bit sum can wrap past a short record's length.
    auto end_of = [](std::initializer_list<const TpField*> fs) {
        uint64_t end = 0;
        for (const TpField* x : fs)
            if (x) end = std::max<uint64_t>(end, uint64_t{x->offset} + x->size);
        return end;
    };
    switch (f.kind) {
    case TpKind::SchedSwitch: {
        f.a = fmt->field("prev_pid");
        f.b = fmt->field("next_pid");
        f.c = fmt->field("prev_state");
        f.d = fmt->field("prev_comm");
        f.e = fmt->field("next_comm");
        f.f = fmt->field("prev_prio");
        f.g = fmt->field("next_prio");
        f.fixed_switch = int_ok(f.a) && int_ok(f.b) && int_ok(f.c) && int_ok(f.f) && int_ok(f.g) && plain(f.d) &&
                         plain(f.e);
        f.fixed_end = end_of({f.a, f.b, f.c, f.d, f.e, f.f, f.g});
        break;
    }
    case TpKind::SchedWaking:
    case TpKind::SchedWakeup:
    case TpKind::SchedWakeupNew: {
        f.a = fmt->field("pid");
        f.b = fmt->field("target_cpu");
        f.c = fmt->field("prio");
        f.d = fmt->field("comm");
        // As for sched_switch: every field at a fixed place, one length test.
        f.fixed_wake = int_ok(f.a) && int_ok(f.b) && int_ok(f.c) && plain(f.d);
        f.fixed_end = end_of({f.a, f.b, f.c, f.d});
        break;
    }
    case TpKind::SchedProcessFork:
        f.a = fmt->field("parent_pid");
        f.b = fmt->field("child_pid");
        f.d = fmt->field("parent_comm");
        f.e = fmt->field("child_comm");
        break;
    case TpKind::SchedProcessExit:
        f.a = fmt->field("pid");
        f.d = fmt->field("comm");
        break;
    default: break;
    }
    // The masks are read from any sched_switch format, usable or not
    // (prev_state_table() is asked for them).
    if (fmt && fmt->full_name() == "sched:sched_switch") f.states = PrevStateTable::from_print_fmt(fmt->print_fmt);
    return f;
}

const PrevStateTable& TracepointDecoder::prev_state_table(const EventInfo& ev) { return fields(ev).states; }

const PrevState& TracepointDecoder::prev_state(const EventInfo& ev, int64_t v) {
    Fields& f = fields(ev);
    const PrevState** slot;
    if (v >= 0 && v < 4096) {
        if (f.small.empty()) f.small.assign(4096, nullptr);
        slot = &f.small[static_cast<size_t>(v)];
    } else {
        slot = &f.large.try_emplace(v, nullptr).first->second;
    }
    if (!*slot) *slot = &decoded_.emplace_back(f.states.decode(v));  // a deque: it stays where it is
    return **slot;
}

namespace {
// An int field of 4 or 8 bytes, inside raw (checked by the caller): as read_int.
[[gnu::always_inline]] inline int64_t int_at(const uint8_t* raw, const TpField& x, bool swap) {
    const uint8_t* p = raw + x.offset;
    if (x.size == 8) return static_cast<int64_t>(load<uint64_t>(p, swap));
    const uint32_t v = load<uint32_t>(p, swap);
    return x.is_signed ? static_cast<int64_t>(static_cast<int32_t>(v)) : static_cast<int64_t>(v);
}
[[gnu::always_inline]] inline std::string_view str_at(const uint8_t* raw, const TpField& x) {
    const uint8_t* p = raw + x.offset;
    return std::string_view(reinterpret_cast<const char*>(p), field_strnlen(p, x.size));
}
}  // namespace

bool TracepointDecoder::decode(const Sample& s, const EventInfo& ev, bool swap, SchedSwitch& o) {
    Fields& f = fields(ev);
    if (f.kind != TpKind::SchedSwitch) return false;
    if (f.fixed_switch && s.raw.size() >= f.fixed_end) [[likely]] {
        const uint8_t* p = s.raw.data();
        with_byte_order(swap, [&](auto sw) {
            o.prev_pid = static_cast<int32_t>(int_at(p, *f.a, sw));
            o.next_pid = static_cast<int32_t>(int_at(p, *f.b, sw));
            o.prev_state = int_at(p, *f.c, sw);
            if (f.d) o.prev_comm = str_at(p, *f.d);
            if (f.e) o.next_comm = str_at(p, *f.e);
            if (f.f) o.prev_prio = static_cast<int32_t>(int_at(p, *f.f, sw));
            if (f.g) o.next_prio = static_cast<int32_t>(int_at(p, *f.g, sw));
        });
        return true;
    }
    bool ok = true;
    o.prev_pid = static_cast<int32_t>(read_int(s.raw, *f.a, swap, &ok));
    o.next_pid = static_cast<int32_t>(read_int(s.raw, *f.b, swap, &ok));
    o.prev_state = read_int(s.raw, *f.c, swap, &ok);
    if (f.d) o.prev_comm = read_str(s.raw, *f.d, swap);
    if (f.e) o.next_comm = read_str(s.raw, *f.e, swap);
    if (f.f) o.prev_prio = static_cast<int32_t>(read_int(s.raw, *f.f, swap));
    if (f.g) o.next_prio = static_cast<int32_t>(read_int(s.raw, *f.g, swap));
    if (!ok) ++field_errors_;
    return ok;
}

bool TracepointDecoder::decode(const Sample& s, const EventInfo& ev, bool swap, SchedWake& o) {
    Fields& f = fields(ev);
    if (f.kind != TpKind::SchedWaking && f.kind != TpKind::SchedWakeup && f.kind != TpKind::SchedWakeupNew)
        return false;
    if (f.fixed_wake && s.raw.size() >= f.fixed_end) [[likely]] {
        const uint8_t* p = s.raw.data();
        with_byte_order(swap, [&](auto sw) {
            o.pid = static_cast<int32_t>(int_at(p, *f.a, sw));
            if (f.b) o.target_cpu = static_cast<int32_t>(int_at(p, *f.b, sw));
            if (f.c) o.prio = static_cast<int32_t>(int_at(p, *f.c, sw));
            if (f.d) o.comm = str_at(p, *f.d);
        });
        return true;
    }
    bool ok = true;
    with_byte_order(swap, [&](auto sw) {
        o.pid = static_cast<int32_t>(read_int(s.raw, *f.a, sw, &ok));
        if (f.b) o.target_cpu = static_cast<int32_t>(read_int(s.raw, *f.b, sw));
        if (f.c) o.prio = static_cast<int32_t>(read_int(s.raw, *f.c, sw));
        if (f.d) o.comm = read_str(s.raw, *f.d, sw);
    });
    if (!ok) ++field_errors_;
    return ok;
}

bool TracepointDecoder::decode(const Sample& s, const EventInfo& ev, bool swap, SchedFork& o) {
    Fields& f = fields(ev);
    if (f.kind != TpKind::SchedProcessFork) return false;
    bool ok = true;
    o.parent_pid = static_cast<int32_t>(read_int(s.raw, *f.a, swap, &ok));
    o.child_pid = static_cast<int32_t>(read_int(s.raw, *f.b, swap, &ok));
    if (f.d) o.parent_comm = read_str(s.raw, *f.d, swap);
    if (f.e) o.child_comm = read_str(s.raw, *f.e, swap);
    if (!ok) ++field_errors_;
    return ok;
}

bool TracepointDecoder::decode(const Sample& s, const EventInfo& ev, bool swap, SchedExit& o) {
    Fields& f = fields(ev);
    if (f.kind != TpKind::SchedProcessExit) return false;
    bool ok = true;
    o.pid = static_cast<int32_t>(read_int(s.raw, *f.a, swap, &ok));
    if (f.d) o.comm = read_str(s.raw, *f.d, swap);
    if (!ok) ++field_errors_;
    return ok;
}

}  // namespace gilscan
