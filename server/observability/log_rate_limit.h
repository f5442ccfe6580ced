#pragma once
// A budget of log lines for one kind of event that anyone can cause (an
// unauthenticated client can fail as fast as it can send): at most `burst`
// lines per `interval`; the rest are dropped, counted, and the next line
// written says how many. Metrics still count every event.

#include <chrono>
#include <cstdint>
#include <mutex>

namespace pagoda {

class LogRateLimit {
 public:
  LogRateLimit(int64_t burst, std::chrono::steady_clock::duration interval) : burst_(burst), interval_(interval) {}

  // Whether to write this line; when yes, *dropped is the number of lines
  // dropped since the previous one written.
  bool allow(int64_t* dropped);

 private:
  const int64_t burst_;
  const std::chrono::steady_clock::duration interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_{};
  int64_t written_in_window_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace pagoda
