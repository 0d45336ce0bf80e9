#include "gilscan/symbols/dwarf_cfi.h"

#include <string>
#include <string_view>

namespace gilscan {

uint64_t read_uleb128(Cursor& c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {  // ten bytes at most
        const uint8_t b = c.read<uint8_t>();
        if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    c.fail("overlong LEB128");
}

int64_t read_sleb128(Cursor& c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        const uint8_t b = c.read<uint8_t>();
        if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (shift + 7 < 64 && (b & 0x40)) v |= ~uint64_t{0} << (shift + 7);  // sign-extended
            return static_cast<int64_t>(v);
        }
    }
    c.fail("overlong LEB128");
}

uint64_t read_encoded_pointer(Cursor& c, uint8_t enc, uint64_t field_vaddr, uint64_t datarel_base) {
    uint64_t v = 0;
    switch (enc & 0x0f) {
    case 0x00: v = c.read<uint64_t>(); break;                                           // absptr (x86-64)
    case 0x01: v = read_uleb128(c); break;                                              // uleb128
    case 0x02: v = c.read<uint16_t>(); break;                                           // udata2
    case 0x03: v = c.read<uint32_t>(); break;                                           // udata4
    case 0x04: v = c.read<uint64_t>(); break;                                           // udata8
    case 0x09: v = static_cast<uint64_t>(read_sleb128(c)); break;                       // sleb128
    case 0x0a: v = static_cast<uint64_t>(static_cast<int64_t>(c.read<int16_t>())); break;  // sdata2
    case 0x0b: v = static_cast<uint64_t>(static_cast<int64_t>(c.read<int32_t>())); break;  // sdata4
    case 0x0c: v = c.read<uint64_t>(); break;                                           // sdata8
    default: c.fail("unsupported pointer encoding " + std::to_string(enc));
    }
    switch (enc & 0x70) {
    case 0x10: return v + field_vaddr;   // pcrel
    case 0x30: return v + datarel_base;  // datarel
    default: return v;
    }
}

std::optional<CieHeader> read_cie_header(Cursor& c) {
    if (c.read<uint32_t>() != 0) return std::nullopt;  // CIE id: 0 in .eh_frame
    CieHeader h;
    h.version = c.read<uint8_t>();
    if (h.version != 1 && h.version != 3) return std::nullopt;
    const std::string_view aug = c.cstring();
    h.code_align = read_uleb128(c);
    h.data_align = read_sleb128(c);
    h.ra_reg = h.version == 1 ? c.read<uint8_t>() : read_uleb128(c);
    if (!aug.empty()) {
        if (aug[0] != 'z') return std::nullopt;  // its data's length is unknown
        h.z = true;
        const uint64_t n = read_uleb128(c);
        const uint64_t data_at = c.offset();
        Cursor a(c.bytes(n), false, c.file(), data_at);
        for (char ch : aug.substr(1)) {
            if (ch == 'R') {
                h.fde_enc = a.read<uint8_t>();
            } else if (ch == 'P') {  // the personality routine: read past
                const uint8_t enc = a.read<uint8_t>();
                if (enc != DW_EH_PE_omit) read_encoded_pointer(a, enc);
            } else if (ch == 'L') {  // the LSDA's encoding: its pointer is in each FDE's augmentation data
                a.read<uint8_t>();
            } else if (ch == 'S') {
                h.signal_frame = true;
            } else if (ch != 'B') {  // 'B': AArch64's BTI, no data
                return std::nullopt;
            }
        }
    }
    h.instructions = c.rest();
    return h;
}

}  // namespace gilscan
