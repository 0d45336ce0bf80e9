// perfgen's parts (perfgen.cc has the simulation and main): its options,
// the template recording it copies attrs, formats and stacks from, and the
// file writer that puts them around the generated data section.
#pragma once

#include <cstdint>
#include <deque>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <zstd.h>

#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/sample.h"
#include "gilscan/sched/sched_events.h"
#include "gilscan/perfdata/session.h"
#include "perf_encode.h"

using namespace gilscan;
using namespace gilscan;
using gilscan::test::Out;

namespace perfgen {

struct Args {
    std::string tmpl, out = "perfgen.data";
    unsigned cpus = 8, threads = 64, processes = 0;
    int32_t pid_base = 100000;  // first pid; on machines with pid_max = 2^22 tids run into the millions
    double seconds = 0;
    uint64_t events = 100000;
    bool pipe = false, zstd = false, stacks = false;
    uint64_t seed = 42;
};

// --processes, or one process per 16 threads.
inline unsigned processes_of(const Args& a) { return a.processes ? a.processes : std::max(1u, a.threads / 16); }


struct Ev {  // one template event and how to fill its payload
    int index = -1;
    PerfEventAttr attr;
    uint64_t id = 0;
    const TpFormat* fmt = nullptr;
};

// A copied stack sample (template sched_switch into S of a Python thread).
struct StackCopy {
    uint64_t ip = 0;
    std::vector<uint64_t> callchain;  // the ips
    uint64_t regs_abi = 0;
    std::vector<uint64_t> regs;
    std::vector<uint8_t> stack;       // the dyn_size valid bytes
    uint64_t stack_size = 0;          // the size field
    uint64_t addr = 0, data_src = 0;
};

class Template {
public:
    explicit Template(const std::string& path) : s(path) {
        struct Null : EventSink {
            Template* t;
            void on_sample(const Sample& smp, const EventInfo& ev) override { t->sample(smp, ev); }
            void on_mmap(const MmapEvent& e) override { t->mmap(e); }
        } n;
        n.t = this;
        // Keep the raw MMAP2 records of the template's Python process (file order).
        s.run(n);
        for (const auto& ev : s.events()) {
            Ev e;
            e.index = ev.index;
            e.attr = ev.attr;
            e.fmt = ev.format;
            std::string name = ev.name;
            std::string base = name.substr(name.find(':') + 1);
            if (name == "sched:sched_switch") sw = e;
            else if (name == "sched:sched_waking") waking = e;
            else if (name == "sched:sched_wakeup") wakeup = e;
            else if (name == "sched:sched_process_fork") fork = e;
            else if (base == "take_gil") take = e;
            else if (base == "take_gil__return") take_ret = e;
            else if (base == "drop_gil") drop = e;
            else if (base == "drop_gil__return") drop_ret = e;
        }
        // The first id perf gave each event (from the attrs' ids sections), read once.
        MappedFile f(s.path());
        auto attrs = read_attrs(f.bytes(), s.header(), s.path());
        for (Ev* e : {&sw, &waking, &wakeup, &fork, &take, &take_ret, &drop, &drop_ret})
            if (e->index >= 0 && !attrs[static_cast<size_t>(e->index)].ids.empty())
                e->id = attrs[static_cast<size_t>(e->index)].ids[0];
    }

    void sample(const Sample& smp, const EventInfo& ev) {
        if (ev.name != "sched:sched_switch" || smp.stack_user.empty() || smp.regs_user_abi == 0) return;
        SchedSwitch x;
        if (!dec.decode(smp, ev, s.swap(), x) || x.prev_state != 1) return;
        if (python_pid == 0) python_pid = smp.pid;
        if (smp.pid != python_pid) return;
        StackCopy c;
        c.ip = smp.ip;
        c.addr = smp.addr;
        c.data_src = smp.data_src;
        for (size_t k = 0; k < smp.callchain.size(); ++k) c.callchain.push_back(smp.callchain[k]);
        c.regs_abi = smp.regs_user_abi;
        for (size_t k = 0; k < smp.regs_user.size(); ++k) c.regs.push_back(smp.regs_user[k]);
        c.stack.assign(smp.stack_user.begin(), smp.stack_user.end());
        c.stack_size = smp.stack_user_size;
        if (stacks.size() < 4096) stacks.push_back(std::move(c));
    }

    void mmap(const MmapEvent& e) {
        if (!(e.mmap2 && e.executable && e.filename.size() && e.filename[0] == '/')) return;
        // The record's bytes are only valid during delivery: keep the name.
        names.emplace_back(e.filename);
        MmapEvent m = e;
        m.filename = names.back();
        maps.push_back(m);
    }

    Session s;
    TracepointDecoder dec;
    Ev sw, waking, wakeup, fork, take, take_ret, drop, drop_ret;
    std::vector<StackCopy> stacks;
    std::vector<MmapEvent> maps;
    std::deque<std::string> names;  // what maps' filenames point at
    int32_t python_pid = 0;
};


[[noreturn]] void usage(const char* why);
Args parse_args(int argc, char** argv);

class FileWriter {
public:
    // zstd: COMPRESSED records of at most kMmapLen input bytes, so records
    // straddle chunks as in perf -z.
    static constexpr size_t kMmapLen = 528384;

    FileWriter(const Args& a, const std::string& tmpl)
        : a_(a), tf_(tmpl), th_(read_file_header(tf_.bytes(), tmpl)) {
        if (th_.pipe) usage("the template must be a file-mode recording");
        attrs_ = read_attrs(tf_.bytes(), th_, tmpl);
        feats_ = read_feature_table(tf_.bytes(), th_, tmpl);
        out_ = std::fopen(a.out.c_str(), "wb");
        if (!out_) usage("cannot write the output");
        if (a.zstd) cctx_ = ZSTD_createCCtx();
    }
    ~FileWriter() {
        if (cctx_) ZSTD_freeCCtx(cctx_);
        if (out_) std::fclose(out_);
    }

    // Everything before the data section.
    void begin() {
        if (a_.pipe) {
            header_.assign(16, 0);
            std::memcpy(header_.data(), "PERFILE2", 8);
            const uint64_t hs = 16;
            std::memcpy(header_.data() + 8, &hs, 8);
        } else {
            header_ = test::file_header_bytes(false, {});  // written again at the end, filled in
        }
        write(header_.data(), header_.size());
        if (a_.pipe) pipe_header_records();
        else attrs_section();
    }
    // One round's records.
    void data(const std::vector<uint8_t>& bytes) {
        if (!a_.zstd) {
            write(bytes.data(), bytes.size());
            data_bytes_ += bytes.size();
            return;
        }
        pending_.insert(pending_.end(), bytes.begin(), bytes.end());
        size_t off = 0;
        while (pending_.size() - off >= kMmapLen / 2) {
            const size_t n = std::min(pending_.size() - off, kMmapLen / 2);
            compress_chunk(pending_.data() + off, n);
            off += n;
        }
        pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(off));
    }
    // The compressed tail, then (file mode) the features and the header again.
    void end() {
        if (a_.zstd && !pending_.empty()) compress_chunk(pending_.data(), pending_.size());
        if (!a_.pipe) features_section();
        if (std::fclose(out_) != 0) usage("write failed");
        out_ = nullptr;
    }
    uint64_t data_bytes() const { return data_bytes_; }

private:
    void write(const void* p, size_t n) {
        if (n && std::fwrite(p, 1, n, out_) != n) usage("write failed");
    }
    void record(uint32_t type, const std::vector<uint8_t>& body) {
        const auto r = test::record_bytes(false, type, 0, body);
        write(r.data(), r.size());
    }
    // One zstd frame per chunk, split over COMPRESSED records (a record is < 64 KiB).
    void compress_chunk(const uint8_t* data, size_t n) {
        std::vector<uint8_t> comp(ZSTD_compressBound(n) + 64);
        ZSTD_inBuffer in{data, n, 0};
        ZSTD_outBuffer ob{comp.data(), comp.size(), 0};
        while (ZSTD_compressStream2(cctx_, &ob, &in, ZSTD_e_end) != 0) {}
        for (size_t p = 0; p < ob.pos; p += 65000) {
            const size_t len = std::min<size_t>(65000, ob.pos - p);
            const auto r = test::record_bytes(false, PERF_RECORD_COMPRESSED, 0, {comp.data() + p, len});
            write(r.data(), r.size());
            data_bytes_ += r.size();
        }
    }
    const uint8_t* template_attr(size_t k) const { return tf_.bytes().data() + th_.attrs.offset + k * th_.attr_size; }
    std::vector<uint8_t> compressed_feature(bool pipe) const {
        Out c;
        for (uint32_t x : {1u, 1u, 1u, 10u, static_cast<uint32_t>(kMmapLen)}) c.put<uint32_t>(x);
        if (pipe) c.put<uint32_t>(0);
        return c.b;
    }
    // Pipe mode: attrs, tracing data and features as records.
    void pipe_header_records() {
        for (size_t k = 0; k < attrs_.size(); ++k) {
            Out body;
            body.bytes(template_attr(k), attrs_[k].attr.size);  // the attr bytes exactly as in the template
            for (uint64_t id : attrs_[k].ids) body.put<uint64_t>(id);
            record(PERF_RECORD_HEADER_ATTR, body.b);
        }
        for (const auto& f : feats_) {
            Bytes fb = tf_.bytes().subspan(f.section.offset, f.section.size);
            if (f.feature == HEADER_TRACING_DATA) {
                // Its size field counts the header only; the data follows, padded to 8.
                Out r;
                r.put<uint32_t>(PERF_RECORD_HEADER_TRACING_DATA);
                r.put<uint16_t>(0);
                r.put<uint16_t>(12);
                const size_t padded = (fb.size() + 7) / 8 * 8;
                r.put<uint32_t>(static_cast<uint32_t>(padded));
                r.bytes(fb.data(), fb.size());
                r.b.resize(r.b.size() + padded - fb.size(), 0);
                write(r.b.data(), r.b.size());
            } else if (f.feature == HEADER_EVENT_DESC || f.feature == HEADER_CMDLINE || f.feature == HEADER_HOSTNAME ||
                       f.feature == HEADER_CLOCKID || f.feature == HEADER_CLOCK_DATA) {
                if (fb.size() + 16 > 65535) continue;
                Out body;
                body.put<uint64_t>(f.feature);
                body.bytes(fb.data(), fb.size());
                body.pad(8);
                record(PERF_RECORD_HEADER_FEATURE, body.b);
            }
        }
        if (a_.zstd) {
            Out body;
            body.put<uint64_t>(HEADER_COMPRESSED);
            const auto c = compressed_feature(true);
            body.bytes(c.data(), c.size());
            record(PERF_RECORD_HEADER_FEATURE, body.b);
        }
    }
    // File mode: the ids sections, then the attrs section (attr bytes as in
    // the template); the header's offsets are filled in at the end.
    void attrs_section() {
        const uint64_t ids_base = header_.size();
        std::vector<uint64_t> ids_off;
        Out ids;
        for (const auto& ea : attrs_) {
            ids_off.push_back(ids_base + ids.b.size());
            for (uint64_t id : ea.ids) ids.put<uint64_t>(id);
        }
        write(ids.b.data(), ids.b.size());
        const uint64_t attrs_off = ids_base + ids.b.size();
        Out as;
        for (size_t k = 0; k < attrs_.size(); ++k) {
            as.bytes(template_attr(k), th_.attr_size - 16);
            as.put<uint64_t>(ids_off[k]);
            as.put<uint64_t>(attrs_[k].ids.size() * 8);
        }
        write(as.b.data(), as.b.size());
        data_off_ = attrs_off + as.b.size();
        layout_ = {th_.attr_size, attrs_off, as.b.size(), data_off_, 0, {}};
    }
    // File mode: the template's features after the data (not its build-ids:
    // the generated pids do not match), plus COMPRESSED for -z; then the
    // header with the data size and the feature bits.
    void features_section() {
        test::FeatureBytes fs;
        for (const auto& f : feats_) {
            if (f.feature == HEADER_COMPRESSED || f.feature == HEADER_SAMPLE_TIME || f.feature == HEADER_BUILD_ID) continue;
            Bytes fb = tf_.bytes().subspan(f.section.offset, f.section.size);
            fs.emplace_back(f.feature, std::vector<uint8_t>(fb.begin(), fb.end()));
        }
        if (a_.zstd) fs.emplace_back(HEADER_COMPRESSED, compressed_feature(false));
        std::sort(fs.begin(), fs.end(), [](auto& x, auto& y) { return x.first < y.first; });
        const std::vector<uint8_t> sections = test::feature_sections(false, data_off_ + data_bytes_, fs);
        write(sections.data(), sections.size());
        layout_.data_size = data_bytes_;
        for (auto& f : fs) layout_.features.push_back(f.first);
        header_ = test::file_header_bytes(false, layout_);
        std::fseek(out_, 0, SEEK_SET);
        write(header_.data(), 104);
    }

    const Args& a_;
    MappedFile tf_;
    FileHeader th_;
    std::vector<EventAttr> attrs_;
    std::vector<FeatureSection> feats_;
    std::FILE* out_ = nullptr;
    ZSTD_CCtx* cctx_ = nullptr;
    std::vector<uint8_t> header_, pending_;
    uint64_t data_off_ = 0, data_bytes_ = 0;
    test::FileLayout layout_;
};


}  // namespace perfgen
