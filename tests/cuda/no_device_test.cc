// What runs on every machine, with or without a GPU: the factory answers with a
// Status, the dispatch refuses shapes it has no kernel for, and the work list is
// what the merge expects. (Requests are validated by the rpc layer, before any
// backend: tests/e2e/errors_test.cc.)
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda/decode_dispatch.h"
#include "cuda/work_list.h"
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
    for (int32_t d : kSupportedHeadDims) {
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

struct LaunchInputs {
  std::vector<int32_t> indptr = {0, 2, 3};
  std::vector<int32_t> ids = {5, 1, 7};
  std::vector<int32_t> lengths = {5, 4};
  std::vector<float> q = std::vector<float>(2 * 8 * 64, 0.f);

  DecodeLaunch launch() const {
    DecodeLaunch l;
    l.layer = 1;
    l.tables.batch = 2;
    l.tables.block_indptr = indptr.data();
    l.tables.block_ids = ids.data();
    l.tables.lengths = lengths.data();
    l.q = q.data();
    l.scale = 0.125f;
    return l;
  }
};

struct BuiltWorkList {
  WorkListSize size;
  std::vector<int32_t> seq, chunk, partial, indptr, splits;
};

BuiltWorkList build_work_list(const DecodeLaunch& l, int32_t heads, int32_t chunk_tokens) {
  BuiltWorkList w;
  w.size = size_work_list(l, heads, chunk_tokens);
  const auto items = static_cast<size_t>(w.size.items);
  w.seq.resize(items);
  w.chunk.resize(items);
  w.partial.resize(items);
  w.indptr.resize(static_cast<size_t>(l.tables.batch) + 1);
  w.splits.resize(static_cast<size_t>(l.tables.batch));
  fill_work_list(l, heads, chunk_tokens, {w.seq, w.chunk, w.partial, w.indptr, w.splits});
  return w;
}

TEST(CudaWorkList, OneItemPerChunkSequenceMajorWithNoneForEmptySequences) {
  const std::vector<int32_t> lengths = {0, 1, 512, 513, 1000, 0};
  DecodeLaunch l;
  l.tables.batch = static_cast<int32_t>(lengths.size());
  l.tables.lengths = lengths.data();
  const BuiltWorkList w = build_work_list(l, 8, 512);
  ASSERT_EQ(w.size.items, 6);
  EXPECT_EQ(w.size.partial_rows, 6 * 8);
  EXPECT_EQ(w.seq, (std::vector<int32_t>{1, 2, 3, 3, 4, 4}));
  EXPECT_EQ(w.chunk, (std::vector<int32_t>{0, 0, 0, 1, 0, 1}));
  EXPECT_EQ(w.partial, (std::vector<int32_t>{0, 8, 16, 24, 32, 40}));
  EXPECT_EQ(w.indptr, (std::vector<int32_t>{0, 0, 1, 2, 4, 6, 6}));
  EXPECT_EQ(w.splits, (std::vector<int32_t>{0, 1, 1, 2, 2, 0}));
}

// Rows and windows (DESIGN §9): only the chunks some row attends get an item,
// and each item holds a partial per (row, query head) of its sequence.
TEST(CudaWorkList, ItemsCoverTheChunksTheRowsAttendWithAPartialPerRowAndHead) {
  const std::vector<int32_t> lengths = {1100, 700};
  const std::vector<int32_t> q_indptr = {0, 5, 6};
  DecodeLaunch l;
  l.tables.batch = 2;
  l.tables.lengths = lengths.data();
  l.q_indptr = q_indptr.data();
  l.sliding_window = 100;  // rows of seq 0 at 1095..1099: keys 996..1099, chunks 1 and 2
  const BuiltWorkList w = build_work_list(l, 8, 512);
  ASSERT_EQ(w.size.items, 3);
  EXPECT_EQ(w.size.partial_rows, 2 * 5 * 8 + 1 * 8);
  EXPECT_EQ(w.seq, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(w.chunk, (std::vector<int32_t>{1, 2, 1}));  // seq 1: keys 600..699
  EXPECT_EQ(w.partial, (std::vector<int32_t>{0, 40, 80}));
  EXPECT_EQ(w.indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(w.splits, (std::vector<int32_t>{2, 1}));
}

TEST(CudaWorkList, DeterministicChunksIgnoreTheWorkerCountFastChunksDoNot) {
  const LaunchInputs in;
  DecodeLaunch l = in.launch();
  l.split_tokens = 64;
  const CacheGeometry g = small_geometry();
  EXPECT_EQ(launch_chunk_tokens(l, g, 1), 64);
  EXPECT_EQ(launch_chunk_tokens(l, g, 100000), 64);
  l.mode = SplitMode::kFast;
  const std::vector<int32_t> long_lengths = {4000, 4000};
  l.tables.lengths = long_lengths.data();
  const int32_t few_workers = launch_chunk_tokens(l, g, 1);
  const int32_t many_workers = launch_chunk_tokens(l, g, 1000);
  EXPECT_GT(few_workers, many_workers);
  EXPECT_EQ(many_workers % g.block_size, 0);
}

}  // namespace
}  // namespace pagoda::cuda
