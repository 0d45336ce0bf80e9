// perfgen — writes a valid perf.data that looks like a large real capture, for
// benchmarks: many CPUs and threads, sched_switch / sched_waking /
// sched_wakeup / sched_process_fork and take_gil / drop_gil uprobe events with
// plausible per-thread state sequences (a GIL per process, threads that wait
// for it, sleep inside take_gil, hold it, drop it, block on I/O and get
// preempted), written the way perf writes them: per-CPU runs inside rounds
// closed by FINISHED_ROUND.
//
//   perfgen --cpus 64 --threads 1000 --seconds 10 -o big.data
//   perfgen --events 200000 --pipe -z -o p.data
//   perfgen --stacks --events 50000 -o s.data      # REGS_USER/STACK_USER copied from real samples
//
// Attrs, event names (EVENT_DESC) and tracepoint formats (TRACING_DATA) are
// copied from a real recording made on this machine kind (--template; by
// default testdata/gil_combined.data, or testdata/stacks_py311.data with
// --stacks, whose sched_switch carries DWARF stacks). With --stacks each
// generated process gets the template Python's mappings, so the copied
// stacks unwind exactly as they did in the template. Records are encoded by
// test/support/perf_encode.h, the tests' writer's encoder.
#include "perfgen.h"

#include <random>
#include <set>

namespace perfgen {

enum class St { Runnable, RunNoGil, InTake, HoldGil, Sleeping, GilSleep };

struct Thread {
    int32_t pid, tid;
    St st = St::Runnable;
    bool in_take = false;  // switched out inside take_gil: resumes there
    uint64_t wake_at = 0;
    int cpu = -1;
};

class Gen {
public:
    Gen(const Args& a, Template& t) : a_(a), t_(t), rng_(a.seed) {}

    // Whole records (header + body) into the round, encoded by perf_encode.h.
    void record(uint32_t type, uint16_t misc, const Out& body) {
        const std::vector<uint8_t> r = test::record_bytes(false, type, misc, body.b);
        round_.insert(round_.end(), r.begin(), r.end());
    }

    // Non-sample records carry the sched_switch event's sample_id_all trailer.
    void trailer(Out& o, int32_t pid, int32_t tid, uint64_t time, uint32_t cpu) {
        test::put_id_trailer(o, {t_.sw.attr.sample_type, t_.sw.id, t_.sw.id}, pid, tid, time, cpu);
    }

    struct Field {
        const char* name;
        int64_t v;
        const char* str;
    };

    std::vector<uint8_t> raw(const Ev& e, std::initializer_list<Field> fields) {
        std::vector<test::RawValue> values;
        for (const Field& f : fields) values.push_back({f.name, f.v, f.str ? f.str : "", f.str != nullptr});
        return test::tracepoint_raw(*e.fmt, false, values, /*strict=*/false);
    }

    void sample(const Ev& e, int32_t pid, int32_t tid, uint32_t cpu, uint64_t time, const std::vector<uint8_t>& raw,
                const StackCopy* stack = nullptr) {
        test::SampleView v;
        v.id = e.id;
        v.ip = stack ? stack->ip : 0xffffffff81000000ull;
        v.pid = pid;
        v.tid = tid;
        v.time = time;
        v.addr = stack ? stack->addr : 0;
        v.stream_id = e.id;
        v.cpu = cpu;
        v.raw = raw;
        if (stack) {
            v.callchain = stack->callchain;
            v.regs_abi = stack->regs_abi;
            v.regs_user = stack->regs;
            v.stack = stack->stack;
            v.stack_reserved = stack->stack_size;
            v.data_src = stack->data_src;
        }
        Out o;
        test::put_sample_body(o, e.attr, v);
        record(PERF_RECORD_SAMPLE, 1 /* PERF_RECORD_MISC_KERNEL */, o);
        ++samples_;
    }

    void comm(int32_t pid, int32_t tid, const char* name, uint64_t time, bool exec) {
        Out o;
        test::put_comm_body(o, pid, tid, name);
        trailer(o, pid, tid, time, 0);
        record(PERF_RECORD_COMM, exec ? PERF_RECORD_MISC_COMM_EXEC : 0, o);
    }

    void fork_rec(int32_t pid, int32_t ppid, int32_t tid, int32_t ptid, uint64_t time) {
        Out o;
        test::put_task_body(o, pid, ppid, tid, ptid, time);
        trailer(o, pid, tid, time, 0);
        record(PERF_RECORD_FORK, 0, o);
    }

    void mmap2(int32_t pid, const MmapEvent& m, uint64_t time) {
        Out o;
        test::put_mmap2_body(o, {.pid = pid, .tid = pid, .start = m.start, .len = m.len, .pgoff = m.pgoff, .maj = m.maj,
                                 .min = m.min, .ino = m.ino, .ino_generation = m.ino_generation, .prot = m.prot,
                                 .flags = m.flags, .filename = m.filename});
        trailer(o, pid, pid, time, 0);
        record(PERF_RECORD_MMAP2, 2 /* USER */, o);
    }

    // Runs the simulation; `flush` receives each round's bytes (records + FINISHED_ROUND).
    template <class Flush>
    void run(Flush&& flush) {
        const unsigned nproc = processes_of(a_);
        const uint64_t end_time = a_.seconds > 0 ? static_cast<uint64_t>(a_.seconds * 1e9) : ~uint64_t{0};
        const uint64_t t0 = 1'000'000'000'000ull;  // a plausible CLOCK_MONOTONIC start
        threads_.reserve(a_.threads);
        for (unsigned i = 0; i < a_.threads; ++i) {
            int32_t pid = a_.pid_base + static_cast<int32_t>(i % nproc) * 1000;
            int32_t tid = pid + static_cast<int32_t>(i / nproc);
            threads_.push_back(Thread{pid, tid});
        }
        holder_.assign(nproc, -1);
        // Every thread starts runnable; the indexes below follow each change of state.
        for (uint32_t i = 0; i < threads_.size(); ++i) runnable_.insert(runnable_.end(), i);
        gil_sleepers_.assign(nproc, {});
        inv_step_ = inverse_mod(kHandStep, threads_.size());
        // Synthesized task records, as perf writes them at the start.
        for (unsigned p = 0; p < nproc; ++p) {
            int32_t pid = threads_[p].pid;
            comm(pid, pid, "python3", t0, true);
            if (a_.stacks)
                for (const auto& m : t_.maps) mmap2(pid, m, t0);
        }
        for (const auto& th : threads_)
            if (th.tid != th.pid) {
                fork_rec(th.pid, th.pid, th.tid, th.pid, t0);
                comm(th.pid, th.tid, "python3", t0, false);
            }
        std::vector<uint64_t> cpu_time(a_.cpus, t0);
        std::vector<int> running(a_.cpus, -1);
        std::vector<std::vector<uint8_t>> per_cpu(a_.cpus);
        uint64_t round_end = t0 + 50'000'000;  // 50 ms rounds
        flush(round_);
        round_.clear();
        std::uniform_int_distribution<int> pct(0, 99);
        std::uniform_int_distribution<uint64_t> small(2'000, 60'000);
        auto take_runnable = [&]() -> int {
            // Rotate through threads: the next runnable one after the cursor
            // (an ordered index of the runnable ones: a scan of every thread
            // made generating 400,000 threads take 16 minutes).
            if (runnable_.empty()) return -1;
            auto it = runnable_.lower_bound(static_cast<uint32_t>(rr_ % threads_.size()));
            if (it == runnable_.end()) it = runnable_.begin();
            const size_t i = *it;
            rr_ = i + 1;
            return static_cast<int>(i);
        };
        // Each CPU's next action time is drawn ahead; the earliest acts, so
        // events come out in global time order (a step's own events are 1 ns apart).
        for (auto& ct : cpu_time) ct += small(rng_);
        while (samples_ < a_.events || a_.seconds > 0) {
            unsigned c = 0;
            for (unsigned k = 1; k < a_.cpus; ++k)
                if (cpu_time[k] < cpu_time[c]) c = k;
            const uint64_t t = cpu_time[c];
            if (t - t0 > end_time) break;
            std::swap(round_, per_cpu[c]);
            step(c, t, running, take_runnable, pct);
            std::swap(round_, per_cpu[c]);
            cpu_time[c] = t + 16 + small(rng_);
            if (t >= round_end) {
                // perf writes each CPU's buffer in turn, then FINISHED_ROUND.
                for (auto& b : per_cpu) {
                    round_.insert(round_.end(), b.begin(), b.end());
                    b.clear();
                }
                Out none;
                record(PERF_RECORD_FINISHED_ROUND, 0, none);
                flush(round_);
                round_.clear();
                round_end += 50'000'000;
            }
        }
        for (auto& b : per_cpu) round_.insert(round_.end(), b.begin(), b.end());
        Out none;
        record(PERF_RECORD_FINISHED_ROUND, 0, none);
        flush(round_);
        round_.clear();
    }

    uint64_t samples() const { return samples_; }

private:
    template <class TakeRunnable, class Pct>
    void step(unsigned c, uint64_t t, std::vector<int>& running, TakeRunnable& take_runnable, Pct& pct) {
        // Wake threads whose I/O finished (from this CPU's context).
        for (int k = 0; k < 4; ++k) {
            size_t i = rng_() % threads_.size();
            Thread& w = threads_[i];
            if (w.st == St::Sleeping && w.wake_at <= t) wake(c, t, running[c], static_cast<int>(i));
        }
        int cur = running[c];
        if (cur < 0) {  // idle: schedule someone
            int n = take_runnable();
            if (n < 0) return;
            switch_(c, t, -1, 0, n, running);
            return;
        }
        Thread& th = threads_[static_cast<size_t>(cur)];
        const size_t proc = proc_of(th);
        const int r = pct(rng_);
        switch (th.st) {
        case St::RunNoGil:
            ev(t_.take, th, c, t);
            set_st(cur, St::InTake);
            break;
        case St::InTake:
            if (holder_[proc] < 0) {
                ev(t_.take_ret, th, c, t);
                holder_[proc] = cur;
                set_st(cur, St::HoldGil);
            } else {
                // Waits for the GIL asleep in take_gil; woken when the holder drops.
                set_st(cur, St::GilSleep);
                th.in_take = true;
                int n = take_runnable();
                switch_(c, t, cur, 1, n, running);
            }
            break;
        case St::HoldGil:
            if (r < 70) break;  // keeps running Python
            ev(t_.drop, th, c, t);
            ev(t_.drop_ret, th, c, t + 2);
            holder_[proc] = -1;
            // Hand the GIL over: wake one thread asleep in take_gil of this process.
            if (const int i = next_gil_sleeper(proc); i >= 0) {
                set_st(i, St::Sleeping);
                threads_[static_cast<size_t>(i)].wake_at = 0;
                wake(c, t + 3, cur, i);
            }
            if (r < 85) {  // blocking I/O: sleep without the GIL
                set_st(cur, St::Sleeping);
                th.wake_at = t + 50'000 + rng_() % 2'000'000;
                int n = take_runnable();
                switch_(c, t + 6, cur, 1, n, running);
            } else if (r < 90) {  // preempted
                set_st(cur, St::Runnable);
                int n = take_runnable();
                switch_(c, t + 6, cur, 0, n, running);
            } else {
                set_st(cur, St::RunNoGil);
            }
            break;
        default: break;
        }
    }

    // Index of a thread's process: pids are pid_base + 1000 * process.
    size_t proc_of(const Thread& th) const { return static_cast<size_t>((th.pid - a_.pid_base) / 1000); }

    // Every change of a thread's state goes through here, to keep the
    // runnable index and the per-process take_gil sleepers in step.
    void set_st(int index, St st) {
        const auto i = static_cast<uint32_t>(index);
        Thread& th = threads_[i];
        const size_t proc = proc_of(th);
        if (th.st == St::Runnable) runnable_.erase(i);
        if (th.st == St::GilSleep) gil_sleepers_[proc].erase(i);
        th.st = st;
        if (st == St::Runnable) runnable_.insert(i);
        if (st == St::GilSleep) gil_sleepers_[proc].insert(i);
    }

    // The take_gil sleeper of process `proc` that the original probe order
    // meets first: i = (proc + k * kHandStep) % n for k = 0, 1, ... . With
    // kHandStep invertible mod n, each sleeper's k is (i - proc) / kHandStep
    // mod n, so the first one is the sleeper with the smallest k; otherwise
    // (n a multiple of the prime 7919) the probe order is walked as it was.
    int next_gil_sleeper(size_t proc) const {
        const auto& sleepers = gil_sleepers_[proc];
        if (sleepers.empty()) return -1;
        const uint64_t n = threads_.size();
        if (inv_step_ == 0) {
            for (uint64_t k = 0; k < n; ++k) {
                const uint64_t i = (proc + k * kHandStep) % n;
                if (sleepers.count(static_cast<uint32_t>(i))) return static_cast<int>(i);
            }
            return -1;
        }
        int best = -1;
        uint64_t best_k = n;
        for (uint32_t i : sleepers) {
            const uint64_t k = ((i + n - proc % n) % n) * inv_step_ % n;
            if (k < best_k) {
                best_k = k;
                best = static_cast<int>(i);
            }
        }
        return best;
    }

    // x with a * x = 1 (mod n), or 0 when a has no inverse mod n (n = 1: 0 works as 1).
    static uint64_t inverse_mod(uint64_t a, uint64_t n) {
        if (n <= 1) return 1;
        int64_t t = 0, new_t = 1, r = static_cast<int64_t>(n), new_r = static_cast<int64_t>(a % n);
        while (new_r != 0) {
            const int64_t q = r / new_r;
            t -= q * new_t;
            std::swap(t, new_t);
            r -= q * new_r;
            std::swap(r, new_r);
        }
        if (r != 1) return 0;
        return static_cast<uint64_t>(t < 0 ? t + static_cast<int64_t>(n) : t);
    }

    void ev(const Ev& e, const Thread& th, unsigned c, uint64_t t) {
        if (e.index < 0) return;
        const bool ret = e.fmt && e.fmt->field("__probe_ret_ip");
        std::vector<uint8_t> r = ret ? raw(e, {{"__probe_func", 0x7f0000100000, nullptr}, {"__probe_ret_ip", 0x7f0000100400, nullptr}})
                                     : raw(e, {{"__probe_ip", 0x7f0000100000, nullptr}});
        sample(e, th.pid, th.tid, c, t, r);
    }

    void wake(unsigned c, uint64_t t, int waker, int target) {
        Thread& w = threads_[static_cast<size_t>(target)];
        int32_t wpid = waker >= 0 ? threads_[static_cast<size_t>(waker)].pid : 0;
        int32_t wtid = waker >= 0 ? threads_[static_cast<size_t>(waker)].tid : 0;
        auto r = [&](const Ev& e) {
            return raw(e, {{"comm", 0, "python3"}, {"pid", w.tid, nullptr}, {"prio", 120, nullptr},
                           {"target_cpu", static_cast<int64_t>(c), nullptr}});
        };
        if (t_.waking.index >= 0) sample(t_.waking, wpid, wtid, c, t, r(t_.waking));
        if (t_.wakeup.index >= 0) sample(t_.wakeup, wpid, wtid, c, t + 1, r(t_.wakeup));
        set_st(target, St::Runnable);
    }

    void switch_(unsigned c, uint64_t t, int prev, int64_t state, int next, std::vector<int>& running) {
        const Thread* p = prev >= 0 ? &threads_[static_cast<size_t>(prev)] : nullptr;
        const Thread* n = next >= 0 ? &threads_[static_cast<size_t>(next)] : nullptr;
        std::vector<uint8_t> r = raw(t_.sw, {{"prev_comm", 0, p ? "python3" : "swapper/0"},
                                             {"prev_pid", p ? p->tid : 0, nullptr},
                                             {"prev_prio", 120, nullptr},
                                             {"prev_state", state, nullptr},
                                             {"next_comm", 0, n ? "python3" : "swapper/0"},
                                             {"next_pid", n ? n->tid : 0, nullptr},
                                             {"next_prio", 120, nullptr}});
        const StackCopy* stack = nullptr;
        if (a_.stacks && p && state == 1 && !t_.stacks.empty()) stack = &t_.stacks[rng_() % t_.stacks.size()];
        sample(t_.sw, p ? p->pid : 0, p ? p->tid : 0, c, t, r, stack);
        running[c] = next;
        if (n) {
            Thread& nt = threads_[static_cast<size_t>(next)];
            set_st(next, nt.in_take ? St::InTake : St::RunNoGil);  // back where it slept
            nt.in_take = false;
        }
    }

    const Args& a_;
    Template& t_;
    std::mt19937_64 rng_;
    std::vector<Thread> threads_;
    std::vector<int> holder_;
    static constexpr uint64_t kHandStep = 7919;  // the GIL hand-over's probe stride (a prime)
    std::set<uint32_t> runnable_;                  // indices of St::Runnable threads
    std::vector<std::set<uint32_t>> gil_sleepers_;  // by process: St::GilSleep threads
    uint64_t inv_step_ = 0;                        // kHandStep^-1 mod threads, 0: none
    std::vector<uint8_t> round_;
    size_t rr_ = 0;
    uint64_t samples_ = 0;
};

}  // namespace perfgen

using namespace perfgen;

int main(int argc, char** argv) {
    const Args a = parse_args(argc, argv);
    try {
        Template t(a.tmpl);
        if (!t.sw.fmt) usage("the template has no sched:sched_switch");
        if (a.stacks && t.stacks.empty()) usage("--stacks needs a template whose sched_switch carries user stacks");
        FileWriter out(a, a.tmpl);
        out.begin();
        Gen g(a, t);
        g.run([&out](const std::vector<uint8_t>& bytes) { out.data(bytes); });
        out.end();
        std::fprintf(stderr, "perfgen: %s: %llu samples, %llu data bytes%s%s%s\n", a.out.c_str(),
                     static_cast<unsigned long long>(g.samples()), static_cast<unsigned long long>(out.data_bytes()),
                     a.pipe ? ", pipe mode" : "", a.zstd ? ", zstd" : "", a.stacks ? ", with stacks" : "");
    } catch (const Error& e) {
        std::fprintf(stderr, "perfgen: %s\n", e.what());
        return 1;
    }
    return 0;
}
