#include "gilscan/gil/reader_stacks.h"

#include "gilscan/perfdata/perf_abi.h"

namespace gilscan {

ReaderStacks::ReaderStacks(ModuleCache& modules, std::shared_ptr<GilStackClassifier::NameCache> names,
                           unsigned stack_frames, const RecordedKernel& kernel, bool swap, bool stop_at_probes)
    : gsc_(nullptr, modules, stack_frames, kernel, std::move(names)),
      swap_(swap),
      stop_at_probes_(stop_at_probes) {
    maps_.set_kernel_log(kernel.maps);  // the same maps as the stages' ProcessMaps logs: no change
    gsc_.set_never_wait(true);  // a sleep whose label would wait for the stages is theirs: the reader reads on
}

const void* ReaderStacks::on_record(const RawRecord& r, const EventInfo& ev, bool spare) {
    // Decoded as Session::deliver decodes them; what does not decode is
    // skipped there too. The address spaces follow every record, spare time
    // or not: a sleep classified later must see the mappings of its moment.
    try {
        switch (r.type) {
        case PERF_RECORD_MMAP:
        case PERF_RECORD_MMAP2: {
            MmapEvent e;
            decode_mmap(r.body, r.type, r.misc, ev.attr, swap_, e);
            maps_.on_mmap(e);
            return nullptr;
        }
        case PERF_RECORD_COMM: {
            CommEvent e;
            decode_comm(r.body, r.misc, ev.attr, swap_, e);
            maps_.on_comm(e);
            return nullptr;
        }
        case PERF_RECORD_FORK: {
            TaskEvent e;
            decode_task(r.body, ev.attr, swap_, e);
            maps_.on_fork(e);
            return nullptr;
        }
        case PERF_RECORD_SAMPLE: break;
        default: return nullptr;
        }
        if (probes_seen_ || !(spare || always_)) {
            // Only a GIL probe's sample matters now (it ends the work here);
            // scheduler samples are left to the stages.
            if (!stop_at_probes_ || probes_seen_ || !is_gil_probe(ev.gil_kind)) return nullptr;
        }
        // Only a sched_switch (or a probe, above) can be classified here:
        // the rest (wake-ups, half of a DWARF capture's samples) are not
        // parsed for nothing.
        if (ev.kind != TpKind::SchedSwitch && !(stop_at_probes_ && is_gil_probe(ev.gil_kind))) return nullptr;
        const size_t i = static_cast<size_t>(ev.index);
        if (samples_.size() <= i) samples_.resize(i + 1);
        Sample& s = samples_[i];
        parse_sample(Cursor(r.body, swap_, nullptr, r.offset + 8), ev.attr, s);
        return classify(s, ev);
    } catch (const Error&) {
        return nullptr;  // malformed: counted (and skipped) by the stages
    }
}

const ReaderStacks::Note* ReaderStacks::classify(const Sample& s, const EventInfo& ev) {
    // The same tests, in the same order, as the stages' path to a stack
    // classification: GilTracker (a probe sample), Timeline::on_sample (a
    // decodable sched_switch of a real task into S), and pipeline.cc's
    // classifier (user registers and stack recorded).
    if (stop_at_probes_ && s.tid > 0 && is_gil_probe(ev.gil_kind)) {
        probes_seen_ = true;
        return nullptr;
    }
    if (ev.kind != TpKind::SchedSwitch) return nullptr;
    SchedSwitch sw;
    if (!dec_.decode(s, ev, swap_, sw) || sw.prev_pid <= 0) return nullptr;
    if (dec_.prev_state(ev, sw.prev_state).cls != StateClass::Sleeping) return nullptr;
    if (s.regs_user_abi == 0 || s.stack_user.empty()) return nullptr;
    Note* n;
    if (free_.empty()) {
        notes_.push_back(std::make_unique<Note>());
        n = notes_.back().get();
    } else {
        n = free_.back();
        free_.pop_back();
    }
    const StackStats before = gsc_.stats();
    n->label.text = text_;  // kept by classify_into's clear()
    gsc_.classify_into(maps_.space(s.pid), s, n->label);
    if (gsc_.abandoned()) {
        free_.push_back(n);
        ++abandoned_;
        return nullptr;
    }
    n->delta = gsc_.stats();
    n->delta -= before;
    ++made_;
    return n;
}

void ReaderStacks::release(const void* note) {
    // Only this stage's notes come back here, once each.
    free_.push_back(const_cast<Note*>(static_cast<const Note*>(note)));
}

}  // namespace gilscan
