#include "gilscan/perfdata/tracepoint_format.h"

#include <charconv>
#include <stdexcept>

namespace gilscan {

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// Value of "key:NUMBER;" inside a field line.
uint32_t number_after(std::string_view line, std::string_view key) {
    size_t p = line.find(key);
    if (p == std::string_view::npos) throw std::invalid_argument("field line without " + std::string(key));
    std::string_view rest = line.substr(p + key.size());
    uint32_t v = 0;
    auto r = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (r.ec != std::errc()) throw std::invalid_argument("bad number after " + std::string(key));
    return v;
}

TpField parse_field(std::string_view line) {
    // field:TYPE NAME;	offset:N;	size:N;	signed:N;
    size_t colon = line.find(':');
    size_t semi = line.find(';');
    if (colon == std::string_view::npos || semi == std::string_view::npos || semi < colon)
        throw std::invalid_argument("malformed field line");
    std::string_view decl = trim(line.substr(colon + 1, semi - colon - 1));
    TpField f;
    // The name is the last identifier; an array suffix [N] belongs to the type.
    std::string_view d = decl;
    std::string array_suffix;
    if (!d.empty() && d.back() == ']') {
        size_t lb = d.rfind('[');
        if (lb == std::string_view::npos) throw std::invalid_argument("unbalanced [ in field");
        array_suffix = std::string(d.substr(lb));
        d = trim(d.substr(0, lb));
        f.is_array = true;
    }
    size_t sp = d.find_last_of(" \t*");
    if (sp == std::string_view::npos) throw std::invalid_argument("field without a type");
    f.name = std::string(d.substr(sp + 1));
    f.type = std::string(trim(d.substr(0, sp + 1))) + array_suffix;
    if (f.name.empty()) throw std::invalid_argument("field without a name");
    f.data_loc = f.type.rfind("__data_loc", 0) == 0;
    f.rel_loc = f.type.rfind("__rel_loc", 0) == 0;
    f.offset = number_after(line, "offset:");
    f.size = number_after(line, "size:");
    if (line.find("signed:") != std::string_view::npos) f.is_signed = number_after(line, "signed:") != 0;
    return f;
}

}  // namespace

TpFormat parse_tracepoint_format(std::string_view system, std::string_view text) {
    TpFormat fmt;
    fmt.system = std::string(system);
    bool have_name = false, have_id = false;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) nl = text.size();
        std::string_view line = trim(text.substr(pos, nl - pos));
        pos = nl + 1;
        if (line.rfind("name:", 0) == 0) {
            fmt.name = std::string(trim(line.substr(5)));
            have_name = true;
        } else if (line.rfind("ID:", 0) == 0) {
            std::string_view v = trim(line.substr(3));
            auto r = std::from_chars(v.data(), v.data() + v.size(), fmt.id);
            if (r.ec != std::errc()) throw std::invalid_argument("bad ID line");
            have_id = true;
        } else if (line.rfind("field:", 0) == 0 || line.rfind("field special:", 0) == 0) {
            fmt.fields.push_back(parse_field(line));
        } else if (line.rfind("print fmt:", 0) == 0) {
            fmt.print_fmt = std::string(trim(line.substr(10)));
        }
    }
    if (!have_name || !have_id) throw std::invalid_argument("format text without name: or ID:");
    return fmt;
}

std::string_view read_loc_str(Bytes raw, const TpField& f, bool swap, bool* ok) {
    // The field itself is a u32: offset (low 16 bits) and length.
    if (f.offset > raw.size() || raw.size() - f.offset < 4) {
        if (ok) *ok = false;
        return {};
    }
    const uint32_t loc = load<uint32_t>(raw.data() + f.offset, swap);
    uint64_t off = loc & 0xffff;
    const uint64_t len = loc >> 16;
    if (f.rel_loc) off += uint64_t{f.offset} + 4;
    if (off > raw.size() || len > raw.size() - off) {
        if (ok) *ok = false;
        return {};
    }
    const char* s = reinterpret_cast<const char*>(raw.data() + off);
    return std::string_view(s, strnlen(s, static_cast<size_t>(len)));
}

}  // namespace gilscan
