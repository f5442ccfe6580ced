#pragma once
// Keeps every formatted log line of a logger (the formatter is the server's),
// for tests that check what is logged and how often.

#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>

namespace pagoda::e2e {

class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(this->mutex_);
    return lines_;
  }
  // Lines containing `needle`.
  int count(const std::string& needle) {
    int n = 0;
    for (const std::string& line : lines()) n += line.find(needle) != std::string::npos;
    return n;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    this->formatter_->format(msg, buf);
    std::string line(buf.data(), buf.size());
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    lines_.push_back(std::move(line));
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

}  // namespace pagoda::e2e
