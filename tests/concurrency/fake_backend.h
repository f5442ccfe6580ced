#pragma once
// A backend with no kernels and no libraries under it, for the concurrency
// tests (ThreadSanitizer sees every access): each token slot keeps one number,
// the first element of its K row, and a decode answers, in element 0 of each
// query head's output, the sum of the numbers of the tokens it attends (in
// LSE, their count). Exact for integer markers, so a lost, doubled or
// misplaced append shows.

#include <memory>
#include <vector>

#include "pagoda/backend.h"

namespace pagoda::testing {

class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(const CacheGeometry& g);
  std::string name() const override { return "fake"; }
  std::string device_name() const override { return "fake"; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return 1; }
  KvScale kv_scale(int32_t) const override { return {}; }
  StatusOr<std::unique_ptr<BackendStream>> open_stream() override;

  // [layer][block * block_size + offset]
  std::vector<std::vector<double>>& markers() { return markers_; }

 private:
  CacheGeometry geometry_;
  std::vector<std::vector<double>> markers_;
};

}  // namespace pagoda::testing
