// Latent attention (MLA, docs/design.md §16) over the wire: one KV head of
// 576-element latent rows, V their first 512, k-only appends and decodes, the
// model's scale from the client; and everything else (variants, forks, shared
// chunks, truncation, batching) as on any server. Outputs against the double
// reference, which reads V as the prefix of K's rows itself. Contexts stay
// short: 16 query heads over 576-wide rows are heavy in double.
#include <gtest/gtest.h>

#include <cmath>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

// DeepSeek-V3's scale without YaRN: 1/sqrt(qk_nope 128 + qk_rope 64).
const float kScale = 1.f / std::sqrt(192.f);

ServerConfig latent_config() {
  ServerConfig c = small_config();
  c.kv_heads = 1;
  c.q_heads = 16;
  c.head_dim = 576;
  c.v_head_dim = 512;
  return c;
}

class LatentTest : public ServerTest {
 protected:
  ServerConfig config() const override { return latent_config(); }

  // A sequence whose every layer holds `len` random latent rows, appended as k alone.
  uint64_t latent_sequence(int32_t len) {
    uint64_t id = 0;
    EXPECT_TRUE(session_.create(id).ok());
    mirror_->create(id);
    for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
      if (len == 0) continue;
      const auto k = random_kv(static_cast<size_t>(len));
      int32_t length = 0;
      const grpc::Status s = session_.append(id, layer, k, {}, &length);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(length, len);
      mirror_->append(id, layer, k, {});
    }
    return id;
  }

  // A decode with k alone appended (when given) and the model's scale, checked
  // against the reference; the output is [rows, q_heads, v_head_dim].
  v1::DecodeResponse checked(int32_t layer, const std::vector<uint64_t>& ids, const std::vector<float>& k,
                             v1::DecodeRequest request, const testing::ReferenceVariant& variant = {}) {
    const std::vector<float> q = tensor_values(request.q());
    v1::DecodeResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->Decode(&ctx, request, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!k.empty()) {
      const size_t row = static_cast<size_t>(g_.head_dim);
      size_t at = 0;
      for (size_t b = 0; b < ids.size(); ++b) {
        const size_t n = request.q_lengths_size() > 0 ? static_cast<size_t>(request.q_lengths(static_cast<int>(b))) : 1;
        mirror_->append(ids[b], layer, std::vector<float>(k.begin() + at * row, k.begin() + (at + n) * row), {});
        at += n;
      }
    }
    const auto rows = static_cast<int64_t>(q.size()) / (g_.num_q_heads * g_.head_dim);
    EXPECT_EQ(std::vector<int64_t>(resp.output().shape().begin(), resp.output().shape().end()),
              (std::vector<int64_t>{rows, 16, 512}));
    const testing::ReferenceResult want = mirror_->reference(layer, ids, q, kScale, variant);
    expect_close(want.out, tensor_values(resp.output()), kOutTolerance, "output");
    expect_close(want.lse, tensor_values(resp.lse()), kLseTolerance, "lse");
    return resp;
  }

  v1::DecodeRequest request(int32_t layer, const std::vector<uint64_t>& ids, size_t rows,
                            const std::vector<float>& k = {}) {
    return session_.decode_request(layer, ids, random_q(rows), k, {}, true, kScale);
  }
};

TEST_F(LatentTest, GetConfigReportsBothHeadDims) {
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.head_dim(), 576);
  EXPECT_EQ(c.v_head_dim(), 512);
  EXPECT_EQ(c.num_kv_heads(), 1);
}

TEST_F(LatentTest, KOnlyAppendsAndDecodesMatchTheReference) {
  const std::vector<uint64_t> ids = {latent_sequence(0), latent_sequence(1), latent_sequence(7),
                                     latent_sequence(37)};
  checked(1, ids, {}, request(1, ids, ids.size()));
  // Each sequence appends one latent row and attends it in the same call.
  const auto k = random_kv(ids.size());
  const v1::DecodeResponse r = checked(0, ids, k, request(0, ids, ids.size(), k));
  EXPECT_EQ(std::vector<int32_t>(r.lengths().begin(), r.lengths().end()), (std::vector<int32_t>{1, 2, 8, 38}));
}

TEST_F(LatentTest, AVIsRefusedNamingItAndChangesNothing) {
  const uint64_t id = latent_sequence(5);
  const auto k = random_kv(1);
  int32_t length = 0;
  grpc::Status s = session_.append(id, 0, k, k, &length);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "v: expected no v on a latent-attention server (v_head_dim 512 < head_dim 576: V is "
                               "the first 512 elements of k's rows), received a v tensor");
  v1::DecodeResponse r;
  s = session_.decode(0, {id}, random_q(1), r, k, k, true, kScale);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("v: expected no v", 0), 0u) << s.error_message();
  s = session_.append(id, 0, {}, k, &length);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 5);
}

// Scale 0 means 1/sqrt(head_dim) here too (the wire contract's default):
// the same bits as that scale sent explicitly. Latent models want their own
// scale, which clients send.
TEST_F(LatentTest, AZeroScaleIsOneOverTheRootOfHeadDim) {
  const uint64_t id = latent_sequence(3);
  const std::vector<float> q = random_q(1);
  v1::DecodeResponse by_default, explicit_scale;
  ASSERT_TRUE(session_.decode(0, {id}, q, by_default, {}, {}, true, 0.f).ok());
  ASSERT_TRUE(session_.decode(0, {id}, q, explicit_scale, {}, {}, true, 1.f / std::sqrt(576.f)).ok());
  EXPECT_EQ(by_default.output().data(), explicit_scale.output().data());
  EXPECT_EQ(by_default.lse().data(), explicit_scale.lse().data());
  v1::DecodeResponse other;
  ASSERT_TRUE(session_.decode(0, {id}, q, other, {}, {}, true, kScale).ok());
  EXPECT_NE(by_default.lse().data(), other.lse().data()) << "the scale reached the kernel";
}

TEST_F(LatentTest, AWrongKShapeNamesHeadDim) {
  const uint64_t id = latent_sequence(2);
  v1::AppendKVRequest req;
  req.set_sequence_id(id);
  *req.mutable_k() = f32_tensor(random_values(rng_, 512), {1, 1, 512});
  v1::AppendKVResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = stub_->AppendKV(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "k.shape: expected [n, 1, 576], received [1, 1, 512]");
}

TEST_F(LatentTest, VariantsApplyUnchanged) {
  const std::vector<uint64_t> ids = {latent_sequence(20), latent_sequence(41)};
  // Two and three draft rows per sequence, each appending its latent row first.
  v1::DecodeRequest req = request(0, ids, 5, random_kv(5));
  req.add_q_lengths(2);
  req.add_q_lengths(3);
  req.set_sliding_window(13);
  req.set_logits_soft_cap(3.f);
  const std::vector<float> sinks = random_values(rng_, 16);
  *req.mutable_sinks() = f32_tensor(sinks, {16});
  const std::vector<int32_t> q_indptr = {0, 2, 5};
  const std::vector<double> sinks_d(sinks.begin(), sinks.end());
  testing::ReferenceVariant v;
  v.q_indptr = q_indptr.data();
  v.window = 13;
  v.soft_cap = 3.0;
  v.sinks = &sinks_d;
  checked(0, ids, tensor_values(req.k()), req, v);
}

TEST_F(LatentTest, OutputBitsDoNotDependOnTheBatch) {
  const uint64_t a = latent_sequence(45);
  const std::vector<uint64_t> others = {latent_sequence(3), latent_sequence(60)};
  const std::vector<float> q = random_q(1);
  v1::DecodeResponse alone, together;
  ASSERT_TRUE(session_.decode(1, {a}, q, alone, {}, {}, true, kScale).ok());
  std::vector<float> batch_q = random_q(1);
  batch_q.insert(batch_q.end(), q.begin(), q.end());
  const std::vector<float> tail = random_q(1);
  batch_q.insert(batch_q.end(), tail.begin(), tail.end());
  ASSERT_TRUE(session_.decode(1, {others[0], a, others[1]}, batch_q, together, {}, {}, true, kScale).ok());
  const size_t row_bytes = size_t{16} * 512 * sizeof(float);
  EXPECT_EQ(alone.output().data(), together.output().data().substr(row_bytes, row_bytes));
  EXPECT_EQ(alone.lse().data(), together.lse().data().substr(16 * sizeof(float), 16 * sizeof(float)));
}

TEST_F(LatentTest, ForksShareChunksAndTruncateAsAnywhere) {
  const uint64_t parent = latent_sequence(40);  // two whole 16-token chunks shared, then 8 tokens
  v1::ForkSequenceRequest fork;
  fork.set_source_id(parent);
  fork.set_count(3);
  v1::ForkSequenceResponse forked;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->ForkSequence(&ctx, fork, &forked).ok());
  ASSERT_EQ(forked.sequence_ids_size(), 3);
  const std::vector<uint64_t> forks(forked.sequence_ids().begin(), forked.sequence_ids().end());
  for (uint64_t f : forks) mirror_->fork(parent, f);
  // Each fork appends its own row; the shared chunks are read once for all three.
  const auto k = random_kv(3);
  const v1::DecodeRequest req = request(0, forks, 3, k);
  const v1::DecodeResponse shared = checked(0, forks, k, req);
  // A fork alone has the bits it had in the shared batch (deterministic mode).
  const std::vector<float> q = tensor_values(req.q());
  const size_t q_row = size_t{16} * 576;
  v1::DecodeResponse alone;
  ASSERT_TRUE(session_
                  .decode(0, {forks[1]}, std::vector<float>(q.begin() + q_row, q.begin() + 2 * q_row), alone, {},
                          {}, true, kScale)
                  .ok());
  const size_t row_bytes = size_t{16} * 512 * sizeof(float);
  EXPECT_EQ(alone.output().data(), shared.output().data().substr(row_bytes, row_bytes));

  v1::TruncateSequenceRequest cut;
  cut.set_sequence_id(forks[2]);
  cut.set_length(19);
  v1::TruncateSequenceResponse cut_resp;
  grpc::ClientContext cut_ctx;
  ASSERT_TRUE(stub_->TruncateSequence(&cut_ctx, cut, &cut_resp).ok());
  mirror_->truncate(forks[2], 19);
  checked(0, {forks[2], parent}, {}, request(0, {forks[2], parent}, 2));
}

}  // namespace
}  // namespace pagoda::e2e
