// JSON string escaping, shared by the trace's events and the cached frame
// names: what the kernel and binaries hand us (comm bytes, symbol names) must
// come out as valid JSON that reads back to the same text (bytes >= 0x80 as
// \u00XX, i.e. Latin-1, as per4m's output does).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "gilscan/trace_writer.h"

using namespace gilscan;

TEST_CASE("append_json_string escapes what JSON needs and keeps the rest") {
    std::string out = "x";
    append_json_string(out, "plain take_gil+0x1f (libpython3.11.so)");
    CHECK(out == "x\"plain take_gil+0x1f (libpython3.11.so)\"");

    out.clear();
    const std::string raw = std::string("a\"b\\c\nd\te\rf") + '\x01' + '\x7f' + '\xe9';
    append_json_string(out, raw);
    CHECK(out == "\"a\\\"b\\\\c\\nd\\te\\rf\\u0001\x7f\\u00e9\"");
    const std::string back = nlohmann::json::parse(out).get<std::string>();
    CHECK(back.substr(0, 13) == raw.substr(0, 13));  // all but the \u00e9 (UTF-8 once parsed)
    CHECK(back.substr(13) == "\xc3\xa9");

    out.clear();
    append_json_string(out, "");
    CHECK(out == "\"\"");
}
