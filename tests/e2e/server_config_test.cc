// The server's settings: --cache-dtype's fp8 names and --kv-scales in both
// forms, each bad value refused naming the flag (and the file's line), the
// expected and the received value.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

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

std::string scales_file(const std::string& text) {
  const std::string path = ::testing::TempDir() + "kv_scales_" +
                           std::to_string(std::hash<std::string>{}(text)) + ".txt";
  std::ofstream(path) << text;
  return path;
}

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
  const std::string good = scales_file("# layer k v\n0 0.5 0.25\n\n2 1 1  # last\n1 2 4\n");
  auto r = resolve_with("fp8_e5m2", good);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kv_scales[0].k, 0.5f);
  EXPECT_EQ(r->kv_scales[0].v, 0.25f);
  EXPECT_EQ(r->kv_scales[1].k, 2.f);
  EXPECT_EQ(r->kv_scales[1].v, 4.f);
  EXPECT_EQ(r->kv_scales[2].k, 1.f);

  const std::string missing = scales_file("0 1 1\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", missing), "--kv-scales: expected a line for every layer of 3 in '" +
                                                        missing + "', received none for layer 1");
  const std::string repeated = scales_file("0 1 1\n1 1 1\n1 2 2\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", repeated),
                 "--kv-scales: expected each layer once (" + repeated + ":3), received layer 1 again");
  const std::string range = scales_file("0 1 1\n3 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", range),
                 "--kv-scales: expected a layer in [0, 3) (" + range + ":2), received 3");
  const std::string malformed = scales_file("0 1\n");
  expect_refused(resolve_with("fp8_e5m2", malformed),
                 "--kv-scales: expected 'layer k_scale v_scale' (" + malformed + ":1), received '0 1'");
  const std::string zero = scales_file("0 1 1\n1 0 1\n2 1 1\n");
  expect_refused(resolve_with("fp8_e5m2", zero),
                 "--kv-scales: expected finite scales > 0 (" + zero + ":2), received 0");
  expect_refused(resolve_with("fp8_e5m2", "/nonexistent/scales.txt"),
                 "--kv-scales: expected 'K,V' or a readable file of 'layer k_scale v_scale' lines, received "
                 "'/nonexistent/scales.txt' (not readable)");
}

}  // namespace
}  // namespace pagoda
