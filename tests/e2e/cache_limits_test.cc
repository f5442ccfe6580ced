// What a new user meets first at the cache's edges: the default
// --max-request-blocks refuses nothing the free cache allows, fp16 and bf16
// caches refuse finite values past their range (nothing appended) instead of
// storing +-inf, and the refusals name the right field and say why.
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

// Blocks of 4 tokens, 8 of them, and --max-request-blocks left at its default.
ServerConfig eight_blocks(const char* dtype) {
  ServerConfig c = small_config();
  c.num_blocks = 8;
  c.max_request_blocks = 0;
  c.cache_dtype = dtype;
  return c;
}

class DefaultLimitTest : public ServerTest {
 protected:
  ServerConfig config() const override { return eight_blocks("fp32"); }
};

TEST_F(DefaultLimitTest, OneRequestMayFillTheWholeFreeCache) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  const grpc::Status filled = session_.append(id, 0, random_kv(30), random_kv(30));  // 8 blocks
  ASSERT_TRUE(filled.ok()) << filled.error_message();
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.max_request_blocks(), 8);
  EXPECT_EQ(c.free_blocks(), 0);
  uint64_t other = 0;
  ASSERT_TRUE(session_.create(other).ok());
  const grpc::Status full = session_.append(other, 0, random_kv(1), random_kv(1));
  EXPECT_EQ(full.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(full.error_message(), "cache: expected a request needing at most the 0 free blocks of 8, received one "
                                  "needing 1 (the rest are held; tenants' quotas may add up to more than the cache)");
}

TEST_F(DefaultLimitTest, AppendKVNamesItsOwnFieldForAnUnknownSequence) {
  const grpc::Status s = session_.append(12345, 0, random_kv(1), random_kv(1));
  EXPECT_EQ(s.error_code(), grpc::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "sequence_id: no sequence 12345");
}

class Fp16RangeTest : public ServerTest {
 protected:
  ServerConfig config() const override { return eight_blocks("fp16"); }
};

TEST_F(Fp16RangeTest, FiniteValuesPastTheRangeAreRefusedAndNothingIsAppended) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  std::vector<float> k = random_kv(2), v = random_kv(2);
  k[5] = 65504.f;  // the largest finite fp16: stored as is
  v[200] = 1e5f;   // row 1, head 1, element 8
  const grpc::Status refused = session_.append(id, 0, k, v);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "v[200]: expected values within the fp16 cache's range [-65504, 65504], "
                                     "received 100000 (row 1, head 1, element 8)");
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
  EXPECT_EQ(info.blocks_held(), 0);
  // A Decode that appends is refused the same way, before anything is reserved.
  std::vector<float> k1 = random_kv(1), v1v = random_kv(1);
  k1[3] = -7e4f;
  v1::DecodeResponse r;
  const grpc::Status decode = session_.decode(0, {id}, random_q(1), r, k1, v1v);
  EXPECT_EQ(decode.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(decode.error_message(), "k[3]: expected values within the fp16 cache's range [-65504, 65504], "
                                    "received -70000 (row 0, head 0, element 3)");
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
  // The largest finite fp16 is stored as itself: every later output is finite.
  v[200] = 65504.f;
  ASSERT_TRUE(session_.append(id, 0, k, v).ok());
  ASSERT_TRUE(session_.decode(0, {id}, random_q(1), r).ok());
  for (float x : tensor_values(r.output())) ASSERT_TRUE(std::isfinite(x)) << x;
  for (float x : tensor_values(r.lse())) ASSERT_TRUE(std::isfinite(x)) << x;
}

// The finite and range checks are one pass over each tensor: the first bad
// element of k (then of v) is named, whichever check it fails.
TEST_F(Fp16RangeTest, TheFirstBadElementIsNamedWhicheverCheckItFails) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<std::pair<int, float>> k_bad, v_bad;  // (index, value)
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{2, nan}, {9, 1e5f}}, {}, "k[2]: expected finite values, received nan (row 0, head 0, element 2)"},
      {{{2, 1e5f}, {9, inf}}, {},
       "k[2]: expected values within the fp16 cache's range [-65504, 65504], received 100000 (row 0, head 0, "
       "element 2)"},
      {{}, {{130, -inf}}, "v[130]: expected finite values, received -inf (row 1, head 0, element 2)"},
      {{{200, 7e4f}}, {{0, nan}}, "k[200]: expected values within the fp16 cache's range [-65504, 65504], "
                                 "received 70000 (row 1, head 1, element 8)"},
  };
  for (const Case& c : cases) {
    std::vector<float> k = random_kv(2), v = random_kv(2);
    for (auto [i, x] : c.k_bad) k[static_cast<size_t>(i)] = x;
    for (auto [i, x] : c.v_bad) v[static_cast<size_t>(i)] = x;
    const grpc::Status append = session_.append(id, 0, k, v);
    EXPECT_EQ(append.error_code(), grpc::INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(append.error_message(), c.message);
  }
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
}

class Bf16RangeTest : public ServerTest {
 protected:
  ServerConfig config() const override { return eight_blocks("bf16"); }
};

TEST_F(Bf16RangeTest, Fp32ValuesPastTheBf16RangeAreRefused) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  std::vector<float> k = random_kv(1), v = random_kv(1);
  k[0] = 3.4e38f;  // finite in fp32, +inf in bf16
  const grpc::Status refused = session_.append(id, 0, k, v);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "k[0]: expected values within the bf16 cache's range [-3.3895314e+38, "
                                     "3.3895314e+38], received 3.4e+38 (row 0, head 0, element 0)");
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
}

}  // namespace
}  // namespace pagoda::e2e
