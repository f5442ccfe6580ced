// Every error code of docs/design.md §5 over the API, each with the field it names, and
// proof that a failed call changes nothing (lengths, free blocks and the bits of
// a probe decode are equal before and after).
#include <cmath>
#include <functional>
#include <limits>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

struct CacheSnapshot {
  std::vector<std::vector<int32_t>> lengths;  // [sequence][layer]
  int32_t free_blocks = 0;
  std::string probe_output;                   // bits of a decode of every sequence on each layer
  bool operator==(const CacheSnapshot&) const = default;
};

class ErrorTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    ids_ = {make_sequence(7), make_sequence(16)};
    probe_q_ = random_q(ids_.size());
  }

  CacheSnapshot snapshot() {
    CacheSnapshot s;
    for (uint64_t id : ids_) {
      v1::GetSequenceResponse info;
      EXPECT_TRUE(session_.get(id, info).ok());
      s.lengths.emplace_back(info.layer_lengths().begin(), info.layer_lengths().end());
    }
    v1::GetConfigResponse c;
    EXPECT_TRUE(session_.config(c).ok());
    s.free_blocks = c.free_blocks();
    for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
      v1::DecodeResponse r;
      EXPECT_TRUE(session_.decode(layer, ids_, probe_q_, r).ok());
      s.probe_output += r.output().data();
    }
    return s;
  }

  // A valid Decode of both sequences that appends a token to each.
  v1::DecodeRequest valid_decode() {
    return session_.decode_request(0, ids_, random_q(2), random_kv(2), random_kv(2));
  }
  v1::AppendKVRequest valid_append() {
    v1::AppendKVRequest r;
    r.set_sequence_id(ids_[0]);
    r.set_layer(1);
    *r.mutable_k() = f32_tensor(random_kv(3), {3, g_.num_kv_heads, g_.head_dim});
    *r.mutable_v() = f32_tensor(random_kv(3), {3, g_.num_kv_heads, g_.head_dim});
    return r;
  }

  std::vector<uint64_t> ids_;
  std::vector<float> probe_q_;
};

void expect_error(const grpc::Status& s, grpc::StatusCode code, const std::string& mentions) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(mentions), std::string::npos)
      << "message '" << s.error_message() << "' does not name '" << mentions << "'";
}

// A broken Decode request: what is changed, the code and what the message names.
struct DecodeCase {
  const char* name;
  std::function<void(v1::DecodeRequest&)> breaks;
  grpc::StatusCode code;
  const char* mentions;
};

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

const std::vector<DecodeCase>& decode_cases() {
  static const std::vector<DecodeCase> cases{
      {"layer_past_the_end", [](auto& r) { r.set_layer(2); }, grpc::INVALID_ARGUMENT, "layer"},
      {"layer_negative", [](auto& r) { r.set_layer(-1); }, grpc::INVALID_ARGUMENT, "layer"},
      {"no_sequences", [](auto& r) { r.clear_sequence_ids(); }, grpc::INVALID_ARGUMENT, "sequence_ids"},
      {"duplicate_sequence", [](auto& r) { r.set_sequence_ids(1, r.sequence_ids(0)); }, grpc::INVALID_ARGUMENT,
       "sequence_ids"},
      {"q_dtype_unspecified", [](auto& r) { r.mutable_q()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::INVALID_ARGUMENT, "q.dtype"},
      {"q_dtype_unknown", [](auto& r) { r.mutable_q()->set_dtype(static_cast<v1::DType>(9)); },
       grpc::INVALID_ARGUMENT, "q.dtype"},
      {"q_batch_mismatch", [](auto& r) { r.mutable_q()->set_shape(0, 3); }, grpc::INVALID_ARGUMENT, "q.shape"},
      {"q_wrong_rank", [](auto& r) { r.mutable_q()->mutable_shape()->RemoveLast(); }, grpc::INVALID_ARGUMENT,
       "q.shape"},
      {"q_wrong_heads", [](auto& r) { r.mutable_q()->set_shape(1, 4); }, grpc::INVALID_ARGUMENT, "q.shape"},
      {"q_byte_count", [](auto& r) { r.mutable_q()->mutable_data()->pop_back(); }, grpc::INVALID_ARGUMENT,
       "q.data"},
      {"k_without_v", [](auto& r) { r.clear_v(); }, grpc::INVALID_ARGUMENT, "k without v"},
      {"v_without_k", [](auto& r) { r.clear_k(); }, grpc::INVALID_ARGUMENT, "v without k"},
      {"k_wrong_kv_heads", [](auto& r) { r.mutable_k()->set_shape(1, 8); }, grpc::INVALID_ARGUMENT, "k.shape"},
      {"v_byte_count", [](auto& r) { r.mutable_v()->mutable_data()->append("xx"); }, grpc::INVALID_ARGUMENT,
       "v.data"},
      {"v_dtype_differs_from_k",
       [](auto& r) {
         r.mutable_v()->set_dtype(v1::FLOAT16);
         r.mutable_v()->mutable_data()->resize(r.v().data().size() / 2);
       },
       grpc::INVALID_ARGUMENT, "v.dtype"},
      {"scale_nan", [](auto& r) { r.set_scale(kNaN); }, grpc::INVALID_ARGUMENT, "scale"},
      {"scale_infinite", [](auto& r) { r.set_scale(kInf); }, grpc::INVALID_ARGUMENT, "scale"},
      {"scale_negative", [](auto& r) { r.set_scale(-0.5f); }, grpc::INVALID_ARGUMENT, "scale"},
      {"unknown_sequence_with_a_known_one", [](auto& r) { r.set_sequence_ids(1, 987654321); }, grpc::NOT_FOUND,
       "987654321"},
  };
  return cases;
}

class DecodeErrorTest : public ErrorTest, public ::testing::WithParamInterface<DecodeCase> {};

TEST_P(DecodeErrorTest, FailsWithItsCodeAndChangesNothing) {
  const CacheSnapshot before = snapshot();
  v1::DecodeRequest req = valid_decode();
  GetParam().breaks(req);
  grpc::ClientContext ctx;
  v1::DecodeResponse resp;
  expect_error(stub_->Decode(&ctx, req, &resp), GetParam().code, GetParam().mentions);
  EXPECT_TRUE(snapshot() == before);
  // The same request unbroken succeeds: the failure was the case's doing.
  grpc::ClientContext ok_ctx;
  EXPECT_TRUE(stub_->Decode(&ok_ctx, valid_decode(), &resp).ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeErrorTest, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

struct AppendCase {
  const char* name;
  std::function<void(v1::AppendKVRequest&)> breaks;
  grpc::StatusCode code;
  const char* mentions;
};

const std::vector<AppendCase>& append_cases() {
  static const std::vector<AppendCase> cases{
      {"layer_past_the_end", [](auto& r) { r.set_layer(5); }, grpc::INVALID_ARGUMENT, "layer"},
      {"k_dtype_unspecified", [](auto& r) { r.mutable_k()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::INVALID_ARGUMENT, "k.dtype"},
      {"missing_v", [](auto& r) { r.clear_v(); }, grpc::INVALID_ARGUMENT, "k without v"},
      {"token_count_differs", [](auto& r) { r.mutable_v()->set_shape(0, 2); }, grpc::INVALID_ARGUMENT, "v.shape"},
      {"head_dim_wrong", [](auto& r) { r.mutable_k()->set_shape(2, 32); }, grpc::INVALID_ARGUMENT, "k.shape"},
      {"zero_tokens",
       [](auto& r) {
         r.mutable_k()->set_shape(0, 0);
         r.mutable_k()->clear_data();
         r.mutable_v()->set_shape(0, 0);
         r.mutable_v()->clear_data();
       },
       grpc::INVALID_ARGUMENT, "k.shape[0]"},
      {"unknown_sequence", [](auto& r) { r.set_sequence_id(424242); }, grpc::NOT_FOUND, "424242"},
  };
  return cases;
}

class AppendErrorTest : public ErrorTest, public ::testing::WithParamInterface<AppendCase> {};

TEST_P(AppendErrorTest, FailsWithItsCodeAndChangesNothing) {
  const CacheSnapshot before = snapshot();
  v1::AppendKVRequest req = valid_append();
  GetParam().breaks(req);
  grpc::ClientContext ctx;
  v1::AppendKVResponse resp;
  expect_error(stub_->AppendKV(&ctx, req, &resp), GetParam().code, GetParam().mentions);
  EXPECT_TRUE(snapshot() == before);
  grpc::ClientContext ok_ctx;
  EXPECT_TRUE(stub_->AppendKV(&ok_ctx, valid_append(), &resp).ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, AppendErrorTest, ::testing::ValuesIn(append_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(ErrorTest, UnknownSequenceIsNotFoundForEveryRpc) {
  const CacheSnapshot before = snapshot();
  {
    grpc::ClientContext ctx;
    v1::GetSequenceRequest req;
    req.set_sequence_id(777);
    v1::GetSequenceResponse resp;
    expect_error(stub_->GetSequence(&ctx, req, &resp), grpc::NOT_FOUND, "777");
  }
  {
    grpc::ClientContext ctx;
    v1::ForkSequenceRequest req;
    req.set_source_id(778);
    v1::ForkSequenceResponse resp;
    expect_error(stub_->ForkSequence(&ctx, req, &resp), grpc::NOT_FOUND, "778");
  }
  {
    grpc::ClientContext ctx;
    v1::FreeSequenceRequest req;
    req.set_sequence_id(779);
    v1::FreeSequenceResponse resp;
    expect_error(stub_->FreeSequence(&ctx, req, &resp), grpc::NOT_FOUND, "779");
  }
  EXPECT_TRUE(snapshot() == before);
}

TEST_F(ErrorTest, FreedSequenceIsGone) {
  grpc::ClientContext ctx;
  v1::FreeSequenceRequest req;
  req.set_sequence_id(ids_[0]);
  v1::FreeSequenceResponse resp;
  ASSERT_TRUE(stub_->FreeSequence(&ctx, req, &resp).ok());
  v1::DecodeResponse r;
  expect_error(session_.decode(0, {ids_[0]}, random_q(1), r), grpc::NOT_FOUND, std::to_string(ids_[0]));
  grpc::ClientContext again;
  expect_error(stub_->FreeSequence(&again, req, &resp), grpc::NOT_FOUND, std::to_string(ids_[0]));
}

// A cache of 8 blocks of 4 tokens, and a 64 KiB message limit.
class ExhaustionTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.num_blocks = 8;
    c.max_message_bytes = 64 << 10;
    return c;
  }
};

TEST_F(ExhaustionTest, CacheFullIsResourceExhaustedAndAllOrNothing) {
  const uint64_t full = make_sequence(20);     // 5 blocks, the last one full
  const uint64_t roomy = make_sequence(11);    // 3 blocks, room for one more token
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  ASSERT_EQ(c.free_blocks(), 0);
  const auto probe = random_q(2);
  v1::DecodeResponse before;
  ASSERT_TRUE(session_.decode(0, {full, roomy}, probe, before).ok());

  // `roomy` alone could take its token; `full` needs a block: neither is appended.
  v1::DecodeResponse r;
  expect_error(session_.decode(0, {roomy, full}, random_q(2), r, random_kv(2), random_kv(2)),
               grpc::RESOURCE_EXHAUSTED, "cache");
  int32_t length = 0;
  expect_error(session_.append(full, 1, random_kv(1), random_kv(1), &length), grpc::RESOURCE_EXHAUSTED, "cache");
  v1::DecodeResponse after;
  ASSERT_TRUE(session_.decode(0, {full, roomy}, probe, after).ok());
  EXPECT_EQ(after.output().data(), before.output().data());
  EXPECT_EQ(after.lengths(0), 20);
  EXPECT_EQ(after.lengths(1), 11);

  // The other sequences stay usable; freeing one makes room again.
  decode_checked(0, {roomy}, random_kv(1), random_kv(1));
  grpc::ClientContext ctx;
  v1::FreeSequenceRequest free_req;
  free_req.set_sequence_id(full);
  v1::FreeSequenceResponse free_resp;
  ASSERT_TRUE(stub_->FreeSequence(&ctx, free_req, &free_resp).ok());
  mirror_->free(full);
  decode_checked(0, {roomy}, random_kv(1), random_kv(1));
  decode_checked(1, {roomy});
}

TEST_F(ExhaustionTest, MessageOverTheLimitIsResourceExhausted) {
  const uint64_t id = make_sequence(1);
  // 200 tokens of fp32 K and V: 2 * 200 * 2 * 64 * 4 bytes = 200 KiB > 64 KiB.
  int32_t length = 0;
  const grpc::Status s = session_.append(id, 0, random_kv(200), random_kv(200), &length);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 1);
}

}  // namespace
}  // namespace pagoda::e2e
