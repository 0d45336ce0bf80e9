#include "gilscan/symbols/jitdump.h"

#include <cstring>

#include "gilscan/error.h"

namespace gilscan {

namespace {

// The file header (jitdump-specification.txt): magic, version, total_size,
// elf_mach, pad1, pid (u32 each), timestamp, flags (u64). total_size is the
// header's own size: a later version may add fields, which are skipped.
constexpr uint64_t kHeaderMin = 40;
// A record: id, total_size (u32), timestamp (u64), then its body.
constexpr uint64_t kRecordHeader = 16;

void read_load(Cursor& c, uint64_t time, JitDump& out, JitCode& pending_unwind) {
    // pid, tid (u32), vma, code_addr, code_size, code_index (u64), the
    // name (NUL-terminated), then code_size bytes of code.
    c.read<uint32_t>();  // pid: the header's
    c.read<uint32_t>();  // tid
    c.read<uint64_t>();  // vma: where the code runs is code_addr (equal, as CPython writes them)
    JitCode code;
    code.start = c.read<uint64_t>();
    code.size = c.read<uint64_t>();
    code.index = c.read<uint64_t>();
    code.time = time;
    code.name = std::string(c.cstring());
    // The code itself need not be read, but a load whose code does not fit
    // its record is damaged.
    if (code.size > c.left()) c.fail("JIT_CODE_LOAD of " + std::to_string(code.size) + " code bytes in a record with " +
                                     std::to_string(c.left()) + " left");
    if (code.size == 0 || code.start + code.size < code.start) c.fail("JIT_CODE_LOAD with an empty or wrapping range");
    // The unwinding info record comes before the load it describes.
    code.eh_frame = std::move(pending_unwind.eh_frame);
    code.eh_frame_hdr_size = pending_unwind.eh_frame_hdr_size;
    pending_unwind = JitCode{};
    out.codes.push_back(std::move(code));
}

void read_move(Cursor& c, JitDump& out) {
    // pid, tid (u32), vma, old_code_addr, new_code_addr, code_size, code_index (u64).
    c.read<uint32_t>();
    c.read<uint32_t>();
    c.read<uint64_t>();
    const uint64_t old_addr = c.read<uint64_t>();
    const uint64_t new_addr = c.read<uint64_t>();
    const uint64_t size = c.read<uint64_t>();
    const uint64_t index = c.read<uint64_t>();
    if (size == 0 || new_addr + size < new_addr) c.fail("JIT_CODE_MOVE with an empty or wrapping range");
    // The latest load of that code (a JIT may load the same index again).
    for (auto it = out.codes.rbegin(); it != out.codes.rend(); ++it) {
        if (it->index == index && it->start == old_addr) {
            it->start = new_addr;
            it->size = size;
            return;
        }
    }
}

void read_unwinding(Cursor& c, JitCode& pending_unwind) {
    // unwinding_size (the .eh_frame and the .eh_frame_hdr after it),
    // eh_frame_hdr_size, mapped_size (u64), then the unwinding data.
    const uint64_t size = c.read<uint64_t>();
    const uint64_t hdr_size = c.read<uint64_t>();
    c.read<uint64_t>();  // mapped_size
    if (size > c.left()) c.fail("JIT_CODE_UNWINDING_INFO of " + std::to_string(size) + " bytes in a record with " +
                                std::to_string(c.left()) + " left");
    if (hdr_size > size) c.fail("JIT_CODE_UNWINDING_INFO with an .eh_frame_hdr larger than the whole");
    const Bytes data = c.bytes(size);
    pending_unwind.eh_frame.assign(data.begin(), data.end());
    pending_unwind.eh_frame_hdr_size = hdr_size;
}

}  // namespace

JitDump parse_jitdump(Bytes bytes, const std::string& path) {
    JitDump out;
    if (bytes.size() < kHeaderMin) {
        out.problem = path + ": " + std::to_string(bytes.size()) + " bytes, shorter than a jitdump header";
        return out;
    }
    uint32_t magic;
    std::memcpy(&magic, bytes.data(), sizeof magic);
    if (magic != JITHEADER_MAGIC && magic != JITHEADER_MAGIC_SW) {
        out.problem = path + ": not a jitdump (no JiTD magic)";
        return out;
    }
    const bool swap = magic == JITHEADER_MAGIC_SW;
    Cursor c(bytes, swap, &path, 0);
    JitCode pending_unwind;
    try {
        c.read<uint32_t>();  // magic
        c.read<uint32_t>();  // version (1; later ones only add to the header)
        const uint32_t header_size = c.read<uint32_t>();
        out.elf_mach = c.read<uint32_t>();
        c.read<uint32_t>();  // pad1
        out.pid = c.read<uint32_t>();
        if (header_size < kHeaderMin || header_size > bytes.size())
            c.fail("header size " + std::to_string(header_size) + " out of range");
        c.skip(header_size - c.offset());  // the header's timestamp, flags and any later fields
        while (c.left() >= kRecordHeader) {
            const uint64_t at = c.offset();
            const uint32_t id = c.read<uint32_t>();
            const uint32_t size = c.read<uint32_t>();
            const uint64_t time = c.read<uint64_t>();
            if (size < kRecordHeader || size - kRecordHeader > c.left())
                throw Error(path, at, "record of " + std::to_string(size) + " bytes with " +
                                          std::to_string(c.left() + kRecordHeader) + " left");
            // Each record is read from its own bytes: one that claims more
            // than its size fails, and the next starts at its end whatever
            // this one held (padding, a later version's fields).
            Cursor rc(c.bytes(size - kRecordHeader), swap, &path, at + kRecordHeader);
            if (id == JIT_CODE_CLOSE) return out;  // whatever follows is not the JIT's
            switch (id) {
            case JIT_CODE_LOAD: read_load(rc, time, out, pending_unwind); break;
            case JIT_CODE_MOVE: read_move(rc, out); break;
            case JIT_CODE_UNWINDING_INFO: read_unwinding(rc, pending_unwind); break;
            case JIT_CODE_DEBUG_INFO: break;
            default: ++out.skipped; break;
            }
        }
        // A record cut short at the end: the JIT was still writing (a
        // recording made while it ran), the codes before it stand.
        if (c.left() > 0) out.problem = path + ": the last " + std::to_string(c.left()) + " bytes are no whole record";
    } catch (const Error& e) {
        out.problem = e.what();
    }
    return out;
}

namespace {
// The file name of path is prefix, digits (and, with two, '-' and digits), suffix.
bool named_like(std::string_view path, std::string_view prefix, std::string_view suffix, int numbers) {
    const size_t slash = path.rfind('/');
    std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
    if (base.size() <= prefix.size() + suffix.size() || base.substr(0, prefix.size()) != prefix ||
        base.substr(base.size() - suffix.size()) != suffix)
        return false;
    base = base.substr(prefix.size(), base.size() - prefix.size() - suffix.size());
    for (int i = 0; i < numbers; ++i) {
        if (i > 0) {
            if (base.empty() || base[0] != '-') return false;
            base.remove_prefix(1);
        }
        size_t n = 0;
        while (n < base.size() && base[n] >= '0' && base[n] <= '9') ++n;
        if (n == 0) return false;
        base.remove_prefix(n);
    }
    return base.empty();
}
}  // namespace

// perf's jit_detect: the file's name is jit-<pid>.dump.
bool is_jitdump_path(std::string_view path) { return named_like(path, "jit-", ".dump", 1); }

bool is_injected_jit_path(std::string_view path) { return named_like(path, "jitted-", ".so", 2); }

}  // namespace gilscan
