#include "observability/logging.h"

#include <chrono>
#include <memory>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>

namespace pagoda {
namespace {

// Appends `s` as the body of a JSON string (quotes, backslashes and control
// characters escaped).
void append_json_escaped(spdlog::string_view_t s, spdlog::memory_buf_t& dest) {
  for (char ch : s) {
    switch (ch) {
      case '"': dest.append(std::string_view("\\\"")); break;
      case '\\': dest.append(std::string_view("\\\\")); break;
      case '\n': dest.append(std::string_view("\\n")); break;
      case '\r': dest.append(std::string_view("\\r")); break;
      case '\t': dest.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          fmt::format_to(std::back_inserter(dest), "\\u{:04x}", static_cast<unsigned>(ch));
        } else {
          dest.push_back(ch);
        }
    }
  }
}

// {"time":"2026-01-01T00:00:00.123456Z","level":"info","thread":123,"msg":"..."}
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - secs).count();
    const std::time_t t = secs.count();
    fmt::format_to(std::back_inserter(dest), R"({{"time":"{:%Y-%m-%dT%H:%M:%S}.{:06d}Z","level":")",
                   fmt::gmtime(t), micros);
    const auto level = spdlog::level::to_string_view(msg.level);
    dest.append(level.data(), level.data() + level.size());
    fmt::format_to(std::back_inserter(dest), R"(","thread":{},"msg":")", msg.thread_id);
    append_json_escaped(msg.payload, dest);
    dest.append(std::string_view("\"}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

Status configure_logging(const std::string& level, const std::string& format) {
  const std::string name = level == "warning" ? "warn" : level;
  const spdlog::level::level_enum lvl = spdlog::level::from_str(name);
  if (lvl == spdlog::level::off && name != "off") {
    return InvalidArgument("--log-level: expected trace, debug, info, warn, error, critical or off, received '{}'",
                           level);
  }
  spdlog::set_level(lvl);
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  } else if (format == "text") {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ [%t] %v", spdlog::pattern_time_type::utc);
  } else {
    return InvalidArgument("--log-format: expected text or json, received '{}'", format);
  }
  return Status::Ok();
}

}  // namespace pagoda
