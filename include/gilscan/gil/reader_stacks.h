// Stage (reader thread, -j 2): sleep stacks classified ahead of the stages
// while the reader has time to spare.
//
//   ReaderStacks ahead(modules, names, sleep_stacks, release, session.swap(), /*stop_at_probes=*/true);
//   session.set_reader_stage(&ahead);
//   // in the sleep classifier, on the stages' thread:
//   if (const ReaderStacks::Note* n = ReaderStacks::note_of(sample)) { label = n->label; stats += n->delta; }
//   else gsc.classify(...);
//
// At -j 2 the reader thread frames and orders records and the stages' thread
// does everything else; on a --call-graph dwarf capture the stages have
// about three times the reader's work, most of it unwinding and naming
// sleep stacks. This stage keeps its own copy of the address spaces (the
// same MMAP/COMM/FORK records, in the same order, as the stages' ProcessMaps
// sees) and, while batches wait for the stages, classifies each switch-out
// into S right in the read chunk: no stack is copied, and the label rides to
// the stages with the record. The stages classify any sleep it left out,
// and any it began but would have had to wait for (a frame the stages are
// naming at that moment, /proc/kallsyms still being read): the reader never
// waits for the stages' thread, it names that sleep's other frames for them
// and reads on. A
// label is a function of the sample and its address space, and frame names
// come from the cache the two classifiers share, so who computes a label
// changes nothing in the output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gilscan/gil/gil_stacks.h"
#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/process_maps.h"
#include "gilscan/sched/sched_events.h"
#include "gilscan/perfdata/session.h"

namespace gilscan {

class ReaderStacks : public ReaderStage {
public:
    struct Note {
        SleepLabel label;
        StackStats delta;  // what classifying it added to the classifier's counts
    };

    // stop_at_probes: GIL uprobes win once seen (--gil-evidence auto): the
    // stages then ignore stacks, so from the first probe sample on nothing
    // more is unwound here.
    ReaderStacks(ModuleCache& modules, std::shared_ptr<GilStackClassifier::NameCache> names, unsigned stack_frames,
                 const RecordedKernel& kernel, bool swap, bool stop_at_probes);

    const void* on_record(const RawRecord& r, const EventInfo& ev, bool spare) override;
    void release(const void* note) override;
    // Make a note for every sleep, spare time or not (tests: the path is then taken whatever the timing).
    void set_always(bool on) { always_ = on; }
    // Wait for the stages' thread where a label needs it (a frame it is
    // naming, /proc/kallsyms being read) instead of leaving the sleep to
    // them: every sleep is then the reader's whatever the timing (tests
    // that count them, with set_always). Default: never wait.
    void set_wait(bool on) { gsc_.set_never_wait(!on); }
    // Whether the labels' texts are read (SleepLabel::text; default true):
    // false for a summary-only run, whose notes then carry no evidence text.
    void set_text(bool on) { text_ = on; }
    // GIL waits' Python functions in the labels (GilStackClassifier::set_gil_functions).
    void set_gil_functions(bool on) { gsc_.set_gil_functions(on); }

    static const Note* note_of(const Sample& s) { return static_cast<const Note*>(s.note); }
    uint64_t notes_made() const { return made_; }
    // Sleeps begun here and left to the stages: their labels would have
    // waited for the stages' thread (GilStackClassifier::set_never_wait).
    uint64_t notes_abandoned() const { return abandoned_; }

private:
    const Note* classify(const Sample& s, const EventInfo& ev);

    ProcessMaps maps_;
    TracepointDecoder dec_;
    GilStackClassifier gsc_;
    std::vector<Sample> samples_;       // by event index, reused
    std::vector<std::unique_ptr<Note>> notes_;
    std::vector<Note*> free_;
    bool swap_;
    bool stop_at_probes_;
    bool probes_seen_ = false;
    bool always_ = false;
    bool text_ = true;
    uint64_t made_ = 0;
    uint64_t abandoned_ = 0;
};

}  // namespace gilscan
