// An fp8 cache through the service (docs/design.md §9): GetConfig reports the dtype
// and the layers' scales, decodes match the reference on the dequantised K/V
// (both formats), fp8 on the wire is refused naming the field, and values
// that saturate are counted in pagoda_kv_saturated_total{layer}.
#include <string>

#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"
#include "pagoda/cpu_targets.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

namespace pagoda::e2e {
namespace {

class Fp8CacheTest : public ServerTest, public ::testing::WithParamInterface<const char*> {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.cache_dtype = GetParam();
    c.kv_scales = "0.5,0.25";
    return c;
  }

  // What the cache holds for x, read back: round(x / scale) * scale.
  std::vector<float> stored(const std::vector<float>& x, float scale) const {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = fp8_to_float(float_to_fp8(x[i] / scale, g_.dtype).code, g_.dtype) * scale;
    return out;
  }

  double saturated_count(int32_t layer) {
    std::vector<std::string> errors;
    const auto e = testing::parse_exposition(server_->metrics().exposition(), &errors);
    EXPECT_TRUE(errors.empty());
    return e.value("pagoda_kv_saturated_total", {{"layer", std::to_string(layer)}}).value_or(-1);
  }
};

TEST_P(Fp8CacheTest, ConfigReportsTheDtypeAndScales) {
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(v1::DType_Name(c.cache_dtype()), std::string(GetParam()) == "fp8_e4m3" ? "FLOAT8_E4M3" : "FLOAT8_E5M2");
  ASSERT_EQ(c.k_scales_size(), g_.num_layers);
  ASSERT_EQ(c.v_scales_size(), g_.num_layers);
  for (int l = 0; l < g_.num_layers; ++l) {
    EXPECT_EQ(c.k_scales(l), 0.5f);
    EXPECT_EQ(c.v_scales(l), 0.25f);
  }
}

TEST_P(Fp8CacheTest, DecodeMatchesTheReferenceOnTheDequantisedCache) {
  std::vector<uint64_t> ids;
  for (int32_t len : {1, 29, 70}) {
    uint64_t id = 0;
    ASSERT_TRUE(session_.create(id).ok());
    mirror_->create(id);
    const auto k = random_kv(static_cast<size_t>(len)), v = random_kv(static_cast<size_t>(len));
    ASSERT_TRUE(session_.append(id, 0, k, v).ok());
    mirror_->append(id, 0, stored(k, 0.5f), stored(v, 0.25f));
    ids.push_back(id);
  }
  // A step that appends first, then one that does not.
  const auto k = random_kv(3), v = random_kv(3);
  const auto q = random_q(3);
  v1::DecodeResponse resp;
  ASSERT_TRUE(session_.decode(0, ids, q, resp, k, v).ok());
  for (size_t b = 0; b < ids.size(); ++b) {
    const size_t row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
    const std::vector<float> kb(k.begin() + b * row, k.begin() + (b + 1) * row);
    const std::vector<float> vb(v.begin() + b * row, v.begin() + (b + 1) * row);
    mirror_->append(ids[b], 0, stored(kb, 0.5f), stored(vb, 0.25f));
  }
  // The server decodes in this process: where a matrix unit takes the cache
  // (bf16 multiplies of the fp8 values, widened exactly), the reference reads
  // q as the unit does and the bound is the unit's.
  if (cpu::bf16_unit_serves(g_)) {
    std::vector<float> q_bf16 = q;
    for (float& x : q_bf16) x = bf16_to_float(float_to_bf16(x));
    const auto want = mirror_->reference(0, ids, q_bf16, default_scale(g_));
    testing::expect_matches_reference(tensor_values(resp.output()), tensor_values(resp.lse()), want,
                                      DType::kFloat32, testing::Arithmetic::kBf16Tiles);
  } else {
    const auto want = mirror_->reference(0, ids, q, default_scale(g_));
    expect_close(want.out, tensor_values(resp.output()), kOutTolerance, "output");
    expect_close(want.lse, tensor_values(resp.lse()), kLseTolerance, "lse");
  }
  decode_checked(0, ids);
}

TEST_P(Fp8CacheTest, Fp8OnTheWireIsRefusedNamingTheField) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  v1::AppendKVRequest req;
  req.set_sequence_id(id);
  req.set_layer(0);
  const std::vector<float> kv(static_cast<size_t>(g_.num_kv_heads) * g_.head_dim, 1.f);
  *req.mutable_k() = f32_tensor(kv, {1, g_.num_kv_heads, g_.head_dim});
  *req.mutable_v() = f32_tensor(kv, {1, g_.num_kv_heads, g_.head_dim});
  req.mutable_k()->set_dtype(v1::FLOAT8_E4M3);
  req.mutable_k()->set_data(std::string(kv.size(), '\x38'));
  v1::AppendKVResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = stub_->AppendKV(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "k.dtype: expected FLOAT32, FLOAT16 or BFLOAT16, received FLOAT8_E4M3 (a cache dtype only)");
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
}

// With k scale 0.5 a key saturates above 0.5 * max; 3 of the row's elements do.
TEST_P(Fp8CacheTest, SaturationsAreCountedPerLayer) {
  EXPECT_EQ(saturated_count(0), 0);
  EXPECT_EQ(saturated_count(1), 0);
  const float max = fp8_spec(g_.dtype).max_value;
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  std::vector<float> k(static_cast<size_t>(g_.num_kv_heads) * g_.head_dim, 1.f), v = k;
  k[0] = 0.5f * max * 2;
  k[5] = -0.5f * max * 1.01f;
  v[7] = 0.25f * max * 4;
  k[9] = 0.5f * max;  // exactly the largest finite value: not saturated
  ASSERT_TRUE(session_.append(id, 1, k, v).ok());
  EXPECT_EQ(saturated_count(0), 0);
  EXPECT_EQ(saturated_count(1), 3);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8CacheTest, ::testing::Values("fp8_e4m3", "fp8_e5m2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace pagoda::e2e
