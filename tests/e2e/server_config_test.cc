// The server's settings: --cache-dtype's fp8 names, --cpu-prefetch's levels and
// --kv-scales in both forms, each bad value refused naming the flag (and the file's line), the
// expected and the received value.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <unistd.h>

#include "app/server_config.h"

namespace pagoda {
namespace {

StatusOr<EffectiveConfig> resolve_with(const std::string& dtype, const std::string& scales) {
  ServerConfig c;
  c.layers = 3;
  c.cache_dtype = dtype;
  c.kv_scales = scales;
  return resolve_config(c);
}

// A --kv-scales file holding `text`, removed when the test is done with it.
class ScalesFile {
 public:
  explicit ScalesFile(const std::string& text)
      : path_(::testing::TempDir() + "kv_scales_" + std::to_string(::getpid()) + "_" +
              std::to_string(std::hash<std::string>{}(text)) + ".txt") {
    std::ofstream(path_) << text;
  }
  ~ScalesFile() { std::remove(path_.c_str()); }
  ScalesFile(const ScalesFile&) = delete;
  ScalesFile& operator=(const ScalesFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void expect_refused(const StatusOr<EffectiveConfig>& r, const std::string& message) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), message);
}

TEST(ServerConfig, Fp8CacheDtypesAreAcceptedByName) {
  auto e4m3 = resolve_with("fp8_e4m3", "1,1");
  ASSERT_TRUE(e4m3.ok()) << e4m3.status().message();
  EXPECT_EQ(e4m3->geometry.dtype, DType::kFloat8E4M3);
  auto e5m2 = resolve_with("fp8_e5m2", "1,1");
  ASSERT_TRUE(e5m2.ok());
  EXPECT_EQ(e5m2->geometry.dtype, DType::kFloat8E5M2);
  expect_refused(resolve_with("fp8", "1,1"),
                 "--cache-dtype: expected fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2, received 'fp8'");
}

TEST(ServerConfig, CpuPrefetchLevelsAreAcceptedByName) {
  for (const char* level : {"auto", "l1", "l2"}) {
    ServerConfig c;
    c.cpu_prefetch = level;
    const auto r = resolve_config(c);
    EXPECT_TRUE(r.ok()) << level << ": " << r.status().message();
  }
  ServerConfig c;
  c.cpu_prefetch = "L3";
  expect_refused(resolve_config(c), "--cpu-prefetch: expected auto, l1 or l2, received 'L3'");
}

TEST(ServerConfig, KvScalesAsOnePairForEveryLayer) {
  auto r = resolve_with("fp8_e4m3", "0.5,2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->kv_scales.size(), 3u);
  for (const KvScale& s : r->kv_scales) {
    EXPECT_EQ(s.k, 0.5f);
    EXPECT_EQ(s.v, 2.f);
  }
  auto defaults = resolve_with("fp16", "1,1");
  ASSERT_TRUE(defaults.ok());
  for (const KvScale& s : defaults->kv_scales) EXPECT_EQ(s.k * s.v, 1.f);
  expect_refused(resolve_with("fp8_e4m3", "0,1"), "--kv-scales: expected finite scales > 0, received 0");
  expect_refused(resolve_with("fp8_e4m3", "1,-2"), "--kv-scales: expected finite scales > 0, received -2");
  expect_refused(resolve_with("fp8_e4m3", "1,inf"), "--kv-scales: expected finite scales > 0, received inf");
}

TEST(ServerConfig, KvScalesFromAFileOfLayerLines) {
  const ScalesFile good("# layer k v\n0 0.5 0.25\n\n2 1 1  # last\n1 2 4\n");
  auto r = resolve_with("fp8_e5m2", good.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kv_scales[0].k, 0.5f);
  EXPECT_EQ(r->kv_scales[0].v, 0.25f);
  EXPECT_EQ(r->kv_scales[1].k, 2.f);
  EXPECT_EQ(r->kv_scales[1].v, 4.f);
  EXPECT_EQ(r->kv_scales[2].k, 1.f);

  const ScalesFile missing("0 1 1\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", missing.path()),
                 "--kv-scales: expected a line for every layer of 3 in '" + missing.path() +
                     "', received none for layer 1");
  const ScalesFile repeated("0 1 1\n1 1 1\n1 2 2\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", repeated.path()),
                 "--kv-scales: expected each layer once (" + repeated.path() + ":3), received layer 1 again");
  const ScalesFile range("0 1 1\n3 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", range.path()),
                 "--kv-scales: expected a layer in [0, 3) (" + range.path() + ":2), received 3");
  const ScalesFile malformed("0 1\n");
  expect_refused(resolve_with("fp8_e5m2", malformed.path()),
                 "--kv-scales: expected 'layer k_scale v_scale' (" + malformed.path() + ":1), received '0 1'");
  const ScalesFile zero("0 1 1\n1 0 1\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", zero.path()),
                 "--kv-scales: expected finite scales > 0 (" + zero.path() + ":2), received 0");
  expect_refused(resolve_with("fp8_e5m2", "/nonexistent/scales.txt"),
                 "--kv-scales: expected 'K,V' or a readable file of 'layer k_scale v_scale' lines, received "
                 "'/nonexistent/scales.txt' (not readable)");
}

// Latent attention (docs/design.md §16): --v-head-dim from the one head-shape
// table, 0 meaning --head-dim, and one scale per layer.
StatusOr<EffectiveConfig> resolve_latent(int32_t head_dim, int32_t v_head_dim, const std::string& scales = "1,1") {
  ServerConfig c;
  c.kv_heads = 1;
  c.q_heads = 16;
  c.head_dim = head_dim;
  c.v_head_dim = v_head_dim;
  c.kv_scales = scales;
  return resolve_config(c);
}

TEST(ServerConfig, VHeadDimIsTheTablesPartnerOfHeadDim) {
  auto mla = resolve_latent(576, 512);
  ASSERT_TRUE(mla.ok()) << mla.status().message();
  EXPECT_EQ(mla->geometry.v_dim(), 512);
  EXPECT_TRUE(mla->geometry.latent());
  // K alone per token: 576 fp16 elements x 16 tokens x 2 layers, no V.
  EXPECT_EQ(block_bytes(mla->geometry), int64_t{576} * 2 * 16 * 2);
  auto plain = resolve_latent(128, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->geometry.v_dim(), 128);
  EXPECT_FALSE(plain->geometry.latent());
  expect_refused(resolve_latent(576, 0),
                 "v_head_dim: expected 512 with head_dim 576 (V is the first 512 elements of K's row), received 576");
  expect_refused(resolve_latent(128, 64), "v_head_dim: expected 128 (head_dim) with head_dim 128, received 64");
  expect_refused(resolve_latent(128, -1), "v_head_dim: expected 128 (head_dim) with head_dim 128, received -1");
  expect_refused(resolve_latent(96, 0), "head_dim: expected 64, 128, 256 or 576, received 96");
}

TEST(ServerConfig, LatentAttentionHasOneScalePerLayer) {
  ASSERT_TRUE(resolve_latent(576, 512, "0.5,0.5").ok());
  expect_refused(resolve_latent(576, 512, "0.5,1"),
                 "--kv-scales: expected the V scale equal to the K scale on a latent-attention server (V is the "
                 "first 512 elements of K's row, stored once), received layer 0 K 0.5 V 1");
}

}  // namespace
}  // namespace pagoda
