#include "gilscan/output/trace_relay.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <pthread.h>
#include <sys/mman.h>

namespace gilscan {

namespace {

// An event's bytes in a block: an Op byte, its fixed fields, then each
// string as a u32 length and its bytes. Both ends run on this machine, so
// fields are copied as they are in memory (no alignment: memcpy).
template <class T>
inline char* put(char* p, T v) {
    std::memcpy(p, &v, sizeof v);
    return p + sizeof v;
}

inline char* put(char* p, std::string_view s) {
    p = put(p, static_cast<uint32_t>(s.size()));
    copy_short(p, s.data(), s.size());
    return p + s.size();
}

// A span's stack: a kept text (Span::stack_stable) outlives the relay's
// blocks, so its address and length travel, not its kilobytes; any other
// goes as a string. The span's kStackRef flag tells replay() which.
struct StackField {
    std::string_view s;
    bool stable;
};
inline char* put(char* p, StackField f) {
    if (!f.stable) return put(p, f.s);
    p = put(p, f.s.data());
    return put(p, f.s.size());
}

// A string most spans leave empty (the function, with --gil-functions): sent
// only when the span's kFunction flag says it is there.
struct OptionalField {
    std::string_view s;
};
inline char* put(char* p, OptionalField f) { return f.s.empty() ? p : put(p, f.s); }

inline size_t field_size(std::string_view s) { return 4 + s.size(); }
inline size_t field_size(OptionalField f) { return f.s.empty() ? 0 : field_size(f.s); }
inline size_t field_size(StackField f) { return f.stable ? sizeof(const char*) + sizeof(size_t) : field_size(f.s); }
template <class T>
inline size_t field_size(T) {
    return sizeof(T);
}

struct Unpack {
    const uint8_t* p;
    template <class T>
    T get() {
        T v;
        std::memcpy(&v, p, sizeof v);
        p += sizeof v;
        return v;
    }
    std::string_view str() {
        const auto n = get<uint32_t>();
        std::string_view s(reinterpret_cast<const char*>(p), n);
        p += n;
        return s;
    }
    std::string_view ref() {
        const auto* data = get<const char*>();
        return {data, get<size_t>()};
    }
};

enum : uint8_t { kCut = 1, kWokenBeforeSwitch = 2, kPreempted = 4, kStackRef = 8, kFunction = 16 };

}  // namespace

TraceRelay::Slabs::~Slabs() {
    for (void* s : slabs_) std::free(s);
}

uint8_t* TraceRelay::Slabs::take() {
    constexpr size_t kSlab = HugeUninitAllocator<uint8_t>::kHuge;  // one huge page
    static_assert(kSlab % kBlock == 0);
    std::lock_guard<std::mutex> l(mu_);
    if (free_.empty()) {
        void* s = std::aligned_alloc(kSlab, kSlab);
        if (!s) throw std::bad_alloc();
        ::madvise(s, kSlab, MADV_HUGEPAGE);
        slabs_.push_back(s);
        // Handed out from the front: a run that needs few blocks touches one end.
        for (size_t at = kSlab; at > 0; at -= kBlock) free_.push_back(static_cast<uint8_t*>(s) + at - kBlock);
    }
    uint8_t* p = free_.back();
    free_.pop_back();
    return p;
}

void TraceRelay::Slabs::give(uint8_t* p) {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(p);
}

size_t TraceRelay::Slabs::slabs() const {
    std::lock_guard<std::mutex> l(mu_);
    return slabs_.size();
}

TraceRelay::TraceRelay(TraceSink& target, const TraceFilter& filter, SchedTap* tap)
    : writer_(target),
      tap_(tap),
      filter_(filter),
      plain_spans_(target.wants_plain_spans()),
      block_(SlabAllocator<uint8_t>(&slabs_)) {
    block_.resize(kBlock);
}

TraceRelay::~TraceRelay() { stop_thread(); }

void TraceRelay::start_thread() {
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "gilscan-trace");
        thread_loop();
    });
}

// Formats blocks as they come, until closing with none left or an error.
void TraceRelay::thread_loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> l(mu_);
            queued_.wait(l, [this] { return !full_.empty() || closing_; });
            if (full_.empty() || error_) return;
        }
        std::lock_guard<std::mutex> f(fmt_);
        if (format_front()) by_others_.fetch_add(1, std::memory_order_relaxed);
    }
}

void TraceRelay::stop_thread() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard<std::mutex> l(mu_);
        closing_ = true;
    }
    queued_.notify_one();
    thread_.join();
}

char* TraceRelay::room(size_t n) {
    if (used_ + n > block_.size()) {
        hand_off();
        if (n > block_.size()) block_.resize(n);  // one event larger than a block (a huge stack)
    }
    return reinterpret_cast<char*>(block_.data()) + used_;
}

void TraceRelay::check_error() {
    std::lock_guard<std::mutex> l(mu_);
    if (error_) std::rethrow_exception(error_);
}

void TraceRelay::hand_off() {
    if (used_ == 0) return;
    size_t queued;
    {
        std::lock_guard<std::mutex> l(mu_);
        if (error_) std::rethrow_exception(error_);
        full_.push_back({std::move(block_), used_});
        queued = full_.size();
    }
    if (thread_.joinable()) queued_.notify_one();
    // Full: nobody else had time for them. Format the oldest here (after the
    // one the reader may be formatting: fmt_ keeps the order).
    if (queued > kMaxQueued) {
        std::lock_guard<std::mutex> f(fmt_);
        if (format_front()) by_producer_.fetch_add(1, std::memory_order_relaxed);
    }
    Block next{SlabAllocator<uint8_t>(&slabs_)};
    {
        std::lock_guard<std::mutex> l(mu_);
        if (!spare_.empty()) {  // a formatted block (the one just formatted here, if so)
            next = std::move(spare_.back());
            spare_.pop_back();
        }
    }
    block_ = std::move(next);
    if (block_.size() < kBlock) block_.resize(kBlock);
    used_ = 0;
}

bool TraceRelay::format_some() {
    std::unique_lock<std::mutex> f(fmt_, std::try_to_lock);
    if (!f.owns_lock()) return false;
    if (!format_front()) return false;
    by_others_.fetch_add(1, std::memory_order_relaxed);
    return true;
}

bool TraceRelay::format_front() {
    Full b{Block(SlabAllocator<uint8_t>(&slabs_)), 0};
    {
        std::lock_guard<std::mutex> l(mu_);
        if (full_.empty() || error_) return false;
        b = std::move(full_.front());
        full_.pop_front();
    }
    try {
        replay(b.bytes, b.used);
    } catch (...) {
        std::lock_guard<std::mutex> l(mu_);
        error_ = std::current_exception();
        full_.clear();
        return false;
    }
    std::lock_guard<std::mutex> l(mu_);
    spare_.push_back(std::move(b.bytes));
    return true;
}

void TraceRelay::close() {
    hand_off();
    stop_thread();  // it formats what is queued first
    std::lock_guard<std::mutex> f(fmt_);
    while (format_front()) by_producer_.fetch_add(1, std::memory_order_relaxed);
    check_error();
}

void TraceRelay::replay(const Block& block, size_t used) {
    Unpack u{block.data()};
    const uint8_t* end = block.data() + used;
    while (u.p < end) {
        const auto op = static_cast<Op>(u.get<uint8_t>());
        switch (op) {
        case Op::Span: {
            Span s;
            s.tgid = u.get<int32_t>();
            s.tid = u.get<int32_t>();
            s.start = u.get<uint64_t>();
            s.end = u.get<uint64_t>();
            s.kind = static_cast<SpanKind>(u.get<uint8_t>());
            s.waker = u.get<int32_t>();
            s.cpu = u.get<uint32_t>();
            const auto flags = u.get<uint8_t>();
            s.cut_at_end = flags & kCut;
            s.woken_before_switch = flags & kWokenBeforeSwitch;
            s.preempted = flags & kPreempted;
            s.name = u.str();
            s.state = u.str();
            s.evidence = u.str();
            s.stack_stable = flags & kStackRef;
            s.stack_json = s.stack_stable ? u.ref() : u.str();
            if (flags & kFunction) s.function = u.str();
            writer_.span(s);
            break;
        }
        case Op::GilWait:
        case Op::GilLock: {
            const auto pid = u.get<int32_t>(), tid = u.get<int32_t>();
            const auto gil = u.get<uint32_t>();
            const auto start = u.get<uint64_t>(), stop = u.get<uint64_t>();
            const bool cut = u.get<uint8_t>() != 0;
            writer_.gil_span(pid, tid, op == Op::GilWait ? GilSpan::Wait : GilSpan::Lock, gil, start, stop, cut);
            break;
        }
        case Op::GilHolder: {
            const auto pid = u.get<int32_t>(), track = u.get<int32_t>(), holder = u.get<int32_t>();
            const auto start = u.get<uint64_t>(), stop = u.get<uint64_t>();
            const bool has_culprit = u.get<uint8_t>() != 0;
            writer_.gil_holder(pid, track, holder, start, stop, has_culprit ? u.str() : std::string_view());
            break;
        }
        case Op::GilWaiters: {
            const auto pid = u.get<int32_t>();
            const auto gil = u.get<uint32_t>();
            const auto ts = u.get<uint64_t>();
            writer_.gil_waiters(pid, gil, ts, u.get<uint32_t>());
            break;
        }
        case Op::SchedSwitch: {
            const auto cpu = u.get<uint32_t>();
            const auto t = u.get<uint64_t>();
            const auto cur = u.get<int32_t>();
            SchedSwitch sw;
            sw.prev_pid = u.get<int32_t>(), sw.next_pid = u.get<int32_t>();
            sw.prev_prio = u.get<int32_t>(), sw.next_prio = u.get<int32_t>();
            sw.prev_state = u.get<int64_t>();
            sw.prev_comm = u.str(), sw.next_comm = u.str();
            tap_->sched_switch(cpu, t, cur, sw);
            break;
        }
        case Op::SchedWake: {
            const auto cpu = u.get<uint32_t>();
            const auto t = u.get<uint64_t>();
            const auto cur = u.get<int32_t>();
            const auto kind = static_cast<TpKind>(u.get<uint8_t>());
            SchedWake w;
            w.pid = u.get<int32_t>(), w.target_cpu = u.get<int32_t>(), w.prio = u.get<int32_t>();
            w.comm = u.str();
            tap_->sched_wake(cpu, t, cur, kind, w);
            break;
        }
        case Op::SwitchIn: {
            const auto cpu = u.get<uint32_t>();
            const auto t = u.get<uint64_t>();
            const auto tid = u.get<int32_t>(), prio = u.get<int32_t>();
            tap_->switch_in(cpu, t, tid, prio, u.str());
            break;
        }
        case Op::NameThread: {
            const auto pid = u.get<int32_t>(), tid = u.get<int32_t>();
            writer_.name_thread(pid, tid, u.str());
            break;
        }
        }
    }
}

// One event: its Op, then its fields in order (as replay() reads them).
template <class... F>
void TraceRelay::append(Op op, const F&... fields) {
    char* p = room(1 + (field_size(fields) + ...));
    char* const start = p;
    p = put(p, static_cast<uint8_t>(op));
    ((p = put(p, fields)), ...);
    used_ += static_cast<size_t>(p - start);
}

void TraceRelay::span(const Span& s) {
    if (!filter_.wanted(s)) return;  // e.g. running spans without --running: most of them
    const auto flags = static_cast<uint8_t>((s.cut_at_end ? kCut : 0) | (s.woken_before_switch ? kWokenBeforeSwitch : 0) |
                                            (s.preempted ? kPreempted : 0) | (s.stack_stable ? kStackRef : 0) |
                                            (s.function.empty() ? 0 : kFunction));
    append(Op::Span, s.tgid, s.tid, s.start, s.end, static_cast<uint8_t>(s.kind), s.waker, s.cpu, flags, s.name,
           s.state, s.evidence, StackField{s.stack_json, s.stack_stable}, OptionalField{s.function});
}

void TraceRelay::name_thread(int32_t pid, int32_t tid, std::string_view name) {
    append(Op::NameThread, pid, tid, name);
}

void TraceRelay::gil_span(int32_t pid, int32_t tid, GilSpan what, uint32_t gil, uint64_t start_ns, uint64_t end_ns,
                          bool cut) {
    if (filter_.wanted(pid))
        append(what == GilSpan::Wait ? Op::GilWait : Op::GilLock, pid, tid, gil, start_ns, end_ns,
               static_cast<uint8_t>(cut));
}

void TraceRelay::gil_holder(int32_t pid, int32_t track_tid, int32_t holder, uint64_t start_ns, uint64_t end_ns,
                            std::string_view culprit) {
    if (filter_.wanted(pid))
        append(Op::GilHolder, pid, track_tid, holder, start_ns, end_ns, static_cast<uint8_t>(!culprit.empty()),
               OptionalField{culprit});
}

void TraceRelay::gil_waiters(int32_t pid, uint32_t gil, uint64_t ts_ns, uint32_t waiting) {
    if (filter_.wanted(pid)) append(Op::GilWaiters, pid, gil, ts_ns, waiting);
}

// The scheduler's events: all of them, as the timeline hands them to a tap
// (none without a tap to feed).
void TraceRelay::sched_switch(uint32_t cpu, uint64_t t, int32_t cur_tid, const SchedSwitch& sw) {
    if (!tap_) return;
    append(Op::SchedSwitch, cpu, t, cur_tid, sw.prev_pid, sw.next_pid, sw.prev_prio, sw.next_prio, sw.prev_state,
           sw.prev_comm, sw.next_comm);
}

void TraceRelay::sched_wake(uint32_t cpu, uint64_t t, int32_t cur_tid, TpKind kind, const SchedWake& w) {
    if (!tap_) return;
    append(Op::SchedWake, cpu, t, cur_tid, static_cast<uint8_t>(kind), w.pid, w.target_cpu, w.prio, w.comm);
}

void TraceRelay::switch_in(uint32_t cpu, uint64_t t, int32_t tid, int32_t prio, std::string_view comm) {
    if (tap_) append(Op::SwitchIn, cpu, t, tid, prio, comm);
}

}  // namespace gilscan
