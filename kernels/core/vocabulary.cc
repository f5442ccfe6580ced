#include "pagoda/vocabulary.h"

#include <vector>

namespace pagoda {
namespace {

// "a, b or c".
std::string spoken_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " or " : ", ";
    out += items[i];
  }
  return out;
}

}  // namespace

std::string head_dim_list() {
  std::vector<std::string> items;
  for (int32_t d : kHeadDims) items.push_back(std::to_string(d));
  return spoken_list(items);
}

std::string cache_dtype_list() {
  std::vector<std::string> items;
  for (const DTypeInfo& t : kDTypes) items.emplace_back(t.name);
  return spoken_list(items);
}

std::string wire_dtype_list() {
  std::vector<std::string> items;
  for (const DTypeInfo& t : kDTypes) {
    if (t.wire) items.emplace_back(t.wire_name);
  }
  return spoken_list(items);
}

}  // namespace pagoda
