#pragma once
// spdlog set-up for the server: the level and a text or JSON line format.

#include <string>

#include "pagoda/status.h"

namespace pagoda {

// level: trace ... off; format: "text" or "json" (one object a line with time,
// level and msg, for log shippers). Applies to the default logger.
Status configure_logging(const std::string& level, const std::string& format);

}  // namespace pagoda
