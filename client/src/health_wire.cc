#include "health_wire.h"

#include <cstdint>

namespace pagoda::client::health_wire {
namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

std::optional<uint64_t> get_varint(std::string_view bytes, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && pos < bytes.size(); shift += 7) {
    const auto b = static_cast<uint8_t>(bytes[pos++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return v;
  }
  return std::nullopt;
}

}  // namespace

std::string encode_check_request(std::string_view service) {
  std::string out;
  if (service.empty()) return out;  // proto3: a default field is not written
  out.push_back(0x0A);
  put_varint(out, service.size());
  out.append(service);
  return out;
}

std::optional<int> decode_check_response(std::string_view bytes) {
  int status = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const auto key = get_varint(bytes, pos);
    if (!key) return std::nullopt;
    const uint64_t field = *key >> 3;
    switch (*key & 7) {
      case 0: {  // varint
        const auto v = get_varint(bytes, pos);
        if (!v) return std::nullopt;
        if (field == 1) status = static_cast<int>(*v);
        break;
      }
      case 1: pos += 8; break;  // fixed64
      case 2: {                 // length-delimited
        const auto len = get_varint(bytes, pos);
        if (!len || *len > bytes.size() - pos) return std::nullopt;
        pos += *len;
        break;
      }
      case 5: pos += 4; break;  // fixed32
      default: return std::nullopt;
    }
    if (pos > bytes.size()) return std::nullopt;
  }
  return status;
}

}  // namespace pagoda::client::health_wire
