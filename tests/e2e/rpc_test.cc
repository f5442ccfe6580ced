// Every RPC's happy path over loopback, outputs checked against the naive reference.
#include <cmath>

#include <fmt/format.h>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

using RpcTest = ServerTest;

TEST_F(RpcTest, GetConfigReportsTheServerSettings) {
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  const ServerConfig want = small_config();
  EXPECT_EQ(c.num_layers(), want.layers);
  EXPECT_EQ(c.num_q_heads(), want.q_heads);
  EXPECT_EQ(c.num_kv_heads(), want.kv_heads);
  EXPECT_EQ(c.head_dim(), want.head_dim);
  EXPECT_EQ(c.block_size(), want.block_size);
  EXPECT_EQ(c.cache_dtype(), v1::FLOAT32);
  EXPECT_EQ(c.total_blocks(), want.num_blocks);
  EXPECT_EQ(c.free_blocks(), want.num_blocks);
  EXPECT_EQ(c.split_tokens(), want.split_tokens);
  EXPECT_TRUE(c.deterministic());
  EXPECT_EQ(c.backend(), "cpu");
  EXPECT_FALSE(c.device_name().empty());
  EXPECT_EQ(c.version(), PAGODA_VERSION);
  EXPECT_EQ(c.max_message_bytes(), want.max_message_bytes);
  EXPECT_EQ(c.max_batch(), want.max_batch);
}

TEST_F(RpcTest, CreateAppendGetSequence) {
  uint64_t a = 0, b = 0;
  ASSERT_TRUE(session_.create(a, "alpha").ok());
  ASSERT_TRUE(session_.create(b).ok());
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  int32_t length = 0;
  ASSERT_TRUE(session_.append(a, 1, random_kv(7), random_kv(7), &length).ok());
  EXPECT_EQ(length, 7);
  ASSERT_TRUE(session_.append(a, 1, random_kv(2), random_kv(2), &length).ok());
  EXPECT_EQ(length, 9);

  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(a, info).ok());
  EXPECT_EQ(info.sequence_id(), a);
  EXPECT_EQ(info.label(), "alpha");
  ASSERT_EQ(info.layer_lengths_size(), 2);
  EXPECT_EQ(info.layer_lengths(0), 0);
  EXPECT_EQ(info.layer_lengths(1), 9);
  EXPECT_EQ(info.blocks_held(), 3);  // 9 tokens in blocks of 4

  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.free_blocks(), c.total_blocks() - 3);
}

TEST_F(RpcTest, DecodeMatchesReferenceWithSplitsAndLengths) {
  // Lengths around block (4) and split (16) boundaries, and one long sequence.
  const std::vector<int32_t> lens{1, 4, 15, 16, 17, 100};
  std::vector<uint64_t> ids;
  for (int32_t len : lens) ids.push_back(make_sequence(len));
  for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
    const v1::DecodeResponse r = decode_checked(layer, ids);
    EXPECT_EQ(r.split_tokens(), 16);
    EXPECT_TRUE(r.deterministic());
    ASSERT_EQ(r.splits_size(), static_cast<int>(lens.size()));
    for (size_t i = 0; i < lens.size(); ++i) EXPECT_EQ(r.splits(static_cast<int>(i)), (lens[i] + 15) / 16);
    EXPECT_EQ(r.output().dtype(), v1::FLOAT32);
    ASSERT_EQ(r.output().shape_size(), 3);
    EXPECT_EQ(r.output().shape(0), static_cast<int64_t>(lens.size()));
    EXPECT_EQ(r.lse().dtype(), v1::FLOAT32);
    EXPECT_GE(r.timing().total_us(), r.timing().compute_us());
  }
}

TEST_F(RpcTest, DecodeWithNewTokenAppendsFirstThenAttends) {
  std::vector<uint64_t> ids{make_sequence(3), make_sequence(8), make_sequence(0)};
  for (int step = 0; step < 6; ++step) {
    const v1::DecodeResponse r = decode_checked(0, ids, random_kv(3), random_kv(3));
    EXPECT_EQ(r.lengths(0), 4 + step);
    EXPECT_EQ(r.lengths(2), 1 + step);
  }
  // Layer 1 was not touched by layer 0's appends.
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(ids[1], info).ok());
  EXPECT_EQ(info.layer_lengths(0), 14);
  EXPECT_EQ(info.layer_lengths(1), 8);
  decode_checked(1, ids);
}

TEST_F(RpcTest, LayersAreAppendedIndependently) {
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  mirror_->create(id);
  const int32_t lens[2] = {5, 23};
  for (int32_t layer = 1; layer >= 0; --layer) {
    const auto k = random_kv(static_cast<size_t>(lens[layer]));
    const auto v = random_kv(static_cast<size_t>(lens[layer]));
    ASSERT_TRUE(session_.append(id, layer, k, v).ok());
    mirror_->append(id, layer, k, v);
  }
  decode_checked(0, {id});
  decode_checked(1, {id});
}

TEST_F(RpcTest, EmptySequenceYieldsZeroOutputAndMinusInfinityLse) {
  const uint64_t id = make_sequence(0);
  const v1::DecodeResponse r = decode_checked(0, {id});
  for (float x : tensor_values(r.output())) EXPECT_EQ(x, 0.f);
  for (float x : tensor_values(r.lse())) EXPECT_TRUE(std::isinf(x) && x < 0);
  EXPECT_EQ(r.splits(0), 0);
}

TEST_F(RpcTest, LseIsOmittedUnlessAskedAndExplicitScaleIsUsed) {
  const uint64_t id = make_sequence(20);
  const auto q = random_q(1);
  v1::DecodeResponse r;
  ASSERT_TRUE(session_.decode(0, {id}, q, r, {}, {}, /*return_lse=*/false, /*scale=*/0.3f).ok());
  EXPECT_FALSE(r.has_lse());
  const testing::ReferenceResult want = mirror_->reference(0, {id}, q, 0.3f);
  expect_close(want.out, tensor_values(r.output()), kOutTolerance, "output at scale 0.3");
}

TEST_F(RpcTest, Fp16AndBf16TensorsOnTheWire) {
  // K/V values that bf16 holds exactly go in as bf16; q goes in as fp16 and the
  // output comes back as fp16.
  uint64_t id = 0;
  ASSERT_TRUE(session_.create(id).ok());
  mirror_->create(id);
  auto k = random_kv(30), v = random_kv(30);
  for (std::vector<float>* x : {&k, &v})
    for (float& e : *x) e = std::round(e * 64.f) / 64.f;
  const int64_t n = 30;
  v1::AppendKVRequest req;
  req.set_sequence_id(id);
  req.set_layer(0);
  *req.mutable_k() = typed_tensor(k, {n, g_.num_kv_heads, g_.head_dim}, DType::kBFloat16);
  *req.mutable_v() = typed_tensor(v, {n, g_.num_kv_heads, g_.head_dim}, DType::kBFloat16);
  v1::AppendKVResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->AppendKV(&ctx, req, &resp).ok());
  mirror_->append(id, 0, k, v);

  auto q = random_q(1);
  for (float& e : q) e = std::round(e * 256.f) / 256.f;  // exact in fp16
  v1::DecodeRequest dreq = session_.decode_request(0, {id}, q);
  *dreq.mutable_q() = typed_tensor(q, {1, g_.num_q_heads, g_.head_dim}, DType::kFloat16);
  v1::DecodeResponse dresp;
  grpc::ClientContext dctx;
  ASSERT_TRUE(stub_->Decode(&dctx, dreq, &dresp).ok());
  EXPECT_EQ(dresp.output().dtype(), v1::FLOAT16);
  const testing::ReferenceResult want = mirror_->reference(0, {id}, q, default_scale(g_));
  // fp16 output: half a unit in the last place of values below 1.
  expect_close(want.out, tensor_values(dresp.output()), 1.0 / 2048, "fp16 output");
  expect_close(want.lse, tensor_values(dresp.lse()), kLseTolerance, "lse");
}

TEST_F(RpcTest, MergingTwoShardsByLseEqualsTheWholeSequence) {
  // The whole sequence, and the same keys split into two shards (two sequences).
  const int32_t n1 = 21, n2 = 34;
  uint64_t whole = 0, first = 0, second = 0;
  ASSERT_TRUE(session_.create(whole).ok());
  ASSERT_TRUE(session_.create(first).ok());
  ASSERT_TRUE(session_.create(second).ok());
  const auto k1 = random_kv(n1), v1s = random_kv(n1), k2 = random_kv(n2), v2s = random_kv(n2);
  ASSERT_TRUE(session_.append(whole, 0, k1, v1s).ok());
  ASSERT_TRUE(session_.append(whole, 0, k2, v2s).ok());
  ASSERT_TRUE(session_.append(first, 0, k1, v1s).ok());
  ASSERT_TRUE(session_.append(second, 0, k2, v2s).ok());

  const auto q1 = random_q(1);
  std::vector<float> q3;
  for (int i = 0; i < 3; ++i) q3.insert(q3.end(), q1.begin(), q1.end());
  v1::DecodeResponse r;
  ASSERT_TRUE(session_.decode(0, {whole, first, second}, q3, r).ok());
  const auto out = tensor_values(r.output());
  const auto lse = tensor_values(r.lse());
  const int32_t d = g_.head_dim, h = g_.num_q_heads;
  for (int32_t head = 0; head < h; ++head) {
    const double la = lse[static_cast<size_t>(h + head)], lb = lse[static_cast<size_t>(2 * h + head)];
    const double m = std::max(la, lb);
    const double wa = std::exp(la - m), wb = std::exp(lb - m);
    EXPECT_NEAR(m + std::log(wa + wb), lse[static_cast<size_t>(head)], kLseTolerance) << "head " << head;
    for (int32_t i = 0; i < d; ++i) {
      const double oa = out[static_cast<size_t>((h + head) * d + i)];
      const double ob = out[static_cast<size_t>((2 * h + head) * d + i)];
      EXPECT_NEAR((wa * oa + wb * ob) / (wa + wb), out[static_cast<size_t>(head * d + i)], kOutTolerance)
          << "head " << head << " element " << i;
    }
  }
}

TEST_F(RpcTest, ForkSharesBlocksAndCopiesOnWrite) {
  const uint64_t a = make_sequence(10);  // last block (of 4) partly filled
  uint64_t b = 0;
  {
    grpc::ClientContext ctx;
    v1::ForkSequenceRequest req;
    req.set_source_id(a);
    v1::ForkSequenceResponse resp;
    ASSERT_TRUE(stub_->ForkSequence(&ctx, req, &resp).ok());
    b = resp.sequence_id();
    mirror_->fork(a, b);
  }
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.free_blocks(), c.total_blocks() - 3);  // shared, not copied

  // Same keys, same q: the same bits.
  const auto q2 = [&] {
    auto q = random_q(1);
    std::vector<float> both(q);
    both.insert(both.end(), q.begin(), q.end());
    return both;
  }();
  v1::DecodeResponse r;
  ASSERT_TRUE(session_.decode(0, {a, b}, q2, r).ok());
  const std::string& bytes = r.output().data();
  EXPECT_EQ(bytes.substr(0, bytes.size() / 2), bytes.substr(bytes.size() / 2));

  // Diverge: each appends its own token into the shared last block.
  decode_checked(0, {a}, random_kv(1), random_kv(1));
  decode_checked(0, {b}, random_kv(1), random_kv(1));
  decode_checked(0, {a, b});
  decode_checked(1, {a, b});

  // Freeing the source leaves the fork intact.
  {
    grpc::ClientContext ctx;
    v1::FreeSequenceRequest req;
    req.set_sequence_id(a);
    v1::FreeSequenceResponse resp;
    ASSERT_TRUE(stub_->FreeSequence(&ctx, req, &resp).ok());
    mirror_->free(a);
  }
  decode_checked(0, {b});
  {
    grpc::ClientContext ctx;
    v1::FreeSequenceRequest req;
    req.set_sequence_id(b);
    v1::FreeSequenceResponse resp;
    ASSERT_TRUE(stub_->FreeSequence(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.free_blocks(), c.total_blocks());
}

// The 16-bit cache dtypes: K/V values on a 1/64 grid are exact in fp16 and bf16,
// so the reference sees exactly what the cache holds.
class CacheDtypeTest : public ServerTest, public ::testing::WithParamInterface<const char*> {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.cache_dtype = GetParam();
    return c;
  }
};

TEST_P(CacheDtypeTest, DecodeMatchesReference) {
  auto on_grid = [](std::vector<float> x) {
    for (float& e : x) e = std::round(e * 64.f) / 64.f;
    return x;
  };
  std::vector<uint64_t> ids;
  for (int32_t len : {3, 29, 70}) {
    uint64_t id = 0;
    ASSERT_TRUE(session_.create(id).ok());
    mirror_->create(id);
    const auto k = on_grid(random_kv(static_cast<size_t>(len))), v = on_grid(random_kv(static_cast<size_t>(len)));
    ASSERT_TRUE(session_.append(id, 0, k, v).ok());
    mirror_->append(id, 0, k, v);
    ids.push_back(id);
  }
  decode_checked(0, ids, on_grid(random_kv(3)), on_grid(random_kv(3)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CacheDtypeTest, ::testing::Values("fp16", "bf16"),
                         [](const auto& info) { return std::string(info.param); });

class FastModeTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.mode = "fast";
    return c;
  }
};

TEST_F(FastModeTest, SaysHowItComputedAndMatchesReference) {
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_FALSE(c.deterministic());
  const std::vector<uint64_t> ids{make_sequence(300), make_sequence(5)};
  const v1::DecodeResponse r = decode_checked(0, ids);
  EXPECT_FALSE(r.deterministic());
  ASSERT_GT(r.split_tokens(), 0);
  EXPECT_EQ(r.split_tokens() % g_.block_size, 0);
  EXPECT_EQ(r.splits(0), (300 + r.split_tokens() - 1) / r.split_tokens());
}

class GeometryTest : public ServerTest, public ::testing::WithParamInterface<std::tuple<int, int, int>> {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    std::tie(c.q_heads, c.kv_heads, c.head_dim) = GetParam();
    return c;
  }
};

TEST_P(GeometryTest, GqaAndHeadDimsMatchReference) {
  std::vector<uint64_t> ids{make_sequence(13), make_sequence(40)};
  decode_checked(0, ids, random_kv(2), random_kv(2));
  decode_checked(1, ids);
}

INSTANTIATE_TEST_SUITE_P(Geometries, GeometryTest,
                         ::testing::Values(std::make_tuple(8, 8, 64), std::make_tuple(8, 2, 128),
                                           std::make_tuple(16, 1, 64), std::make_tuple(4, 2, 256)),
                         [](const auto& info) {
                           return fmt::format("q{}_kv{}_d{}", std::get<0>(info.param), std::get<1>(info.param),
                                              std::get<2>(info.param));
                         });

}  // namespace
}  // namespace pagoda::e2e
