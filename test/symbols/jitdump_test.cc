// jitdump files (jitdump.h): the parser over synthetic dumps in either byte
// order, damaged ones, JIT_CODE_MOVE; the call-frame rows of a code's
// .eh_frame (jit_cfi.h); PerfMaps reading DIR/jit-PID.dump where there is
// no perf map. The real recording's dump is checked against perf in
// perf_map_test.cc.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gilscan/symbols/jit_cfi.h"
#include "gilscan/symbols/jitdump.h"
#include "gilscan/symbols/perf_map.h"
#include "support/perf_writer.h"

using namespace gilscan;

namespace {

// CPython 3.13's trampoline .eh_frame (Python/perf_jit_trampoline.c), as
// testdata/perf-maps/jit-*.dump holds it: a CIE "zR" (code align 1, data
// align -8, return address r16, FDE pointers pcrel sdata4; CFA rsp+8, rip
// at CFA-8) and an FDE over 11 bytes: advance 4, CFA offset 16; advance 6,
// CFA offset 8 (sub $8,%rsp; call *%rcx; add $8,%rsp; ret).
const std::vector<uint8_t> kTrampolineEhFrame = {
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x7a, 0x52, 0x00, 0x01, 0x78, 0x10, 0x01,
    0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00,
    0xd0, 0xff, 0xff, 0xff, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x44, 0x0e, 0x10, 0x46, 0x0e, 0x08, 0x00};

// A jitdump in memory, in this machine's byte order or the other.
struct DumpWriter {
    bool swap = false;
    std::vector<uint8_t> out;
    template <class T>
    void put(T v) {
        if (swap) v = byteswap_int(v);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        out.insert(out.end(), p, p + sizeof v);
    }
    void header(uint32_t pid, uint32_t size = 40) {
        put<uint32_t>(JITHEADER_MAGIC);
        put<uint32_t>(1);
        put<uint32_t>(size);
        put<uint32_t>(62);  // EM_X86_64
        put<uint32_t>(0);
        put<uint32_t>(pid);
        put<uint64_t>(123);  // timestamp
        put<uint64_t>(0);    // flags
        out.resize(out.size() + (size - 40));
    }
    size_t begin(uint32_t id, uint64_t time) {
        const size_t at = out.size();
        put<uint32_t>(id);
        put<uint32_t>(0);  // total_size, set by end()
        put<uint64_t>(time);
        return at;
    }
    void end(size_t at, size_t pad_to = 8) {
        while (out.size() % pad_to) out.push_back(0);
        uint32_t size = static_cast<uint32_t>(out.size() - at);
        if (swap) size = byteswap_int(size);
        std::memcpy(out.data() + at + 4, &size, 4);
    }
    void load(uint64_t addr, uint64_t size, uint64_t index, const std::string& name, uint64_t time = 1000) {
        const size_t at = begin(JIT_CODE_LOAD, time);
        put<uint32_t>(7);
        put<uint32_t>(8);
        put<uint64_t>(addr);
        put<uint64_t>(addr);
        put<uint64_t>(size);
        put<uint64_t>(index);
        out.insert(out.end(), name.begin(), name.end());
        out.push_back(0);
        out.insert(out.end(), size, 0xc3);  // the code
        end(at);
    }
    void unwinding(const std::vector<uint8_t>& eh_frame, size_t hdr = 20) {
        const size_t at = begin(JIT_CODE_UNWINDING_INFO, 999);
        put<uint64_t>(eh_frame.size() + hdr);
        put<uint64_t>(hdr);
        put<uint64_t>(eh_frame.size() + hdr + 12);
        out.insert(out.end(), eh_frame.begin(), eh_frame.end());
        out.insert(out.end(), hdr, 0x01);  // an .eh_frame_hdr (not read)
        end(at);
    }
    void move(uint64_t from, uint64_t to, uint64_t size, uint64_t index) {
        const size_t at = begin(JIT_CODE_MOVE, 2000);
        put<uint32_t>(7);
        put<uint32_t>(8);
        put<uint64_t>(to);
        put<uint64_t>(from);
        put<uint64_t>(to);
        put<uint64_t>(size);
        put<uint64_t>(index);
        end(at);
    }
    void bare(uint32_t id, size_t body = 0) {
        const size_t at = begin(id, 3000);
        out.resize(out.size() + body);
        end(at);
    }
    JitDump parse() const { return parse_jitdump(Bytes(out.data(), out.size()), "t.dump"); }
};

}  // namespace

TEST_CASE("a jitdump's code loads, names and unwinding info, in either byte order") {
    for (const bool swap : {false, true}) {
        CAPTURE(swap);
        DumpWriter w;
        w.swap = swap;
        w.header(4242, 48);  // a later version's longer header: its extra fields skipped
        w.unwinding(kTrampolineEhFrame);
        w.load(0x7f0000001000, 11, 1, "py::spin:/w/work.py", 5000);
        w.bare(JIT_CODE_DEBUG_INFO, 24);
        w.bare(99, 8);  // a type this reader does not know: skipped, counted
        w.load(0x7f0000001100, 11, 2, "py::Condition.wait:/usr/lib/python3.13/threading.py");
        const JitDump d = w.parse();
        CHECK(d.problem.empty());
        CHECK(d.pid == 4242);
        CHECK(d.elf_mach == 62);
        CHECK(d.skipped == 1);
        REQUIRE(d.codes.size() == 2);
        CHECK(d.codes[0].start == 0x7f0000001000);
        CHECK(d.codes[0].size == 11);
        CHECK(d.codes[0].index == 1);
        CHECK(d.codes[0].time == 5000);
        CHECK(d.codes[0].name == "py::spin:/w/work.py");
        CHECK(d.codes[0].eh_frame.size() == kTrampolineEhFrame.size() + 20);
        CHECK(d.codes[0].eh_frame_hdr_size == 20);
        CHECK(d.codes[1].name == "py::Condition.wait:/usr/lib/python3.13/threading.py");
        CHECK(d.codes[1].eh_frame.empty());  // its load had no unwinding info before it
    }
}

TEST_CASE("a damaged jitdump keeps the codes before the damage and says where") {
    DumpWriter w;
    w.header(1);
    w.load(0x1000, 16, 1, "one");
    const size_t good = w.out.size();
    w.load(0x2000, 16, 2, "two");
    SUBCASE("cut inside a record") {
        w.out.resize(w.out.size() - 5);
        const JitDump d = w.parse();
        REQUIRE(d.codes.size() == 1);
        CHECK(d.codes[0].name == "one");
        CHECK(d.problem.find("t.dump") != std::string::npos);
        CHECK(d.problem.find("at byte " + std::to_string(good)) != std::string::npos);
    }
    SUBCASE("a few bytes after the last whole record") {
        w.out.resize(w.out.size() + 7);
        const JitDump d = w.parse();
        CHECK(d.codes.size() == 2);
        CHECK(d.problem == "t.dump: the last 7 bytes are no whole record");
    }
    SUBCASE("a load whose name runs to the record's end") {
        w.out.resize(good);
        const size_t at = w.begin(JIT_CODE_LOAD, 1);
        for (int i = 0; i < 5; ++i) w.put<uint64_t>(0x3000);  // pid and tid, vma, code_addr, code_size, code_index
        w.out.insert(w.out.end(), 8, 'x');
        w.end(at);
        const JitDump d = w.parse();
        CHECK(d.codes.size() == 1);
        CHECK_MESSAGE(d.problem.find("unterminated") != std::string::npos, d.problem);
    }
    SUBCASE("a load of more code than its record holds") {
        w.out.resize(good);
        const size_t at = w.begin(JIT_CODE_LOAD, 1);
        w.put<uint32_t>(1);
        w.put<uint32_t>(1);
        w.put<uint64_t>(0x3000);
        w.put<uint64_t>(0x3000);
        w.put<uint64_t>(4096);
        w.put<uint64_t>(3);
        w.out.push_back('f');
        w.out.push_back(0);
        w.end(at);
        CHECK(w.parse().codes.size() == 1);
        CHECK(w.parse().problem.find("4096 code bytes") != std::string::npos);
    }
    SUBCASE("a record smaller than a record header") {
        w.out.resize(good);
        w.put<uint32_t>(JIT_CODE_LOAD);
        w.put<uint32_t>(8);
        w.put<uint64_t>(0);
        CHECK(w.parse().codes.size() == 1);
        CHECK(w.parse().problem.find("record of 8 bytes") != std::string::npos);
    }
    SUBCASE("JIT_CODE_CLOSE ends it") {
        w.out.resize(good);
        w.bare(JIT_CODE_CLOSE);
        w.load(0x2000, 16, 2, "after the close");
        const JitDump d = w.parse();
        CHECK(d.codes.size() == 1);
        CHECK(d.problem.empty());
    }
    SUBCASE("not a jitdump") {
        CHECK(parse_jitdump(Bytes(w.out.data() + 4, w.out.size() - 4), "t.dump").problem ==
              "t.dump: not a jitdump (no JiTD magic)");
        CHECK(parse_jitdump(Bytes(w.out.data(), 39), "t.dump").problem ==
              "t.dump: 39 bytes, shorter than a jitdump header");
        DumpWriter h;
        h.header(1);
        uint32_t huge = 1000;
        std::memcpy(h.out.data() + 8, &huge, 4);
        CHECK(h.parse().problem.find("header size 1000 out of range") != std::string::npos);
    }
}

TEST_CASE("JIT_CODE_MOVE moves the latest load of that code") {
    DumpWriter w;
    w.header(1);
    w.load(0x1000, 16, 1, "a");
    w.load(0x2000, 16, 2, "b");
    w.move(0x1000, 0x9000, 32, 1);
    w.move(0x5555, 0x7000, 16, 2);  // not where b is: nothing moves
    const JitDump d = w.parse();
    REQUIRE(d.codes.size() == 2);
    CHECK(d.codes[0].start == 0x9000);
    CHECK(d.codes[0].size == 32);
    CHECK(d.codes[1].start == 0x2000);
}

TEST_CASE("a trampoline's .eh_frame as call-frame rows: the CFA moves with the sub and the add") {
    JitCode code;
    code.start = 0x7f0000001000;
    code.size = 11;
    code.eh_frame = kTrampolineEhFrame;
    const std::vector<JitCfiRow> rows = jit_cfi_rows(code);
    REQUIRE(rows.size() == 3);
    CHECK(rows[0].from == 0);
    CHECK(rows[0].to == 4);
    CHECK(rows[1].from == 4);
    CHECK(rows[1].to == 10);
    CHECK(rows[2].to == 11);
    const CfiRule* in_call = jit_cfi_at(rows, 5);  // the return address after `call *%rcx` is 6, looked up at 5
    REQUIRE(in_call);
    CHECK(in_call->kind == CfiRule::Simple);
    CHECK(in_call->cfa_reg == 7);
    CHECK(in_call->cfa_offset == 16);
    CHECK(in_call->reg_kind[CfiRule::kRa] == CfiRule::AtCfa);
    CHECK(in_call->reg_offset[CfiRule::kRa] == -8);
    CHECK(in_call->at_cfa == 1u << CfiRule::kRa);
    // x86-64's ABI where the CFI says nothing: rsp is the CFA, rbx, rbp and
    // r12-r15 kept, the rest undefined.
    CHECK(in_call->val_cfa == 1u << 7);
    CHECK(in_call->same == (1u << 3 | 1u << 6 | 1u << 12 | 1u << 13 | 1u << 14 | 1u << 15));
    CHECK(in_call->reg_kind[0] == CfiRule::Undefined);
    CHECK(jit_cfi_at(rows, 0)->cfa_offset == 8);
    CHECK(jit_cfi_at(rows, 10)->cfa_offset == 8);
    CHECK(jit_cfi_at(rows, 11) == nullptr);  // past the code

    // The FDE longer than the load: cut to the code.
    code.size = 6;
    const auto cut = jit_cfi_rows(code);
    REQUIRE(cut.size() == 2);
    CHECK(cut.back().to == 6);

    // What the subset does not read gives no rows: the unwinder steps by the
    // frame pointer instead.
    code.size = 11;
    auto with = [&](size_t at, std::initializer_list<uint8_t> ops) {
        JitCode c = code;
        std::copy(ops.begin(), ops.end(), c.eh_frame.begin() + static_cast<long>(at));
        return jit_cfi_rows(c);
    };
    CHECK(with(41, {0x0f}).empty());                    // DW_CFA_def_cfa_expression
    CHECK(with(41, {0x09}).empty());                    // DW_CFA_register
    CHECK(with(9, {'z', 'S'}).empty());                 // a signal frame's CIE
    CHECK(with(14, {0x05}).empty());                    // the return address not in rip's column
    CHECK(with(28, {0x18}).empty());                    // the FDE not pointing back to the CIE
    // Remember, CFA offset 32, restore: the state is back (nothing after).
    const auto restored = with(41, {0x0a, 0x0e, 0x20, 0x0b, 0x00, 0x00});
    REQUIRE(restored.size() == 1);
    CHECK(restored[0].rule.cfa_offset == 8);
    CHECK(with(41, {0x0a, 0x0e, 0x20, 0x00, 0x00, 0x00})[0].rule.cfa_offset == 32);
    CHECK(with(41, {0x0b}).empty());  // a restore with nothing remembered
    JitCode none = code;
    none.eh_frame.clear();
    CHECK(jit_cfi_rows(none).empty());
    none.eh_frame.assign(kTrampolineEhFrame.begin(), kTrampolineEhFrame.begin() + 30);  // cut short
    CHECK(jit_cfi_rows(none).empty());
}

TEST_CASE("PerfMaps reads DIR/jit-PID.dump where there is no perf map; a perf map wins") {
    gilscan::test::TempDir dir("gilscan-jitdump");
    DumpWriter w;
    w.header(51);
    w.unwinding(kTrampolineEhFrame);
    w.load(0x7f0000001000, 11, 1, "py::spin:/w/work.py");
    w.load(0x7f0000002000, 11, 2, "py::no_cfi:/w/work.py");
    std::ofstream(dir.path / "jit-51.dump", std::ios::binary)
        .write(reinterpret_cast<const char*>(w.out.data()), static_cast<std::streamsize>(w.out.size()));
    std::ofstream(dir.path / "jit-52.dump", std::ios::binary) << "garbage";
    std::ofstream(dir.path / "jit-54.dump", std::ios::binary).flush();  // empty
    std::ofstream(dir.path / "jit-53.dump", std::ios::binary)
        .write(reinterpret_cast<const char*>(w.out.data()), static_cast<std::streamsize>(w.out.size()));
    std::ofstream(dir.path / "perf-53.map") << "7f0000001000 b from the map\n";
    PerfMaps maps(dir.path.string());
    const auto m = maps.of_pid(51);
    CHECK(m->source() == "jit-51.dump");
    REQUIRE(m->find(0x7f0000001005));
    CHECK(m->find(0x7f0000001005)->name == "py::spin:/w/work.py");
    CHECK(m->find(0x7f000000100b) == nullptr);
    REQUIRE(m->cfi_at(0x7f0000001005));
    CHECK(m->cfi_at(0x7f0000001005)->cfa_offset == 16);
    CHECK(m->cfi_at(0x7f0000002005) == nullptr);  // named, but no CFI recorded for it
    CHECK(maps.of_pid(52)->size() == 0);
    CHECK(maps.of_pid(53)->source() == "perf-53.map");
    CHECK(maps.of_pid(53)->find(0x7f0000001005)->name == "from the map");
    CHECK(maps.of_pid(53)->cfi_at(0x7f0000001005) == nullptr);
    CHECK(maps.of_pid(54)->size() == 0);
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 2);
    CHECK(problems[0] == dir.path.string() + "/jit-52.dump: 7 bytes, shorter than a jitdump header");
    CHECK(problems[1] == dir.path.string() + "/jit-54.dump: 0 bytes, shorter than a jitdump header");
    CHECK(is_jitdump_path("/tmp/jit-51.dump"));
    CHECK(is_jitdump_path("jit-1.dump"));
    CHECK_FALSE(is_jitdump_path("/tmp/jit-.dump"));
    CHECK_FALSE(is_jitdump_path("/tmp/jit-5x.dump"));
    CHECK_FALSE(is_jitdump_path("/tmp/perf-51.map"));
    CHECK_FALSE(is_jitdump_path("/tmp/jit-51.dump.so"));
    CHECK(is_injected_jit_path("/tmp/jitted-51-270.so"));
    CHECK_FALSE(is_injected_jit_path("/tmp/jitted-51.so"));
    CHECK_FALSE(is_injected_jit_path("/tmp/jitted-51-.so"));
    CHECK_FALSE(is_injected_jit_path("/tmp/jitted-51-2-3.so"));
    CHECK_FALSE(is_injected_jit_path("/usr/lib/libjitted-1-2.so"));
}

TEST_CASE("PerfMaps finds a jitdump by the path the process mapped it at: its pid namespace's name, another directory") {
    gilscan::test::TempDir dir("gilscan-jitdump");
    const std::filesystem::path tmp = dir.path / "tmp", elsewhere = dir.path / "jit-dir";
    std::filesystem::create_directories(tmp);
    std::filesystem::create_directories(elsewhere);
    DumpWriter w;
    w.header(7);
    w.load(0x7f0000001000, 11, 1, "py::spin:/app/work.py");
    auto write = [&](const std::filesystem::path& p) {
        std::ofstream(p, std::ios::binary)
            .write(reinterpret_cast<const char*>(w.out.data()), static_cast<std::streamsize>(w.out.size()));
    };
    write(tmp / "jit-7.dump");              // a container's /tmp copied out: pid 7 there
    write(elsewhere / "jit-1235.dump");     // a JIT told to dump elsewhere
    auto space = [](int32_t pid, const std::string& marker) {
        AddressSpace as;
        as.pid = pid;
        as.maps[0x7f0000001000] = Mapping{0x7f0000001000, 0x7f0000002000, 0, "//anon", "", 0, true};
        // The marker: mapped executable so that perf records it (and a second,
        // a forked child's parent's, at a higher address: the first is read).
        as.maps[0x7f1000000000] = Mapping{0x7f1000000000, 0x7f1000001000, 0, marker, "", 5, true};
        as.maps[0x7f2000000000] = Mapping{0x7f2000000000, 0x7f2000001000, 0, "/tmp/jit-999.dump", "", 6, true};
        return as;
    };
    // No such processes in this procfs: they have exited.
    PerfMaps maps(tmp.string(), (dir.path / "proc").string());
    auto m = maps.of(space(1234, "/tmp/jit-7.dump"));
    CHECK(m->source() == "jit-7.dump");
    REQUIRE(m->find(0x7f0000001005));
    CHECK(m->find(0x7f0000001005)->name == "py::spin:/app/work.py");
    m = maps.of(space(1235, (elsewhere / "jit-1235.dump").string()));
    CHECK(m->source() == "jit-1235.dump");
    CHECK(m->find(0x7f0000001005)->name == "py::spin:/app/work.py");
    CHECK(maps.of(space(1236, "/nonexistent/jit-9.dump"))->size() == 0);
    CHECK(maps.of(space(1237, (tmp / "jit-1237.dump").string()))->size() == 0);  // the directory's own name: looked for once
    const auto problems = maps.problems();
    REQUIRE(problems.size() == 2);
    CHECK(problems[0] == "no perf map " + tmp.string() + "/perf-1236.map (No such file or directory) or jitdump "
                         "jit-1236.dump; nor the jitdump it mapped, /nonexistent/jit-9.dump, there or in the "
                         "directory: process 1236's frames in anonymous memory (JIT code, Python's -X perf "
                         "trampolines) stay unnamed");
    CHECK(problems[1] == "no perf map " + tmp.string() + "/perf-1237.map (No such file or directory) or jitdump "
                         "jit-1237.dump: process 1237's frames in anonymous memory (JIT code, Python's -X perf "
                         "trampolines) stay unnamed");
}
