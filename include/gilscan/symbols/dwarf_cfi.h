// The encodings of .eh_frame that its two readers share: eh_frame.cc (a
// binary's FDE for a pc, through .eh_frame_hdr) and jit_cfi.cc (the
// unwinding information a jitdump carries). LEB128 numbers, DW_EH_PE_*
// pointers and a CIE's header, as the LSB's "Exception Frames" and DWARF 5
// (7.6, 6.4.1) lay them out.
//
//   Cursor c(cie_bytes, false, &path, offset);   // past the CIE's length
//   if (std::optional<CieHeader> cie = read_cie_header(c)) cie->fde_enc, cie->instructions
//
// Data cut short or overlong throws gilscan::Error through the cursor.
#pragma once

#include <cstdint>
#include <optional>

#include "gilscan/perfdata/cursor.h"

namespace gilscan {

uint64_t read_uleb128(Cursor& c);
int64_t read_sleb128(Cursor& c);

inline constexpr uint8_t DW_EH_PE_omit = 0xff;

// A DW_EH_PE_* encoded pointer. Its low four bits are its format (absptr,
// uleb128, udata2/4/8, sleb128, sdata2/4/8; any other throws), 0x70 what it
// is relative to: pcrel adds field_vaddr (the field's own address), datarel
// datarel_base; the others add nothing.
uint64_t read_encoded_pointer(Cursor& c, uint8_t enc, uint64_t field_vaddr = 0, uint64_t datarel_base = 0);

struct CieHeader {
    uint8_t version = 1;
    uint64_t code_align = 1;
    int64_t data_align = 0;
    uint64_t ra_reg = 0;        // the return address column (16 on x86-64)
    bool z = false;             // 'z': each FDE carries an augmentation data length
    uint8_t fde_enc = 0;        // 'R': the FDEs' pointer encoding (absptr unless stated)
    bool signal_frame = false;  // 'S': a signal frame, whose caller's pc is exact
    Bytes instructions;         // the initial instructions, padding included
};

// c: over a CIE's body (its length field read, so at the CIE id; what the
// length covers and no more). nullopt: not a CIE (an id other than 0), a
// version other than 1 or 3 (what .eh_frame holds), or an augmentation
// whose data this reader cannot skip (one that does not start with 'z', or
// a letter other than R, P, L, S, B).
std::optional<CieHeader> read_cie_header(Cursor& c);

}  // namespace gilscan
