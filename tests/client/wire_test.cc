// The client's requests carry the geometry's shapes; its checks catch a wrong
// tensor size before anything is sent, and a response whose sizes disagree with
// the request is an error, not a silent truncation.
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/client/tensor.h"
#include "wire.h"

namespace pagoda::client {
namespace {

ServerConfig small_config() {
  ServerConfig c;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 16;
  return c;
}

TEST(WireRequest, ShapesDtypesAndFields) {
  const ServerConfig c = small_config();
  const std::vector<float> q(2 * 4 * 8, 0.5f), k(2 * 2 * 8, 1.f), v(2 * 2 * 8, 2.f);
  const std::vector<uint64_t> ids = {7, 9};
  DecodeArgs args{.layer = 1, .sequence_ids = ids, .q = q, .k = k, .v = v,
                  .q_dtype = DType::kFloat16, .kv_dtype = DType::kBFloat16, .scale = 0.25f,
                  .return_lse = true, .request_id = 42};
  auto req = wire::decode_request(args, c);
  ASSERT_TRUE(req.ok()) << req.error().to_string();
  EXPECT_EQ(req->layer(), 1);
  EXPECT_EQ(std::vector<uint64_t>(req->sequence_ids().begin(), req->sequence_ids().end()), ids);
  EXPECT_EQ(std::vector<int64_t>(req->q().shape().begin(), req->q().shape().end()),
            (std::vector<int64_t>{2, 4, 8}));
  EXPECT_EQ(req->q().dtype(), v1::FLOAT16);
  EXPECT_EQ(req->q().data().size(), q.size() * 2);
  EXPECT_EQ(std::vector<int64_t>(req->k().shape().begin(), req->k().shape().end()),
            (std::vector<int64_t>{2, 2, 8}));
  EXPECT_EQ(req->v().dtype(), v1::BFLOAT16);
  EXPECT_EQ(req->scale(), 0.25f);
  EXPECT_TRUE(req->return_lse());
  EXPECT_EQ(req->request_id(), 42u);
}

// docs/design.md §9: rows = sum(q_lengths) shape q and k/v; the variant fields travel as set.
TEST(WireRequest, VariantFieldsAndRowShapes) {
  const ServerConfig c = small_config();
  const std::vector<float> q(4 * 4 * 8), kv(4 * 2 * 8);
  const std::vector<uint64_t> ids = {7, 9};
  DecodeArgs args{.sequence_ids = ids, .q = q, .k = kv, .v = kv};
  args.q_lengths = {3, 1};
  args.sliding_window = 128;
  args.logits_soft_cap = 50.f;
  args.sinks = {0.5f, -1.f, 2.f, 0.f};
  args.expected_lengths = {30, 12};
  EXPECT_EQ(args.rows(), 4);
  auto req = wire::decode_request(args, c);
  ASSERT_TRUE(req.ok()) << req.error().to_string();
  EXPECT_EQ(req->q().shape(0), 4);
  EXPECT_EQ(req->k().shape(0), 4);
  EXPECT_EQ(std::vector<int32_t>(req->q_lengths().begin(), req->q_lengths().end()), args.q_lengths);
  EXPECT_EQ(req->sliding_window(), 128);
  EXPECT_EQ(req->logits_soft_cap(), 50.f);
  EXPECT_EQ(req->sinks().dtype(), v1::FLOAT32);
  EXPECT_EQ(std::vector<int64_t>(req->sinks().shape().begin(), req->sinks().shape().end()),
            std::vector<int64_t>{4});
  EXPECT_EQ(req->sinks().data().size(), 16u);
  EXPECT_EQ(std::vector<int32_t>(req->expected_lengths().begin(), req->expected_lengths().end()),
            args.expected_lengths);
  // Defaults leave every variant field unset.
  auto plain = wire::decode_request({.sequence_ids = {7}, .q = std::span(q).first(32)}, c);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->q_lengths_size(), 0);
  EXPECT_FALSE(plain->has_sinks());
  EXPECT_EQ(plain->expected_lengths_size(), 0);
}

TEST(WireRequest, WithoutKvLeavesThemUnset) {
  const std::vector<float> q(4 * 8);
  const std::vector<uint64_t> ids = {1};
  auto req = wire::decode_request({.sequence_ids = ids, .q = q}, small_config());
  ASSERT_TRUE(req.ok());
  EXPECT_FALSE(req->has_k());
  EXPECT_FALSE(req->has_v());
}

TEST(WireRequest, ClientSideChecksNameTheField) {
  const ServerConfig c = small_config();
  const std::vector<float> q(4 * 8), short_q(4 * 8 - 1), kv(2 * 8);
  const std::vector<uint64_t> one = {1}, none;
  struct Case {
    const char* name;
    DecodeArgs args;
    const char* field;
  };
  const Case cases[] = {
      {"no ids", {.sequence_ids = none, .q = q}, "sequence_ids"},
      {"short q", {.sequence_ids = one, .q = short_q}, "q: expected 32"},
      {"k without v", {.sequence_ids = one, .q = q, .k = kv}, "k, v"},
      {"short k", {.sequence_ids = one, .q = q, .k = std::span(kv).first(3), .v = kv}, "k: expected 16"},
      {"q_lengths size", {.sequence_ids = one, .q = q, .q_lengths = {1, 1}}, "q_lengths: expected 1 entries"},
      {"q_lengths zero", {.sequence_ids = one, .q = q, .q_lengths = {0}}, "q_lengths[0]: expected >= 1"},
      {"q for rows", {.sequence_ids = one, .q = q, .q_lengths = {2}}, "q: expected 64"},
      {"sinks size", {.sequence_ids = one, .q = q, .sinks = {1.f}}, "sinks: expected 4 values"},
      {"expected_lengths size", {.sequence_ids = one, .q = q, .expected_lengths = {1, 2}}, "expected_lengths"},
  };
  for (const Case& tc : cases) {
    auto req = wire::decode_request(tc.args, c);
    ASSERT_FALSE(req.ok()) << tc.name;
    EXPECT_EQ(req.error().code(), ErrorCode::kInvalidArgument) << tc.name;
    EXPECT_NE(req.error().message().find(tc.field), std::string::npos)
        << tc.name << ": " << req.error().message();
  }
}

v1::DecodeResponse response(size_t out_values, DType dtype) {
  v1::DecodeResponse m;
  m.set_request_id(5);
  std::vector<float> out(out_values);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(i) * 0.5f;
  wire::fill_tensor(*m.mutable_output(), out, dtype, {1, 4, 8});
  m.add_lengths(17);
  m.add_splits(1);
  m.set_split_tokens(512);
  m.set_deterministic(true);
  m.mutable_timing()->set_total_us(12.5);
  return m;
}

TEST(WireResponse, ConvertsOutputToFloat) {
  auto r = wire::decode_result(response(32, DType::kFloat16), small_config(), 1);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->output.size(), 32u);
  EXPECT_EQ(r->output[31], 15.5f);  // exact in fp16
  EXPECT_EQ(r->request_id, 5u);
  EXPECT_EQ(r->lengths, std::vector<int32_t>{17});
  EXPECT_EQ(r->split_tokens, 512);
  EXPECT_TRUE(r->deterministic);
  EXPECT_EQ(r->timing.total_us, 12.5);
  EXPECT_TRUE(r->lse.empty());
}

TEST(WireResponse, OutputOfTheWrongSizeIsAnError) {
  auto r = wire::decode_result(response(31, DType::kFloat32), small_config(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("output.data"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace pagoda::client
