#include "observability/log_rate_limit.h"

namespace pagoda {

bool LogRateLimit::allow(int64_t* dropped) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (now - window_start_ >= interval_) {
    window_start_ = now;
    written_in_window_ = 0;
  }
  if (written_in_window_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++written_in_window_;
  *dropped = dropped_;
  dropped_ = 0;
  return true;
}

}  // namespace pagoda
