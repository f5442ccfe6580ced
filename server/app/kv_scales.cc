#include "app/kv_scales.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

namespace pagoda {
namespace {

// A whole token as a float, or nothing.
std::optional<float> parse_float(std::string_view token) {
  float value = 0.f;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || end != token.data() + token.size()) return std::nullopt;
  return value;
}

Status check_scale(float value, const std::string& where) {
  if (!std::isfinite(value) || value <= 0.f) {
    return InvalidArgument("--kv-scales: expected finite scales > 0{}, received {}", where, value);
  }
  return Status::Ok();
}

StatusOr<std::vector<KvScale>> parse_file(const std::string& path, int32_t num_layers) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgument("--kv-scales: expected 'K,V' or a readable file of 'layer k_scale v_scale' lines, "
                           "received '{}' (not readable)",
                           path);
  }
  std::vector<KvScale> scales(static_cast<size_t>(num_layers));
  std::vector<bool> seen(static_cast<size_t>(num_layers), false);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string layer_text, k_text, v_text, extra;
    if (!(fields >> layer_text)) continue;  // blank
    const std::string where = fmt::format(" ({}:{})", path, line_no);
    int32_t layer = -1;
    const auto [end, ec] = std::from_chars(layer_text.data(), layer_text.data() + layer_text.size(), layer);
    std::optional<float> k, v;  // assigned, not built by ?: (GCC 12 then warns of an uninitialized read)
    if (fields >> k_text) k = parse_float(k_text);
    if (fields >> v_text) v = parse_float(v_text);
    if (ec != std::errc() || end != layer_text.data() + layer_text.size() || !k || !v || (fields >> extra)) {
      return InvalidArgument("--kv-scales: expected 'layer k_scale v_scale'{}, received '{}'", where, line);
    }
    if (layer < 0 || layer >= num_layers) {
      return InvalidArgument("--kv-scales: expected a layer in [0, {}){}, received {}", num_layers, where, layer);
    }
    if (seen[static_cast<size_t>(layer)]) {
      return InvalidArgument("--kv-scales: expected each layer once{}, received layer {} again", where, layer);
    }
    PAGODA_RETURN_IF_ERROR(check_scale(*k, where));
    PAGODA_RETURN_IF_ERROR(check_scale(*v, where));
    seen[static_cast<size_t>(layer)] = true;
    scales[static_cast<size_t>(layer)] = {*k, *v};
  }
  for (int32_t l = 0; l < num_layers; ++l) {
    if (!seen[static_cast<size_t>(l)]) {
      return InvalidArgument("--kv-scales: expected a line for every layer of {} in '{}', received none for layer {}",
                             num_layers, path, l);
    }
  }
  return scales;
}

}  // namespace

StatusOr<std::vector<KvScale>> parse_kv_scales(const std::string& spec, int32_t num_layers) {
  const auto comma = spec.find(',');
  if (comma != std::string::npos) {
    const auto k = parse_float(std::string_view(spec).substr(0, comma));
    const auto v = parse_float(std::string_view(spec).substr(comma + 1));
    if (k && v) {
      PAGODA_RETURN_IF_ERROR(check_scale(*k, ""));
      PAGODA_RETURN_IF_ERROR(check_scale(*v, ""));
      return std::vector<KvScale>(static_cast<size_t>(num_layers), KvScale{*k, *v});
    }
  }
  return parse_file(spec, num_layers);
}

}  // namespace pagoda
