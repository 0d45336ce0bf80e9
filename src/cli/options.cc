#include "gilscan/cli/options.h"

#include <algorithm>
#include <cstdio>

#include "gilscan/output/pftrace_writer.h"

namespace gilscan {

namespace {

std::vector<std::string> split_names(const std::string& names) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < names.size()) {
        size_t comma = names.find(',', pos);
        if (comma == std::string::npos) comma = names.size();
        std::string n = names.substr(pos, comma - pos);
        n.erase(0, n.find_first_not_of(' '));
        if (!n.empty()) out.push_back(n);
        pos = comma + 1;
    }
    return out;
}

// Options with only a long name line up under the long names of the others.
std::string label_of(const std::string& names, const std::string& metavar) {
    std::string l = names.starts_with("--") ? "    " + names : names;
    return metavar.empty() ? l : l + " " + metavar;
}

}  // namespace

OptionTable::OptionTable(std::string command, std::string synopsis, std::string about)
    : command_(std::move(command)), synopsis_(std::move(synopsis)), about_(std::move(about)) {}

void OptionTable::section(std::string heading) { section_ = std::move(heading); }

void OptionTable::flag(std::string names, std::string help, std::function<void()> set) {
    options_.push_back({split_names(names), label_of(names, ""), "", std::move(help), section_, std::move(set), {}});
}

void OptionTable::value(std::string names, std::string metavar, std::string help,
                        std::function<void(const std::string&)> set) {
    options_.push_back(
        {split_names(names), label_of(names, metavar), metavar, std::move(help), section_, {}, std::move(set)});
}

void OptionTable::operands(std::string metavar, std::function<void(const std::string&)> add, bool rest) {
    (void)metavar;  // named in the synopsis
    operand_ = std::move(add);
    rest_ = rest;
}

const OptionTable::Option* OptionTable::find(std::string_view name) const {
    for (const Option& o : options_)
        for (const std::string& n : o.names)
            if (n == name) return &o;
    return nullptr;
}

bool OptionTable::parse(int argc, char** argv, int first) const {
    bool options_done = false;
    for (int i = first; i < argc; ++i) {
        const std::string a = argv[i];
        const bool is_option = !options_done && a.size() > 1 && a[0] == '-';
        if (!is_option) {
            if (!operand_) throw UsageError("unexpected argument " + a);
            operand_(a);
            if (rest_) options_done = true;
            continue;
        }
        if (a == "--") {
            options_done = true;
            continue;
        }
        if (a == "-h" || a == "--help") {
            const std::string h = help();
            std::fwrite(h.data(), 1, h.size(), stdout);
            return false;
        }
        const Option* o = find(a);
        if (!o) throw UsageError("unknown option " + a);
        if (o->set_flag) {
            o->set_flag();
            continue;
        }
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        o->set_value(argv[++i]);
    }
    return true;
}

std::string OptionTable::help() const {
    std::string h = "usage: " + command_ + " " + synopsis_ + "\n\n" + about_ + "\n";
    size_t width = 0;
    for (const Option& o : options_) width = std::max(width, o.label.size());
    width = std::min<size_t>(width, 30);
    std::string section = "\x01";
    for (const Option& o : options_) {
        if (o.help.empty()) continue;  // accepted, described with another option
        if (o.section != section) {
            section = o.section;
            h += "\n" + (section.empty() ? std::string("Options") : section) + ":\n";
        }
        std::string line = "  " + o.label;
        line += std::string(o.label.size() < width ? width - o.label.size() : 0, ' ');
        h += line + "  " + o.help + "\n";
    }
    if (!epilogue_.empty()) h += "\n" + epilogue_ + "\n";
    return h;
}

std::string non_empty(std::string_view option, const std::string& value, std::string_view what) {
    if (value.empty()) throw UsageError(std::string(option) + " needs " + std::string(what));
    return value;
}

void require_json_trace(std::string_view trace_option, const std::string& trace) {
    if (trace.empty() || is_pftrace_name(trace))
        throw UsageError("--viztracer lays out a JSON trace: it needs " + std::string(trace_option) + " FILE.json");
}

double cli_seconds(std::string_view option, const std::string& value, double min) {
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (value.empty() || *end || !(d > 0) || !(d >= min) || d > 1e7) {
        char least[32];
        std::snprintf(least, sizeof least, min > 0 ? " (at least %g)" : "", min);
        throw UsageError(std::string(option) + " needs a number of seconds > 0" + least + ", not " + value);
    }
    return d;
}

}  // namespace gilscan
