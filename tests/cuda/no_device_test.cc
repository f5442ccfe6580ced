// What runs on every machine, with or without a GPU: the factory answers with a
// Status and the dispatch refuses shapes it has no kernel for (the work list
// the kernels execute is the decode plan's: tests/unit/decode_plan_test.cc). (Requests are validated by the rpc layer, before any
// backend: tests/e2e/errors_test.cc.)
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda/decode_dispatch.h"
#include "pagoda/backend.h"
#include "pagoda/geometry_rules.h"

namespace pagoda::cuda {
namespace {

CacheGeometry small_geometry() {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_q_heads = 8;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.block_size = 4;
  g.num_blocks = 8;
  g.dtype = DType::kBFloat16;
  return g;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(CudaFactory, AnswersWithAStatusWhetherOrNotADeviceIsThere) {
  BackendOptions o;
  o.kind = "cuda";
  o.geometry = small_geometry();
  auto b = make_backend(o);
  if (cuda_device_available()) {
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(b.value()->name(), "cuda");
    EXPECT_FALSE(b.value()->device_name().empty());
    EXPECT_GT(b.value()->num_workers(), 0);
    return;
  }
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().message();
  EXPECT_TRUE(contains(b.status().message(), "cuda")) << b.status().message();
}

TEST(CudaFactory, AutoPicksCudaExactlyWhenADeviceAnswers) {
  BackendOptions o;
  o.kind = "auto";
  o.geometry = small_geometry();
  auto b = make_backend(o);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b.value()->name(), cuda_device_available() ? "cuda" : "cpu");
}

TEST(CudaFactory, RejectsHeadDim96BeforeLookingForADevice) {
  BackendOptions o;
  o.kind = "cuda";
  o.geometry = small_geometry();
  o.geometry.head_dim = 96;
  auto b = make_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(b.status().message(), "head_dim")) << b.status().message();
  EXPECT_TRUE(contains(b.status().message(), "96")) << b.status().message();
}

TEST(CudaDispatch, HasOneKernelPerHeadDimAndCacheDtype) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (int32_t d : kHeadDims) {
      auto k = find_partial_kernel(t, d);
      ASSERT_TRUE(k.ok()) << k.status().message();
      EXPECT_EQ(k.value()->cache_dtype, t);
      EXPECT_EQ(k.value()->head_dim, d);
      EXPECT_NE(k.value()->launch, nullptr);
    }
  }
}

TEST(CudaDispatch, RejectsHeadDim96AndUnknownDtypesWithAStatus) {
  auto k = find_partial_kernel(DType::kBFloat16, 96);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(k.status().message(), "96")) << k.status().message();
  EXPECT_FALSE(find_partial_kernel(static_cast<DType>(7), 128).ok());
  EXPECT_FALSE(find_partial_kernel(DType::kFloat16, 0).ok());
}

}  // namespace
}  // namespace pagoda::cuda
