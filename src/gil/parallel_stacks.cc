// ParallelStackClassifier: sleeps' stacks unwound and labelled on -j 3
// workers, each with a GilStackClassifier of its own (gil_stacks.h).
#include "gilscan/gil/gil_stacks.h"
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include "gilscan/symbols/debuginfo_cache.h"
#include "gilscan/perfdata/byte_buffer.h"
#include "gilscan/symbols/frame_names.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/perf_map.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/gil/trace_sink.h"

namespace gilscan {

struct ParallelStackClassifier::Job {
    int64_t ticket = 0;
    std::shared_ptr<const AddressSpace> space;
    Sample sample;               // spans point into `bytes`
    ChunkBytes bytes;            // callchain, regs and stack copies (resized without zero fill)
    SleepLabel label;            // the worker's answer
};

struct ParallelStackClassifier::Worker {
    std::unique_ptr<GilStackClassifier> gsc;
    std::thread thread;
};

namespace {
// A hand-over wakes a sleeping worker and a posted batch may wake the
// decoding thread; on a VM a wake-up costs tens of microseconds, so jobs
// travel in batches of 64 (a few hundred microseconds of unwinding).
constexpr size_t kJobBatch = 64;
}

struct ParallelStackClassifier::Shared {
    std::mutex mu;
    std::condition_variable ready, result;
    std::deque<std::vector<std::unique_ptr<Job>>> queue;
    bool done = false;
    std::vector<std::unique_ptr<Job>> finished;  // labelled, not yet taken by resolve()
    std::atomic<uint64_t> posted{0};  // batches of labels posted: resolve() locks only when it moved
};

ParallelStackClassifier::ParallelStackClassifier(unsigned jobs, const ModuleOptions& mopt, unsigned stack_frames,
                                                 const RecordedKernel& kernel, size_t max_queued_batches)
    : modules_(std::make_unique<ModuleCache>(mopt)), sh_(std::make_unique<Shared>()), max_queued_(max_queued_batches) {
    auto names = std::make_shared<GilStackClassifier::NameCache>(kernel, stack_frames > 0);
    if (stack_frames) names->symbolizer = std::make_unique<DwarfUnwinder>(*modules_);
    for (unsigned i = 0; i < std::max(1u, jobs); ++i) {
        auto w = std::make_unique<Worker>();
        w->gsc = std::make_unique<GilStackClassifier>(nullptr, *modules_, stack_frames, kernel, names);
        workers_.push_back(std::move(w));
    }
    here_ = std::make_unique<GilStackClassifier>(nullptr, *modules_, stack_frames, kernel, names);
    // The kept stack texts of all the classifiers together stay within
    // what two classifiers keep at -j 2 (with -j 64 a bound per
    // classifier would be a gigabyte).
    const size_t share = std::max<size_t>(GilStackClassifier::kStackTextBytes * 2 / (workers_.size() + 1), 1u << 20);
    here_->limit_stack_texts(share);
    for (auto& w : workers_) w->gsc->limit_stack_texts(share);
    for (auto& w : workers_) w->thread = std::thread([this, wp = w.get()] { work(*wp); });
}

ParallelStackClassifier::~ParallelStackClassifier() { finish(); }

void ParallelStackClassifier::work(Worker& w) {
    pthread_setname_np(pthread_self(), "gilscan-unwind");
    for (;;) {
        std::vector<std::unique_ptr<Job>> jobs;
        {
            std::unique_lock<std::mutex> l(sh_->mu);
            sh_->ready.wait(l, [&] { return sh_->done || !sh_->queue.empty(); });
            if (sh_->queue.empty()) return;
            jobs = std::move(sh_->queue.front());
            sh_->queue.pop_front();
        }
        for (auto& job : jobs) w.gsc->classify_into(job->space.get(), job->sample, job->label);
        {
            std::lock_guard<std::mutex> l(sh_->mu);
            for (auto& job : jobs) sh_->finished.push_back(std::move(job));
            sh_->posted.fetch_add(1, std::memory_order_release);
        }
        sh_->result.notify_all();
    }
}

void ParallelStackClassifier::hand_staged() {
    if (staged_.empty()) return;
    std::vector<std::unique_ptr<Job>> batch;
    batch.reserve(kJobBatch);
    batch.swap(staged_);
    {
        std::lock_guard<std::mutex> l(sh_->mu);
        if (sh_->queue.size() < max_queued_) {
            sh_->queue.push_back(std::move(batch));
            batch.clear();
        }
    }
    if (batch.empty()) {
        sh_->ready.notify_one();
        return;
    }
    // The workers are behind: this thread unwinds the batch itself rather
    // than wait (or copy ever more stacks). The labels are the same whoever
    // computes them.
    for (auto& job : batch) {
        here_->classify_into(job->space.get(), job->sample, job->label);
        take_back(job);
    }
}

void ParallelStackClassifier::set_gil_functions(bool on) {
    here_->set_gil_functions(on);
    for (auto& w : workers_) w->gsc->set_gil_functions(on);
}

void ParallelStackClassifier::take_back(std::unique_ptr<Job>& job) {
    // A label waits in ready_ until its span is emitted, which can be long
    // after the wake-up; the job (and its stack copy) is reused at once. The
    // label is copied, not moved: its strings stay with the job to be refilled
    // (in the worker's malloc arena: moved, they would be freed on this thread).
    ready_.emplace(job->ticket, job->label);
    job->space.reset();  // the snapshot is released on this thread
    spare_.push_back(std::move(job));
}

int64_t ParallelStackClassifier::submit(std::shared_ptr<const AddressSpace> space, const Sample& s) {
    std::unique_ptr<Job> job;
    if (spare_.empty()) {
        job = std::make_unique<Job>();
    } else {
        job = std::move(spare_.back());
        spare_.pop_back();
    }
    job->ticket = next_ticket_++;
    job->label.text = text_;  // kept by classify_into's clear()
    job->space = std::move(space);
    job->sample = s;
    // The record's chunk is reused once it is delivered: copy what the
    // worker reads (a few KiB, against microseconds of unwinding) into the
    // job's own buffer, which keeps its capacity from one sleep to the next.
    const size_t nc = s.callchain.bytes.size(), nr = s.regs_user.bytes.size(), ns = s.stack_user.size();
    job->bytes.resize(nc + nr + ns);
    uint8_t* p = job->bytes.data();
    if (nc) std::memcpy(p, s.callchain.bytes.data(), nc);
    if (nr) std::memcpy(p + nc, s.regs_user.bytes.data(), nr);
    if (ns) std::memcpy(p + nc + nr, s.stack_user.data(), ns);
    job->sample.callchain = U64Array{Bytes(p, nc), s.callchain.swap};
    job->sample.regs_user = U64Array{Bytes(p + nc, nr), s.regs_user.swap};
    job->sample.stack_user = Bytes(p + nc + nr, ns);
    job->sample.raw = {};
    job->sample.aux = {};
    job->sample.regs_intr = {};
    const int64_t ticket = job->ticket;
    staged_.push_back(std::move(job));
    if (staged_.size() >= kJobBatch) hand_staged();
    return ticket;
}

std::optional<SleepLabel> ParallelStackClassifier::resolve(int64_t ticket, bool wait) {
    auto take = [&]() -> std::optional<SleepLabel> {
        auto it = ready_.find(ticket);
        if (it == ready_.end()) return std::nullopt;
        SleepLabel label = std::move(it->second);
        ready_.erase(it);
        return label;
    };
    if (auto l = take()) return l;
    if (wait) {
        hand_staged();  // the ticket may still be staged here
        // ... and labelled by that call, on this thread, when the workers
        // had no room for the batch: the wait below is for workers' jobs
        // only, and would never end for it.
        if (auto l = take()) return l;
    }
    if (!wait && sh_->posted.load(std::memory_order_acquire) == seen_posted_) return std::nullopt;
    {
        std::unique_lock<std::mutex> l(sh_->mu);
        if (wait) sh_->result.wait(l, [&] {
            for (const auto& job : sh_->finished)
                if (job->ticket == ticket) return true;
            return false;
        });
        for (auto& job : sh_->finished) take_back(job);
        sh_->finished.clear();
        seen_posted_ = sh_->posted.load(std::memory_order_relaxed);
    }
    return take();
}

void ParallelStackClassifier::finish() {
    hand_staged();
    {
        std::lock_guard<std::mutex> l(sh_->mu);
        sh_->done = true;
    }
    sh_->ready.notify_all();
    for (auto& w : workers_)
        if (w->thread.joinable()) w->thread.join();
}

StackStats ParallelStackClassifier::stats() const {
    StackStats t;
    std::vector<const GilStackClassifier*> all{here_.get()};
    for (const auto& w : workers_) all.push_back(w->gsc.get());
    for (const GilStackClassifier* c : all) t += c->stats();
    return t;
}

std::vector<std::string> ParallelStackClassifier::problems() const {
    std::vector<std::string> out = modules_->problems();
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::string> ParallelStackClassifier::perf_map_problems() const { return modules_->perf_maps().problems(); }

}  // namespace gilscan
