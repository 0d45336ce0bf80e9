#include "gilscan/perfdata/tracing_data.h"

#include <bit>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gilscan {

const TpFormat* TracingData::by_id(uint64_t id) const {
    for (const auto& e : events)
        if (e.id == id) return &e;
    return nullptr;
}

const TpFormat* TracingData::by_name(std::string_view n) const {
    for (const auto& e : events)
        if (e.full_name() == n) return &e;
    return nullptr;
}

bool TracingData::swap() const { return big_endian != (std::endian::native == std::endian::big); }

namespace {

constexpr std::string_view kMagic("\x17\x08\x44tracing", 10);

void add_format(TracingData& td, std::string_view system, Bytes text) {
    std::string_view t(reinterpret_cast<const char*>(text.data()), text.size());
    try {
        td.events.push_back(parse_tracepoint_format(system, t));
    } catch (const std::invalid_argument& e) {
        td.warnings.push_back("skipped a broken format file in system '" + std::string(system) + "': " + e.what());
    }
}

void parse_cmdlines(TracingData& td, std::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) nl = text.size();
        std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        size_t sp = line.find(' ');
        if (sp == std::string_view::npos) continue;
        uint32_t pid = 0;
        for (char ch : line.substr(0, sp)) {
            if (ch < '0' || ch > '9') { pid = 0; break; }
            pid = pid * 10 + static_cast<uint32_t>(ch - '0');
        }
        if (pid == 0) continue;
        td.saved_cmdlines[pid] = static_cast<int32_t>(td.cmdline_names.size());
        td.cmdline_names.emplace_back(line.substr(sp + 1));
    }
}

}  // namespace

TracingData parse_tracing_data(Bytes data, const std::string& path, uint64_t base) {
    TracingData td;
    Cursor c(data, false, &path, base);
    Bytes magic = c.bytes(kMagic.size());
    if (std::string_view(reinterpret_cast<const char*>(magic.data()), magic.size()) != kMagic)
        c.fail("tracing data without its magic");
    td.version = std::string(c.cstring());
    td.big_endian = c.read<uint8_t>() != 0;
    // Re-open the cursor in the tracing data's own byte order.
    size_t pos = c.pos();
    c = Cursor(data, td.swap(), &path, base);
    c.seek(pos);
    td.long_size = c.read<uint8_t>();
    td.page_size = c.read<uint32_t>();

    for (const char* name : {"header_page", "header_event"}) {
        std::string_view n = c.cstring();
        if (n != name) c.fail(std::string("tracing data: expected ") + name);
        uint64_t size = c.read<uint64_t>();
        c.skip(size);
    }
    uint32_t nr_ftrace = c.read<uint32_t>();
    c.check_count(nr_ftrace, 8, "ftrace format");
    for (uint32_t i = 0; i < nr_ftrace; ++i) c.skip(c.read<uint64_t>());

    uint32_t nr_systems = c.read<uint32_t>();
    c.check_count(nr_systems, 5, "event system");
    for (uint32_t s = 0; s < nr_systems; ++s) {
        std::string system(c.cstring());
        uint32_t nr_events = c.read<uint32_t>();
        c.check_count(nr_events, 8, "event format");
        for (uint32_t e = 0; e < nr_events; ++e) {
            uint64_t size = c.read<uint64_t>();
            add_format(td, system, c.bytes(size));
        }
    }
    // kallsyms and printk formats: not needed.
    if (c.left() >= 4) c.skip(c.read<uint32_t>());
    if (c.left() >= 4) c.skip(c.read<uint32_t>());
    if (td.version >= "0.6" && c.left() >= 8) {
        uint64_t size = c.read<uint64_t>();
        Bytes b = c.bytes(size);
        parse_cmdlines(td, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
    }
    td.consumed = c.pos();
    return td;
}

TracingData tracing_data_from_tracefs(const std::vector<uint64_t>& ids) {
    namespace fs = std::filesystem;
    TracingData td;
    td.version = "tracefs";
    td.big_endian = std::endian::native == std::endian::big;
    for (const char* root : {"/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"}) {
        std::error_code ec;
        if (!fs::is_directory(root, ec)) continue;
        for (const auto& sys : fs::directory_iterator(root, ec)) {
            if (!sys.is_directory(ec)) continue;
            for (const auto& ev : fs::directory_iterator(sys.path(), ec)) {
                std::ifstream idf(ev.path() / "id");
                uint64_t id = 0;
                if (!(idf >> id)) continue;
                bool wanted = false;
                for (uint64_t w : ids) wanted |= w == id;
                if (!wanted) continue;
                std::ifstream ff(ev.path() / "format");
                std::stringstream ss;
                ss << ff.rdbuf();
                std::string text = ss.str();
                add_format(td, sys.path().filename().string(),
                           Bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
            }
        }
        break;
    }
    return td;
}

}  // namespace gilscan
