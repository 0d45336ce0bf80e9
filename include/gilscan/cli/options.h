// One option parser for every subcommand: a table of options that parses
// the command line and prints the command's --help from the same entries,
// one line per option, grouped.
//
//   OptionTable t("gilscan batch", "[options] PATH...", "Analyses many recordings ...");
//   t.section("Outputs");
//   t.value("--summary", "FILE", "one row per recording and thread", [&](const std::string& v) { o.summary = v; });
//   t.flag("--no-cache", "neither use nor fill the cache", [&] { o.cache.clear(); });
//   t.operands("PATH", [&](const std::string& v) { o.paths.push_back(v); });
//   if (!t.parse(argc, argv, 2)) return 0;   // --help: printed
//
// Numeric values are checked whole (cli_number): "2x", "", "-1", a value
// past the range or past 64 bits is a usage error naming the option, never
// a silently wrapped or truncated number.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gilscan {

// A command-line mistake: main prints it with where to read the command's
// options, and exits 2.
class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class OptionTable {
public:
    // command: "gilscan batch"; synopsis: what follows it in the usage line.
    OptionTable(std::string command, std::string synopsis, std::string about);

    // The options added after this are listed under `heading` in --help.
    void section(std::string heading);
    // names: "-o, --output" or "--running"; every spelling is accepted. An
    // option with no help is accepted but not listed (another's help names it).
    void flag(std::string names, std::string help, std::function<void()> set);
    void value(std::string names, std::string metavar, std::string help,
               std::function<void(const std::string&)> set);
    // Arguments that are not options (and "-"). rest: the first such
    // argument and everything after it are operands (record's PROGRAM ARGS);
    // "--" always ends the options.
    void operands(std::string metavar, std::function<void(const std::string&)> add, bool rest = false);
    // A closing paragraph for --help (where to read more).
    void epilogue(std::string text) { epilogue_ = std::move(text); }

    // Parses argv[first, argc). Throws UsageError; -h/--help prints help()
    // to stdout and returns false.
    bool parse(int argc, char** argv, int first) const;
    std::string help() const;
    const std::string& command() const { return command_; }

private:
    struct Option {
        std::vector<std::string> names;
        std::string label;  // names and metavar as --help shows them
        std::string metavar, help, section;
        std::function<void()> set_flag;
        std::function<void(const std::string&)> set_value;
    };
    const Option* find(std::string_view name) const;
    std::string command_, synopsis_, about_, epilogue_, section_;
    std::vector<Option> options_;
    std::function<void(const std::string&)> operand_;
    bool rest_ = false;
};

template <class T>
T cli_number(std::string_view option, std::string_view text, T min, T max) {
    uint64_t v = 0;
    const char* end = text.data() + text.size();
    auto r = std::from_chars(text.data(), end, v, 10);
    if (text.empty() || r.ec != std::errc() || r.ptr != end || v < static_cast<uint64_t>(min) ||
        v > static_cast<uint64_t>(max))
        throw UsageError(std::string(option) + " takes a whole number from " + std::to_string(min) + " to " +
                         std::to_string(max) + ", not '" + std::string(text) + "'");
    return static_cast<T>(v);
}

// Linux's PID_MAX_LIMIT: no pid or tid is larger.
inline constexpr int32_t kMaxPid = 4194304;

// A value that must not be empty ("--perf-maps needs a directory").
std::string non_empty(std::string_view option, const std::string& value, std::string_view what);
// --viztracer (gilscan FILE's and record's): it lays out a JSON trace, so the
// trace option (`-o`, `--trace`) must name one, not a .pftrace or nothing.
void require_json_trace(std::string_view trace_option, const std::string& trace);
// A number of seconds, more than 0 and at least `min` (and at most 1e7).
double cli_seconds(std::string_view option, const std::string& value, double min = 0);

}  // namespace gilscan
