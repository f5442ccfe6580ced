#pragma once
// --kv-scales: the per-layer K and V scales of the cache (docs/design.md §9). Either
// "K,V" for every layer, or the path of a file with one "layer k_scale
// v_scale" line per layer (blank lines and '#' comments allowed).

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

// [num_layers] scales; INVALID_ARGUMENT naming --kv-scales (and the file's
// line) for a malformed pair, an unreadable file, a layer missing, repeated or
// out of range, or a scale that is not finite and positive.
StatusOr<std::vector<KvScale>> parse_kv_scales(const std::string& spec, int32_t num_layers);

}  // namespace pagoda
