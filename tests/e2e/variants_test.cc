// docs/design.md §9 through the service: multi-token queries (speculative
// verification), sliding windows, soft-caps, sinks, expected lengths and
// TruncateSequence, each checked against the reference; every new error with
// nothing changed.
#include <cstring>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

class VariantTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.block_size = 16;
    c.split_tokens = 512;
    c.num_blocks = 1600;  // 25,600 tokens: long enough for a 4,096 window to matter
    return c;
  }

  // Decodes and checks output and LSE against the mirror, with the variant's
  // fields set on the request. k/v (one row per query row) are appended first
  // when given, and mirrored.
  v1::DecodeResponse decode_variant(int32_t layer, const std::vector<uint64_t>& ids,
                                    const std::vector<int32_t>& q_lengths, int32_t window, float cap,
                                    const std::vector<float>& sinks, bool append) {
    int32_t rows = 0;
    for (int32_t n : q_lengths) rows += n;
    if (q_lengths.empty()) rows = static_cast<int32_t>(ids.size());
    const auto q = random_q(static_cast<size_t>(rows));
    std::vector<float> k, v;
    if (append) {
      k = random_kv(static_cast<size_t>(rows));
      v = random_kv(static_cast<size_t>(rows));
    }
    v1::DecodeRequest req = session_.decode_request(layer, ids, q, k, v);
    for (int32_t n : q_lengths) req.add_q_lengths(n);
    req.set_sliding_window(window);
    req.set_logits_soft_cap(cap);
    if (!sinks.empty()) *req.mutable_sinks() = f32_tensor(sinks, {g_.num_q_heads});
    v1::DecodeResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->Decode(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return resp;
    if (append) {
      const size_t row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
      size_t first = 0;
      for (size_t b = 0; b < ids.size(); ++b) {
        const size_t n = q_lengths.empty() ? 1 : static_cast<size_t>(q_lengths[b]);
        mirror_->append(ids[b], layer, std::vector<float>(k.begin() + first * row, k.begin() + (first + n) * row),
                        std::vector<float>(v.begin() + first * row, v.begin() + (first + n) * row));
        first += n;
      }
    }
    std::vector<int32_t> indptr{0};
    for (size_t b = 0; b < ids.size(); ++b) indptr.push_back(indptr.back() + (q_lengths.empty() ? 1 : q_lengths[b]));
    const std::vector<double> sinks_d(sinks.begin(), sinks.end());
    testing::ReferenceVariant rv;
    rv.q_indptr = indptr.data();
    rv.window = window;
    rv.soft_cap = cap;
    rv.sinks = sinks.empty() ? nullptr : &sinks_d;
    const auto want = mirror_->reference(layer, ids, q, default_scale(g_), rv);
    expect_close(want.out, tensor_values(resp.output()), kOutTolerance, "output");
    expect_close(want.lse, tensor_values(resp.lse()), kLseTolerance, "lse");
    EXPECT_EQ(resp.output().shape(0), rows);
    for (size_t b = 0; b < ids.size(); ++b) EXPECT_EQ(resp.lengths(static_cast<int>(b)), mirror_->length(ids[b], layer));
    return resp;
  }

  std::vector<float> random_sinks() { return random_values(rng_, static_cast<size_t>(g_.num_q_heads), -1.f, 3.f); }

  uint64_t fork(uint64_t source) {
    v1::ForkSequenceRequest req;
    req.set_source_id(source);
    v1::ForkSequenceResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->ForkSequence(&ctx, req, &resp).ok());
    mirror_->fork(source, resp.sequence_id());
    return resp.sequence_id();
  }

  grpc::Status truncate(uint64_t id, int32_t length, v1::TruncateSequenceResponse& resp) {
    v1::TruncateSequenceRequest req;
    req.set_sequence_id(id);
    req.set_length(length);
    grpc::ClientContext ctx;
    return stub_->TruncateSequence(&ctx, req, &resp);
  }
};

TEST_F(VariantTest, Gemma2LikeLayerWindow4096SoftCap50) {
  const std::vector<uint64_t> ids{make_sequence(5000), make_sequence(300)};
  decode_variant(0, ids, {}, 4096, 50.f, {}, /*append=*/true);
  decode_variant(1, ids, {}, 4096, 50.f, {}, /*append=*/false);
}

// The kernels take 1/cap and cap*log2(e) in fp32 (request_decoding.cc says why
// 2^126 is the bound): a cap of 2^126 computes like the reference, a larger one
// (2.4e38 made cap*log2(e) inf: outputs off by 1, LSE inf) is refused.
TEST_F(VariantTest, ASoftCapUpTo2To126ComputesExactlyAndALargerOneIsRefused) {
  const uint64_t a = make_sequence(40);
  decode_variant(0, {a}, {}, 0, 0x1p126f, {}, false);
  decode_variant(0, {a}, {}, 0, 1e30f, {}, true);
  v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1), random_kv(1), random_kv(1));
  r.set_logits_soft_cap(2.4e38f);
  v1::DecodeResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = stub_->Decode(&ctx, r, &resp);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "logits_soft_cap: expected a value in [0, 8.507059e+37] (0: none; at most 2^126, "
                               "past which fp32 cannot compute cap*tanh(s/cap)), received 2.4e+38");
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(a, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 41) << "the refused request appended";
}

TEST_F(VariantTest, GptOssLikeLayerWindow128AndSinks) {
  const std::vector<uint64_t> ids{make_sequence(700), make_sequence(90), make_sequence(0)};
  const auto sinks = random_sinks();
  decode_variant(0, ids, {}, 128, 0.f, sinks, /*append=*/true);
  // The empty sequence with a sink: output 0, LSE = the sink (checked above by
  // the reference; here once more by value).
  const uint64_t empty = make_sequence(0);
  const auto resp = decode_variant(1, {empty}, {}, 128, 0.f, sinks, /*append=*/false);
  const auto lse = tensor_values(resp.lse());
  for (int32_t h = 0; h < g_.num_q_heads; ++h) EXPECT_NEAR(lse[static_cast<size_t>(h)], sinks[h], 1e-6);
  for (float x : tensor_values(resp.output())) ASSERT_EQ(x, 0.f);
}

// Verifying 4 draft tokens in one call gives, row by row, the bits of four
// single-token steps on a fork with the same history.
TEST_F(VariantTest, FourDraftTokensInOneCallAreBitwiseFourSteps) {
  const uint64_t a = make_sequence(1000);
  const uint64_t b = fork(a);
  const int32_t n = 4;
  const auto q = random_q(n);
  const auto k = random_kv(n);
  const auto v = random_kv(n);
  v1::DecodeRequest multi = session_.decode_request(0, {a}, q, k, v);
  multi.add_q_lengths(n);
  v1::DecodeResponse together;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Decode(&ctx, multi, &together).ok());
  }
  mirror_->append(a, 0, k, v);
  EXPECT_EQ(together.lengths(0), 1000 + n);
  const size_t q_row = static_cast<size_t>(g_.num_q_heads) * g_.head_dim;
  const size_t kv_row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
  for (int32_t i = 0; i < n; ++i) {
    const std::vector<float> qi(q.begin() + i * q_row, q.begin() + (i + 1) * q_row);
    const std::vector<float> ki(k.begin() + i * kv_row, k.begin() + (i + 1) * kv_row);
    const std::vector<float> vi(v.begin() + i * kv_row, v.begin() + (i + 1) * kv_row);
    v1::DecodeResponse step;
    ASSERT_TRUE(session_.decode(0, {b}, qi, step, ki, vi).ok());
    const size_t bytes = q_row * sizeof(float);
    EXPECT_EQ(0, std::memcmp(step.output().data().data(), together.output().data().data() + i * bytes, bytes))
        << "row " << i;
    EXPECT_EQ(0, std::memcmp(step.lse().data().data(), together.lse().data().data() + i * g_.num_q_heads * 4,
                             static_cast<size_t>(g_.num_q_heads) * 4))
        << "lse of row " << i;
  }
  // And against the reference.
  std::vector<int32_t> indptr{0, n};
  testing::ReferenceVariant rv;
  rv.q_indptr = indptr.data();
  const auto want = mirror_->reference(0, {a}, q, default_scale(g_), rv);
  expect_close(want.out, tensor_values(together.output()), kOutTolerance, "output");
}

TEST_F(VariantTest, MultiTokenBatchesMixRowCountsAndVariants) {
  const std::vector<uint64_t> ids{make_sequence(40), make_sequence(600), make_sequence(17)};
  decode_variant(0, ids, {2, 5, 16}, 0, 0.f, {}, /*append=*/true);
  decode_variant(1, ids, {1, 16, 3}, 17, 30.f, random_sinks(), /*append=*/false);
  decode_variant(0, ids, {5, 5, 5}, 600, 0.f, {}, /*append=*/true);
}

TEST_F(VariantTest, TruncateRollsBackDraftsAndAnAppendWritesTheKeptBlock) {
  const uint64_t a = make_sequence(45);
  const uint64_t f = fork(a);
  v1::GetConfigResponse before;
  ASSERT_TRUE(session_.config(before).ok());
  v1::TruncateSequenceResponse cut;
  ASSERT_TRUE(truncate(a, 20, cut).ok());
  ASSERT_EQ(cut.layer_lengths_size(), g_.num_layers);
  for (int32_t len : cut.layer_lengths()) EXPECT_EQ(len, 20);
  mirror_->truncate(a, 20);
  // Appended tokens land in the kept partial block (shared with the fork: copied).
  decode_variant(0, {a}, {3}, 0, 0.f, {}, /*append=*/true);
  decode_variant(0, {f}, {}, 0, 0.f, {}, /*append=*/false);  // the fork keeps its 45
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(a, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 23);
  EXPECT_EQ(info.layer_lengths(1), 20);
  EXPECT_EQ(info.blocks_held(), 2);
  // Longer than every layer: nothing changes.
  ASSERT_TRUE(truncate(a, 1000, cut).ok());
  EXPECT_EQ(cut.layer_lengths(0), 23);
  // Errors change nothing.
  EXPECT_EQ(truncate(a, -1, cut).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(truncate(987654321, 1, cut).error_code(), grpc::NOT_FOUND);
  ASSERT_TRUE(session_.get(a, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 23);
}

TEST_F(VariantTest, ExpectedLengthsMakeARetriedStepSafe) {
  const uint64_t a = make_sequence(30);
  const auto q = random_q(1);
  const auto k = random_kv(1), v = random_kv(1);
  v1::DecodeRequest step = session_.decode_request(0, {a}, q, k, v);
  step.add_expected_lengths(30);
  v1::DecodeResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Decode(&ctx, step, &resp).ok());
  }
  mirror_->append(a, 0, k, v);
  // The same step again: the server already has it.
  grpc::ClientContext ctx;
  const grpc::Status again = stub_->Decode(&ctx, step, &resp);
  EXPECT_EQ(again.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(again.error_message().find("expected_lengths[0]"), std::string::npos) << again.error_message();
  EXPECT_NE(again.error_message().find("31"), std::string::npos) << again.error_message();
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(a, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 31);
  // AppendKV's expected_length likewise.
  v1::AppendKVRequest append;
  append.set_sequence_id(a);
  append.set_layer(1);
  *append.mutable_k() = f32_tensor(k, {1, g_.num_kv_heads, g_.head_dim});
  *append.mutable_v() = f32_tensor(v, {1, g_.num_kv_heads, g_.head_dim});
  append.set_expected_length(29);
  v1::AppendKVResponse appended;
  grpc::ClientContext ctx2;
  const grpc::Status stale = stub_->AppendKV(&ctx2, append, &appended);
  EXPECT_EQ(stale.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(stale.error_message().find("expected_length: expected sequence"), 0u) << stale.error_message();
  append.set_expected_length(30);
  grpc::ClientContext ctx3;
  ASSERT_TRUE(stub_->AppendKV(&ctx3, append, &appended).ok());
  EXPECT_EQ(appended.layer_length(), 31);
}

TEST_F(VariantTest, EveryNewFieldErrorNamesItAndChangesNothing) {
  const uint64_t a = make_sequence(10);
  v1::GetSequenceResponse before;
  ASSERT_TRUE(session_.get(a, before).ok());
  auto expect_refused = [&](const v1::DecodeRequest& req, grpc::StatusCode code, const std::string& needle) {
    v1::DecodeResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->Decode(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), code) << needle << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
    v1::GetSequenceResponse after;
    ASSERT_TRUE(session_.get(a, after).ok());
    EXPECT_EQ(after.layer_lengths(0), before.layer_lengths(0)) << needle;
    EXPECT_EQ(after.blocks_held(), before.blocks_held()) << needle;
  };
  const auto k3 = random_kv(3), v3 = random_kv(3);
  {  // q rows do not match sum(q_lengths)
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(2), k3, v3);
    r.add_q_lengths(3);
    expect_refused(r, grpc::INVALID_ARGUMENT, "q.shape");
  }
  {  // n > L
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(11));
    r.add_q_lengths(11);
    expect_refused(r, grpc::INVALID_ARGUMENT, "q_lengths[0]");
  }
  {  // a zero q_length, and a q_lengths of the wrong size
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1));
    r.add_q_lengths(0);
    expect_refused(r, grpc::INVALID_ARGUMENT, "q_lengths[0]");
    r.add_q_lengths(1);
    expect_refused(r, grpc::INVALID_ARGUMENT, "q_lengths");
  }
  {  // negative window, non-finite or negative cap
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1), random_kv(1), random_kv(1));
    r.set_sliding_window(-1);
    expect_refused(r, grpc::INVALID_ARGUMENT, "sliding_window");
    r.set_sliding_window(0);
    r.set_logits_soft_cap(-2.f);
    expect_refused(r, grpc::INVALID_ARGUMENT, "logits_soft_cap");
    r.set_logits_soft_cap(std::numeric_limits<float>::infinity());
    expect_refused(r, grpc::INVALID_ARGUMENT, "logits_soft_cap");
  }
  {  // sinks: shape, dtype, finite
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1), random_kv(1), random_kv(1));
    *r.mutable_sinks() = f32_tensor(random_sinks(), {g_.num_q_heads + 1});
    expect_refused(r, grpc::INVALID_ARGUMENT, "sinks");
    *r.mutable_sinks() = typed_tensor(random_sinks(), {g_.num_q_heads}, DType::kFloat16);
    expect_refused(r, grpc::INVALID_ARGUMENT, "sinks.dtype");
    auto bad = random_sinks();
    bad[1] = std::numeric_limits<float>::quiet_NaN();
    *r.mutable_sinks() = f32_tensor(bad, {g_.num_q_heads});
    expect_refused(r, grpc::INVALID_ARGUMENT, "sinks[1]");
  }
  {  // expected_lengths of the wrong size, or not matching
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1), random_kv(1), random_kv(1));
    r.add_expected_lengths(10);
    r.add_expected_lengths(10);
    expect_refused(r, grpc::INVALID_ARGUMENT, "expected_lengths");
    r.clear_expected_lengths();
    r.add_expected_lengths(9);
    expect_refused(r, grpc::FAILED_PRECONDITION, "expected_lengths[0]");
  }
  {  // non-finite K/V
    auto k = random_kv(1);
    k[70] = std::numeric_limits<float>::infinity();
    v1::DecodeRequest r = session_.decode_request(0, {a}, random_q(1), k, random_kv(1));
    expect_refused(r, grpc::INVALID_ARGUMENT, "k[70]");
  }
}

TEST_F(VariantTest, MultiTokenRequestsOnAStreamAreAnsweredInOrder) {
  const uint64_t a = make_sequence(50);
  grpc::ClientContext ctx;
  auto stream = stub_->DecodeStream(&ctx);
  std::vector<std::vector<float>> qs;
  for (int i = 0; i < 6; ++i) {
    qs.push_back(random_q(3));
    v1::DecodeRequest r = session_.decode_request(i % 2, {a}, qs.back());
    r.add_q_lengths(3);
    r.set_sliding_window(20);
    r.set_request_id(static_cast<uint64_t>(i) + 1);
    ASSERT_TRUE(stream->Write(r));
  }
  stream->WritesDone();
  v1::DecodeResponse resp;
  int i = 0;
  std::vector<int32_t> indptr{0, 3};
  testing::ReferenceVariant rv;
  rv.q_indptr = indptr.data();
  rv.window = 20;
  while (stream->Read(&resp)) {
    EXPECT_EQ(resp.request_id(), static_cast<uint64_t>(i) + 1);
    EXPECT_FALSE(resp.has_error()) << resp.error().message();
    const auto want = mirror_->reference(i % 2, {a}, qs[static_cast<size_t>(i)], default_scale(g_), rv);
    expect_close(want.out, tensor_values(resp.output()), kOutTolerance, "output");
    ++i;
  }
  EXPECT_EQ(i, 6);
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace pagoda::e2e
