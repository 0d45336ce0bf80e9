// The tests' perf.data writer: builds synthetic recordings for edge cases
// (byte-swapped files, every sample bit, compressed chunks that split a
// record, zero data size, broken counts) that perf itself will not produce
// on demand. Its records are encoded by perf_encode.h, as bench/perfgen's.
//
//   PerfWriter w;
//   int sw = w.add_tracepoint("sched", kSchedSwitchFormat, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | ...);
//   w.sample(sw, {.pid = 10, .tid = 11, .time = 1000, .raw = switch_raw(w, sw, 11, 0, 1)});
//   std::vector<uint8_t> file = w.build();
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <csignal>

#include <stdlib.h>
#include <sys/resource.h>
#include <zstd.h>

#include "gilscan/perfdata/cursor.h"
#include "gilscan/perfdata/header.h"
#include "gilscan/perfdata/perf_abi.h"
#include "gilscan/perfdata/tracepoint_format.h"
#include "perf_encode.h"

namespace gilscan::test {


inline const char* kSchedSwitchFormat =
    "name: sched_switch\nID: 372\nformat:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
    "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
    "\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;\n"
    "\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n"
    "\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n"
    "\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;\n\n"
    "print fmt: \"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d "
    "next_prio=%d\", REC->prev_comm, REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x00000000 | "
    "0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - "
    "1)) ? __print_flags(REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 "
    "| 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1), \"|\", { 0x00000001, \"S\" }, { 0x00000002, "
    "\"D\" }, { 0x00000004, \"T\" }, { 0x00000008, \"t\" }, { 0x00000010, \"X\" }, { 0x00000020, \"Z\" }, { "
    "0x00000040, \"P\" }, { 0x00000080, \"I\" }) : \"R\", REC->prev_state & (((0x00000000 | 0x00000001 | "
    "0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) ? \"+\" : \"\", "
    "REC->next_comm, REC->next_pid, REC->next_prio\n";

// sched_waking as on kernels >= 5.14 (no `success` field) but with the comm
// moved behind a __data_loc, to prove offsets are read from the format.
inline const char* kSchedWakingFormat =
    "name: sched_waking\nID: 375\nformat:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
    "\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;\n"
    "\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n"
    "\tfield:int prio;\toffset:16;\tsize:4;\tsigned:1;\n"
    "\tfield:int target_cpu;\toffset:20;\tsize:4;\tsigned:1;\n\n"
    "print fmt: \"comm=%s pid=%d prio=%d target_cpu=%03d\", __get_str(comm), REC->pid, REC->prio, "
    "REC->target_cpu\n";

struct TestSample {
    uint64_t id = 0, ip = 0x401000;
    int32_t pid = 0, tid = 0;
    uint64_t time = 0, addr = 0, stream_id = 0;
    uint32_t cpu = 0;
    uint64_t period = 1;
    std::vector<uint64_t> read_values;  // non-group: {value, [id], [lost]} as the format asks
    std::vector<uint64_t> callchain;
    std::vector<uint8_t> raw;
    std::vector<uint64_t> branch;       // 3 u64 per entry
    std::vector<uint64_t> regs_user;    // abi 2 with these values (empty: abi 0)
    std::vector<uint8_t> stack;         // copied stack; dyn_size = stack.size()
    uint64_t stack_reserved = 0;        // size field (>= stack.size())
    uint64_t weight = 0, data_src = 0, transaction = 0, phys_addr = 0, cgroup = 0;
    uint64_t data_page_size = 0, code_page_size = 0;
    std::vector<uint64_t> regs_intr;
    std::vector<uint8_t> aux;
};

struct BuildOptions {
    bool zero_data_size = false;
    bool features = true;
    size_t compress_chunk = 0;  // > 0: wrap the records in COMPRESSED records of this many input bytes
    bool compressed2 = false;
};

class PerfWriter {
public:
    using BuildOptions = test::BuildOptions;
    struct Attr {
        PerfEventAttr attr;
        std::vector<uint64_t> ids;
        std::string name;
        std::string system, format;  // tracepoints
    };

    bool swap = false;
    std::vector<Attr> attrs;
    std::vector<std::vector<uint8_t>> records;  // whole records, header included

    int add_event(PerfEventAttr a, std::string name, std::vector<uint64_t> ids = {}) {
        if (a.size == 0) a.size = 128;
        if (ids.empty()) ids = {100u + attrs.size() * 2, 101u + attrs.size() * 2};
        attrs.push_back({a, ids, std::move(name), "", ""});
        return static_cast<int>(attrs.size()) - 1;
    }

    int add_tracepoint(const std::string& system, const std::string& format, uint64_t sample_type) {
        TpFormat f = parse_tracepoint_format(system, format);
        PerfEventAttr a;
        a.type = PERF_TYPE_TRACEPOINT;
        a.config = f.id;
        a.sample_type = sample_type;
        a.flags = 1ull << ATTR_BIT_sample_id_all;
        int i = add_event(a, system + ":" + f.name);
        attrs[i].system = system;
        attrs[i].format = format;
        return i;
    }

    const TpFormat format_of(int i) const { return parse_tracepoint_format(attrs[i].system, attrs[i].format); }

    // Tracepoint payload: fields set by name, padded so 4 + size is 8-aligned.
    struct RawField {
        std::string name;
        int64_t value = 0;
        std::string str;
        bool is_str = false;
        RawField(std::string n, int64_t v) : name(std::move(n)), value(v) {}
        RawField(std::string n, int64_t v, std::string s, bool str_field)
            : name(std::move(n)), value(v), str(std::move(s)), is_str(str_field) {}
    };
    std::vector<uint8_t> raw(int i, const std::vector<RawField>& set) const {
        std::vector<RawValue> values;
        for (const auto& f : set) values.push_back({f.name, f.value, f.str, f.is_str});
        return tracepoint_raw(format_of(i), swap, values, /*strict=*/true);
    }

    void record(uint32_t type, uint16_t misc, const std::vector<uint8_t>& body) {
        records.push_back(record_bytes(swap, type, misc, body));
    }

    std::vector<uint8_t> sample_body(int i, const TestSample& s) const {
        Out o;
        o.swap = swap;
        put_sample_body(o, attrs[i].attr,
                        {.id = s.id ? s.id : attrs[i].ids[0], .ip = s.ip, .pid = s.pid, .tid = s.tid, .time = s.time,
                         .addr = s.addr, .stream_id = s.stream_id, .cpu = s.cpu, .period = s.period,
                         .read_values = s.read_values, .callchain = s.callchain, .raw = s.raw, .branch = s.branch,
                         .regs_abi = 2, .regs_user = s.regs_user, .stack = s.stack,
                         .stack_reserved = s.stack_reserved, .weight = s.weight, .data_src = s.data_src,
                         .transaction = s.transaction, .phys_addr = s.phys_addr, .cgroup = s.cgroup,
                         .data_page_size = s.data_page_size, .code_page_size = s.code_page_size,
                         .regs_intr = s.regs_intr, .aux = s.aux});
        return o.b;
    }

    void sample(int i, const TestSample& s) { record(PERF_RECORD_SAMPLE, 2, sample_body(i, s)); }

    // sample_id_all trailer for attr i.
    void trailer(Out& o, int i, int32_t pid, int32_t tid, uint64_t time, uint32_t cpu) const {
        put_id_trailer(o, {attrs[i].attr.sample_type, attrs[i].ids[0], 0}, pid, tid, time, cpu);
    }

    void comm(int i, int32_t pid, int32_t tid, const std::string& name, uint64_t time, bool exec = false) {
        Out o;
        o.swap = swap;
        put_comm_body(o, pid, tid, name);
        trailer(o, i, pid, tid, time, 0);
        record(PERF_RECORD_COMM, exec ? PERF_RECORD_MISC_COMM_EXEC : 0, o.b);
    }

    // PERF_RECORD_MMAP2 (device/inode form) of `len` bytes at `start` for pid's main thread.
    void mmap2(int i, int32_t pid, uint64_t start, uint64_t len, uint64_t pgoff, uint32_t prot, const std::string& path,
               uint64_t time) {
        Out o;
        o.swap = swap;
        put_mmap2_body(o, {.pid = pid, .tid = pid, .start = start, .len = len, .pgoff = pgoff, .maj = 254, .min = 1,
                           .ino = 18834, .ino_generation = 7, .prot = prot, .flags = 2 /* MAP_PRIVATE */,
                           .filename = path});
        trailer(o, i, pid, pid, time, 0);
        record(PERF_RECORD_MMAP2, 0, o.b);
    }

    void task(uint32_t type, int i, int32_t pid, int32_t ppid, int32_t tid, int32_t ptid, uint64_t time) {
        Out o;
        o.swap = swap;
        put_task_body(o, pid, ppid, tid, ptid, time);
        trailer(o, i, pid, tid, time, 0);
        record(type, 0, o.b);
    }

    void lost(int i, uint64_t n, uint64_t time, uint32_t cpu) {
        Out o;
        o.swap = swap;
        o.put<uint64_t>(attrs[i].ids[0]);
        o.put<uint64_t>(n);
        trailer(o, i, -1, -1, time, cpu);
        record(PERF_RECORD_LOST, 0, o.b);
    }

    // PERF_RECORD_SWITCH of tid (misc: PERF_RECORD_MISC_SWITCH_OUT and
    // _PREEMPT, or 0 for a switch-in); with cpu_wide, PERF_RECORD_SWITCH_CPU_WIDE
    // naming the task switched in or out for it.
    void context_switch(int i, int32_t pid, int32_t tid, uint64_t time, uint32_t cpu, uint16_t misc,
                        bool cpu_wide = false, int32_t next_prev_pid = -1, int32_t next_prev_tid = -1) {
        Out o;
        o.swap = swap;
        if (cpu_wide) {
            o.put<int32_t>(next_prev_pid);
            o.put<int32_t>(next_prev_tid);
        }
        trailer(o, i, pid, tid, time, cpu);
        record(cpu_wide ? PERF_RECORD_SWITCH_CPU_WIDE : PERF_RECORD_SWITCH, misc, o.b);
    }

    void finished_round() { record(PERF_RECORD_FINISHED_ROUND, 0, {}); }

    std::vector<uint8_t> tracing_data() const {
        Out o;
        o.swap = swap;
        o.bytes("\x17\x08\x44tracing", 10);
        o.str("0.6");
        o.b.push_back(swap ? 1 : 0);  // big_endian: a swapped file comes from the other byte order
        o.b.push_back(8);
        o.put<uint32_t>(4096);
        o.str("header_page");
        o.put<uint64_t>(0);
        o.str("header_event");
        o.put<uint64_t>(0);
        o.put<uint32_t>(0);  // ftrace formats
        std::vector<const Attr*> tps;
        for (auto& a : attrs)
            if (!a.format.empty()) tps.push_back(&a);
        o.put<uint32_t>(static_cast<uint32_t>(tps.size()));  // one system per event: simple and valid
        for (auto* a : tps) {
            o.str(a->system);
            o.put<uint32_t>(1);
            o.put<uint64_t>(a->format.size());
            o.bytes(a->format.data(), a->format.size());
        }
        o.put<uint32_t>(0);  // kallsyms
        o.put<uint32_t>(0);  // printk
        std::string cmdlines = "11 worker\n";
        o.put<uint64_t>(cmdlines.size());
        o.bytes(cmdlines.data(), cmdlines.size());
        return o.b;
    }

    void write_attr(Out& o, const PerfEventAttr& a) const {
        size_t start = o.size();
        o.put<uint32_t>(a.type);
        o.put<uint32_t>(a.size);
        o.put<uint64_t>(a.config);
        o.put<uint64_t>(a.sample_period);
        o.put<uint64_t>(a.sample_type);
        o.put<uint64_t>(a.read_format);
        uint64_t flags = a.flags;
        if (swap) {  // big-endian bitfields run from the most significant bit
            uint64_t r = 0;
            for (int k = 0; k < 64; ++k) r |= ((flags >> k) & 1) << (63 - k);
            flags = r;
        }
        o.put<uint64_t>(flags);
        o.put<uint32_t>(a.wakeup_events);
        o.put<uint32_t>(a.bp_type);
        o.put<uint64_t>(a.config1);
        o.put<uint64_t>(a.config2);
        o.put<uint64_t>(a.branch_sample_type);
        o.put<uint64_t>(a.sample_regs_user);
        o.put<uint32_t>(a.sample_stack_user);
        o.put<int32_t>(a.clockid);
        o.put<uint64_t>(a.sample_regs_intr);
        while (o.size() - start < a.size) o.b.push_back(0);
    }

    std::vector<uint8_t> event_desc() const {
        Out o;
        o.swap = swap;
        o.put<uint32_t>(static_cast<uint32_t>(attrs.size()));
        o.put<uint32_t>(128);
        for (auto& a : attrs) {
            PerfEventAttr x = a.attr;
            x.size = 128;
            write_attr(o, x);
            o.put<uint32_t>(static_cast<uint32_t>(a.ids.size()));
            uint32_t len = static_cast<uint32_t>((a.name.size() + 1 + 63) / 64 * 64);
            o.put<uint32_t>(len);
            std::string padded = a.name;
            padded.resize(len, '\0');
            o.bytes(padded.data(), padded.size());
            for (uint64_t id : a.ids) o.put<uint64_t>(id);
        }
        return o.b;
    }

    std::vector<uint8_t> data_bytes(const BuildOptions& opt) const {
        std::vector<uint8_t> plain;
        for (auto& r : records) plain.insert(plain.end(), r.begin(), r.end());
        if (!opt.compress_chunk) return plain;
        // One streaming context; chunk boundaries fall wherever they fall, so
        // records straddle two COMPRESSED records as they do in perf -z.
        std::vector<uint8_t> out;
        ZSTD_CCtx* cctx = ZSTD_createCCtx();
        for (size_t off = 0; off < plain.size(); off += opt.compress_chunk) {
            size_t n = std::min(opt.compress_chunk, plain.size() - off);
            std::vector<uint8_t> comp(ZSTD_compressBound(n) + 64);
            ZSTD_inBuffer in{plain.data() + off, n, 0};
            ZSTD_outBuffer ob{comp.data(), comp.size(), 0};
            while (ZSTD_compressStream2(cctx, &ob, &in, ZSTD_e_end) != 0) {}
            Out o;
            o.swap = swap;
            uint32_t type = opt.compressed2 ? PERF_RECORD_COMPRESSED2 : PERF_RECORD_COMPRESSED;
            size_t body = opt.compressed2 ? 8 + (ob.pos + 7) / 8 * 8 : ob.pos;
            o.put<uint32_t>(type);
            o.put<uint16_t>(0);
            o.put<uint16_t>(static_cast<uint16_t>(8 + body));
            if (opt.compressed2) o.put<uint64_t>(ob.pos);
            o.bytes(comp.data(), ob.pos);
            if (opt.compressed2) o.pad(8);
            out.insert(out.end(), o.b.begin(), o.b.end());
        }
        ZSTD_freeCCtx(cctx);
        return out;
    }

    std::vector<uint8_t> build(const BuildOptions& opt = BuildOptions()) const {
        Out o;
        o.swap = swap;
        const uint64_t attr_entry = 128 + 16;
        // Layout: header | ids | attrs | data | feature table | feature payloads
        o.b.resize(104, 0);
        std::vector<uint64_t> ids_off;
        for (auto& a : attrs) {
            ids_off.push_back(o.size());
            for (uint64_t id : a.ids) o.put<uint64_t>(id);
        }
        uint64_t attrs_off = o.size();
        for (size_t i = 0; i < attrs.size(); ++i) {
            write_attr(o, attrs[i].attr);
            o.put<uint64_t>(ids_off[i]);
            o.put<uint64_t>(attrs[i].ids.size() * 8);
        }
        o.pad(8);
        uint64_t data_off = o.size();
        std::vector<uint8_t> data = data_bytes(opt);
        o.bytes(data.data(), data.size());
        uint64_t data_size = data.size();
        FeatureBytes feats;
        if (opt.features) {
            bool tp = false;
            for (auto& a : attrs) tp |= !a.format.empty();
            if (tp) feats.push_back({HEADER_TRACING_DATA, tracing_data()});
            feats.push_back({HEADER_EVENT_DESC, event_desc()});
            if (opt.compress_chunk) {
                Out c;
                c.swap = swap;
                for (uint32_t v : {1u, 1u, 1u, 4u, 8192u}) c.put<uint32_t>(v);
                feats.push_back({HEADER_COMPRESSED, c.b});
            }
        }
        const std::vector<uint8_t> sections = feature_sections(swap, o.size(), feats);
        o.bytes(sections.data(), sections.size());
        FileLayout l{attr_entry, attrs_off, attrs.size() * attr_entry, data_off, opt.zero_data_size ? 0 : data_size, {}};
        for (auto& f : feats) l.features.push_back(f.first);
        const std::vector<uint8_t> header = file_header_bytes(swap, l);
        std::memcpy(o.b.data(), header.data(), header.size());
        return o.b;
    }

    // Pipe mode: 16-byte header, then HEADER_ATTR, HEADER_TRACING_DATA (4-byte
    // aligned tail on purpose), HEADER_FEATURE(EVENT_DESC) and the records.
    std::vector<uint8_t> build_pipe(const BuildOptions& opt = BuildOptions()) const {
        Out o;
        o.swap = swap;
        o.bytes("PERFILE2", 8);
        if (swap) std::reverse(o.b.begin(), o.b.begin() + 8);
        o.put<uint64_t>(16);
        for (auto& a : attrs) {
            Out body;
            body.swap = swap;
            write_attr(body, a.attr);
            for (uint64_t id : a.ids) body.put<uint64_t>(id);
            o.put<uint32_t>(PERF_RECORD_HEADER_ATTR);
            o.put<uint16_t>(0);
            o.put<uint16_t>(static_cast<uint16_t>(8 + body.size()));
            o.bytes(body.b.data(), body.size());
        }
        std::vector<uint8_t> td = tracing_data();
        while (td.size() % 4) td.push_back(0);  // not a multiple of 8: what follows is 4-byte aligned
        if (td.size() % 8 == 0) {
            td.push_back(0);
            td.push_back(0);
            td.push_back(0);
            td.push_back(0);
        }
        o.put<uint32_t>(PERF_RECORD_HEADER_TRACING_DATA);
        o.put<uint16_t>(0);
        o.put<uint16_t>(12);
        o.put<uint32_t>(static_cast<uint32_t>(td.size()));
        o.bytes(td.data(), td.size());
        std::vector<uint8_t> ed = event_desc();
        o.put<uint32_t>(PERF_RECORD_HEADER_FEATURE);
        o.put<uint16_t>(0);
        o.put<uint16_t>(static_cast<uint16_t>(16 + ed.size()));
        o.put<uint64_t>(HEADER_EVENT_DESC);
        o.bytes(ed.data(), ed.size());
        std::vector<uint8_t> data = data_bytes(opt);
        o.bytes(data.data(), data.size());
        return o.b;
    }
};

// A fresh directory under /tmp, removed with everything in it afterwards.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& prefix = "gilscan-test") {
        std::string t = "/tmp/" + prefix + "-XXXXXX";
        if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

// While alive, writes past `bytes` fail with EFBIG (RLIMIT_FSIZE; SIGXFSZ
// ignored so that they return instead of killing the process).
struct FileSizeLimit {
    explicit FileSizeLimit(rlim_t bytes) {
        if (::getrlimit(RLIMIT_FSIZE, &old) != 0) throw std::runtime_error("getrlimit failed");
        old_handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit lim = old;
        lim.rlim_cur = bytes;
        if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) throw std::runtime_error("setrlimit failed");
    }
    ~FileSizeLimit() {
        ::setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, old_handler);
    }
    FileSizeLimit(const FileSizeLimit&) = delete;
    FileSizeLimit& operator=(const FileSizeLimit&) = delete;
    rlimit old{};
    void (*old_handler)(int) = nullptr;
};

// A whole file's bytes ("" if it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Writes bytes to a fresh temporary file and removes it afterwards.
struct TempFile {
    std::string path;
    explicit TempFile(const std::vector<uint8_t>& bytes, const std::string& suffix = ".data");
    ~TempFile();
};

}  // namespace gilscan::test
