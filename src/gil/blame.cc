#include "gilscan/gil/blame.h"

#include <algorithm>

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

GilBlame::GilBlame(const ProcessMaps& maps, BlameStacks& stacks) : maps_(maps), stacks_(stacks) {}

GilBlame::Thread& GilBlame::thread(int32_t pid, int32_t tid) {
    Thread* const* p = threads_.find(tid);
    Thread& th = p ? **p : all_.emplace_back();
    if (!p) {
        th.tid = tid;
        threads_.set(tid, &th);
    }
    if (pid > 0 && th.pid != pid) {
        th.pid = pid;
        th.process_gil = nullptr;
    }
    return th;
}

GilBlame::Gil& GilBlame::gil_of(int32_t pid, uint32_t index) {
    auto [it, added] = gils_.try_emplace({pid, index});
    if (added) it->second.pid = pid;
    return it->second;
}

void GilBlame::book(int32_t pid, int32_t tid, uint32_t stack, uint64_t on, uint64_t off, uint64_t hold) {
    if (on + off + hold == 0) return;
    BlameCharge& c = charges_[{pid, stack}];
    c.pid = pid;
    c.stack = stack;
    c.on_cpu_ns += on;
    c.off_cpu_ns += off;
    c.hold_ns += hold;
    if (on + off) c.tids.insert(tid);
}

void GilBlame::note_hold(Thread& th, uint32_t stack, uint64_t contended) {
    if (!th.holds || contended == 0) return;
    for (auto& [id, ns] : th.hold_stacks)
        if (id == stack) {
            ns += contended;
            return;
        }
    th.hold_stacks.emplace_back(stack, contended);
}

std::string_view GilBlame::hold_culprit(int32_t pid, uint32_t index, int32_t holder, uint64_t t, void*& cookie) {
    if (!probes_) return {};
    Gil& g = cookie ? *static_cast<Gil*>(cookie) : gil_of(pid, index);
    cookie = &g;
    advance(g, t);  // the hold's last stretch, under the state before t
    if (!g.holder_th || g.holder != holder) return {};
    const Thread& th = *g.holder_th;
    uint32_t best = ~0u;
    uint64_t most = 0;
    auto consider = [&](uint32_t id, uint64_t ns) {
        if (id >= BlameStacks::kFirstStack && ns > most) {
            best = id;
            most = ns;
        }
    };
    for (const auto& [id, ns] : th.hold_stacks) consider(id, ns + (id == th.hold_sample ? th.sure.on_pending : 0));
    if (th.hold_sample != ~0u) consider(th.hold_sample, th.sure.on_pending);
    if (best == ~0u) return {};
    const BlameStack& b = stacks_.stack(best);
    return b.python.empty() ? std::string_view(b.native) : std::string_view(b.python);
}

// The stack of the sleep th is in, unwound the first time it is charged.
uint32_t GilBlame::off_stack(Thread& th) {
    if (th.off_stack != ~0u) return th.off_stack;
    th.off_stack = BlameStacks::kNoStack;
    if (th.off_valid && th.off_sample->space)
        th.off_stack = stacks_.resolve(*th.off_sample->space, th.off_sample->sample, false);
    return th.off_stack;
}

// contended (and, with uprobes, all) hold time of th's current activity:
// uprobes book it (off CPU) or keep it for the next sample (on CPU);
// inferred keeps it in `to` until a commit says whether th held.
void GilBlame::charge(Thread& th, uint64_t contended, uint64_t held, Tally& to) {
    switch (th.act) {
    case Act::OnCpu:
        to.on_pending += contended;
        to.hold_on_pending += held;
        break;
    case Act::OffCpu:
    case Act::Unknown:
        if (probes_) {
            const uint32_t id = th.act == Act::OffCpu ? off_stack(th) : BlameStacks::kUnknown;
            book(th.pid, th.tid, id, 0, contended, held);
            note_hold(th, id, contended);
        } else if (contended) {
            // The same sleep is charged at every catch-up: one entry for it.
            const uint32_t id = th.act == Act::Unknown ? BlameStacks::kUnknown
                                : th.off_valid          ? ~0u
                                                        : BlameStacks::kNoStack;
            if (!to.off.empty() && to.off.back().id == id && (id != ~0u || to.off.back().copy == th.off_sample))
                to.off.back().ns += contended;
            else
                to.off.push_back({id == ~0u ? th.off_sample : nullptr, id, contended});
        }
        break;
    case Act::Waiting: break;  // a waiter holds nothing
    }
}

void GilBlame::advance(Gil& g, uint64_t t) {
    if (t <= g.since) return;
    const uint64_t d = window_ ? window_->overlap(g.since, t) : t - g.since;
    g.since = t;
    if (!probes_) {
        if (g.waiters) g.contended += d;
        return;
    }
    if (g.holder_th) charge(*g.holder_th, g.waiters ? d : 0, d, g.holder_th->sure);
}

void GilBlame::catch_up(Thread& th, uint64_t t) {
    if (probes_) {
        if (th.holds) advance(*th.holds, t);
        return;
    }
    if (!th.process_gil) {
        if (th.pid <= 0) return;
        auto it = gils_.find({th.pid, 0});
        if (it == gils_.end()) return;  // no GIL wait in its process yet
        th.process_gil = &it->second;
    }
    Gil& g = *th.process_gil;
    advance(g, t);
    if (!th.synced) {  // first seen now: on CPU since the last commit, as far as anything says
        th.synced = true;
        th.epoch = g.epoch;
        th.base = g.epoch_base;
    }
    if (th.epoch != g.epoch) {  // a commit since: what it had was not a hold
        th.maybe.clear();
        th.base = std::max(th.base, g.epoch_base);
        th.epoch = g.epoch;
    }
    if (g.contended > th.base) charge(th, g.contended - th.base, 0, th.maybe);
    th.base = g.contended;
}

void GilBlame::commit(Gil& g, Thread& w, uint64_t t) {
    catch_up(w, t);
    for (const Tally::Off& o : w.maybe.off) {
        uint32_t id = o.id;
        if (id == ~0u) id = o.copy && o.copy->space ? stacks_.resolve(*o.copy->space, o.copy->sample, false) : BlameStacks::kNoStack;
        book(w.pid, w.tid, id, 0, o.ns, 0);
    }
    for (const auto& [stack, ns] : w.maybe.on) book(w.pid, w.tid, stack, ns, 0, 0);
    w.sure.on_pending += w.maybe.on_pending;
    w.maybe.clear();
    ++g.epoch;
    g.epoch_base = g.contended;
    w.epoch = g.epoch;
}

void GilBlame::set_act(Thread& th, uint64_t t, Act a) {
    catch_up(th, t);
    th.act = a;
    th.off_stack = ~0u;
    th.off_valid = false;  // off_sample kept: its buffer is reused
}

void GilBlame::gil_state(int32_t pid, uint32_t index, uint64_t t, int32_t holder, uint32_t waiters, void*& cookie) {
    if (!probes_) {  // the first probe: the uprobes name holders from now on
        probes_ = true;
        for (const Thread& th : all_) threads_.erase(th.tid);
        all_.clear();
        gils_.clear();
        charges_.clear();
        waits_.clear();
        cookie = nullptr;
    }
    Gil& g = cookie ? *static_cast<Gil*>(cookie) : gil_of(pid, index);
    cookie = &g;
    advance(g, t);
    if (g.holder != holder) {
        if (g.holder_th) g.holder_th->holds = nullptr;
        g.holder_th = nullptr;
        if (holder > 0) {
            Thread& h = thread(pid, holder);
            h.holds = &g;
            h.hold_stacks.clear();
            h.hold_sample = ~0u;
            g.holder_th = &h;
        }
    }
    g.holder = holder;
    g.waiters = waiters;
}

void GilBlame::sleep_started(int32_t pid, int32_t tid, uint64_t t, const SleepLabel& label, const Sample& s) {
    Thread& th = thread(pid, tid);
    if (label.name == "S(GIL handoff)") {  // drop_gil waiting for the taker: the GIL is released
        set_act(th, t, Act::Waiting);
        return;
    }
    if (label.gil) {
        set_act(th, t, Act::Waiting);
        if (!probes_ && th.pid > 0) {
            Gil& g = gil_of(th.pid, 0);
            advance(g, t);
            ++g.waiters;
            // A thread that waits for the GIL let it go before: had it held
            // it while another waited, it would have woken that one
            // (drop_gil's signal) and committed. What it did since the last
            // hand-off was not a hold.
            th.maybe.clear();
        }
        th.wait_since = t;
        if (wait_stacks_) th.wait_sample = std::make_shared<SampleCopy>(maps_.snapshot(pid), s);
        return;
    }
    set_act(th, t, Act::OffCpu);
    // The stack is copied now and unwound only if the sleep is charged:
    // with uprobes only a holder's sleep can be; inferred, any thread's of a
    // process that waits for its GIL.
    const bool may_charge = probes_ ? th.holds != nullptr : gils_.count({th.pid, 0}) > 0;
    if (!may_charge) return;
    // A copy no charge holds any more is refilled: a sleep's 8 KiB stack
    // without an allocation.
    if (th.off_sample && th.off_sample.use_count() == 1) th.off_sample->assign(maps_.snapshot(pid), s);
    else th.off_sample = std::make_shared<SampleCopy>(maps_.snapshot(pid), s);
    th.off_valid = true;
}

void GilBlame::sleep_ended(int32_t pid, int32_t tid, uint64_t t, int32_t waker_pid, int32_t waker, bool gil_wait) {
    Thread& th = thread(pid, tid);
    if (gil_wait && th.act == Act::Waiting) {
        const uint64_t waited = t <= th.wait_since ? 0 : window_ ? window_->overlap(th.wait_since, t) : t - th.wait_since;
        if (th.wait_sample && th.wait_sample->space && waited) {
            const uint32_t id = stacks_.resolve(*th.wait_sample->space, th.wait_sample->sample, false);
            waits_[{th.pid, id}] += waited;
        }
        th.wait_sample.reset();
        if (!probes_ && th.pid > 0) {
            Gil& g = gil_of(th.pid, 0);
            advance(g, t);
            if (g.waiters) --g.waiters;
            // drop_gil's signal: the waker held the GIL until now.
            if (waker > 0 && waker != tid && waker_pid == th.pid) commit(g, thread(waker_pid, waker), t);
        }
    }
    set_act(th, t, Act::OnCpu);
}

void GilBlame::thread_gone(int32_t pid, int32_t tid, uint64_t t) {
    Thread& th = thread(pid, tid);
    if (th.act == Act::Waiting && !probes_ && th.pid > 0) {
        Gil& g = gil_of(th.pid, 0);
        advance(g, t);
        if (g.waiters) --g.waiters;
    }
    set_act(th, t, Act::Unknown);
}

void GilBlame::cpu_sample(const Sample& s, const EventInfo& ev) {
    // What samples CPU time: cpu-clock, task-clock, or a hardware counter (cycles, ...).
    const uint32_t type = ev.attr.type;
    const bool clock = type == PERF_TYPE_SOFTWARE &&
                       (ev.attr.config == PERF_COUNT_SW_CPU_CLOCK || ev.attr.config == PERF_COUNT_SW_TASK_CLOCK);
    if (!clock && type != PERF_TYPE_HARDWARE && type != PERF_TYPE_RAW) return;
    ++cpu_samples_;
    Thread& th = thread(s.pid, s.tid);
    catch_up(th, s.time);
    if (th.sure.on_pending + th.sure.hold_on_pending + th.maybe.on_pending == 0) return;
    const AddressSpace* as = maps_.space(s.pid);
    const uint32_t id = as ? stacks_.resolve(*as, s, true) : BlameStacks::kSampleNoStack;
    book(th.pid, th.tid, id, th.sure.on_pending, 0, th.sure.hold_on_pending);
    note_hold(th, id, th.sure.on_pending);
    if (th.holds) th.hold_sample = id;
    th.sure.on_pending = th.sure.hold_on_pending = 0;
    if (th.maybe.on_pending) th.maybe.on.emplace_back(id, th.maybe.on_pending);
    th.maybe.on_pending = 0;
}

void GilBlame::finish(uint64_t end) {
    for (auto& [key, g] : gils_) advance(g, end);
    for (Thread& th : all_) {
        catch_up(th, end);
        // On-CPU time no sample came after.
        book(th.pid, th.tid, BlameStacks::kNoSample, th.sure.on_pending, 0, th.sure.hold_on_pending);
        th.sure.clear();
    }
    if (!probes_)
        for (auto& [key, g] : gils_) unattributed_ns_ += g.contended - g.epoch_base;
}

std::vector<BlameCharge> GilBlame::charges() const {
    std::vector<BlameCharge> out;
    out.reserve(charges_.size());
    for (const auto& [key, c] : charges_) out.push_back(c);
    return out;
}

std::map<int32_t, uint64_t> GilBlame::waiting_ns() const {
    std::map<int32_t, uint64_t> out;
    if (!probes_)
        for (const auto& [key, g] : gils_) out[g.pid] += g.contended;
    return out;
}

std::vector<BlameRow> blame_rows(const std::vector<BlameCharge>& charges, const BlameStacks& stacks, bool inferred) {
    struct Group {
        BlameRow row;
        std::set<int32_t> tids;
        std::map<std::pair<std::string, std::string>, uint64_t> natives;  // (native, module) -> ns
    };
    std::map<std::pair<int32_t, std::string>, Group> groups;
    for (const BlameCharge& c : charges) {
        if (c.contended_ns() == 0 && c.hold_ns == 0) continue;
        const BlameStack& st = stacks.stack(c.stack);
        const bool py = !st.python.empty();
        Group& g = groups[{c.pid, py ? st.python : st.native}];
        g.row.pid = c.pid;
        g.row.function = py ? st.python : st.native;
        g.row.python = py;
        g.row.on_cpu_ns += c.on_cpu_ns;
        g.row.off_cpu_ns += c.off_cpu_ns;
        if (!inferred) g.row.hold_ns = g.row.hold_ns.value_or(0) + c.hold_ns;
        g.row.inferred = inferred;
        g.tids.insert(c.tids.begin(), c.tids.end());
        g.natives[{st.native, st.module}] += c.contended_ns() ? c.contended_ns() : c.hold_ns;
    }
    std::vector<BlameRow> rows;
    for (auto& [key, g] : groups) {
        if (g.row.contended_ns() == 0) continue;  // held only while no one waited
        auto top = std::max_element(g.natives.begin(), g.natives.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
        g.row.native = top->first.first;
        g.row.module = top->first.second;
        g.row.threads = static_cast<uint32_t>(g.tids.size());
        rows.push_back(std::move(g.row));
    }
    std::stable_sort(rows.begin(), rows.end(), [](const BlameRow& a, const BlameRow& b) {
        return a.contended_ns() != b.contended_ns() ? a.contended_ns() > b.contended_ns()
                                                    : a.hold_ns.value_or(0) > b.hold_ns.value_or(0);
    });
    return rows;
}

}  // namespace gilscan
