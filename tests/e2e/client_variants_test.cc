// docs/design.md §9 through the C++ client against the server: a speculative step
// (draft rows appended and verified in one Decode with a window, a soft-cap and
// sinks), the accepted prefix kept with truncate_sequence, and retries made
// safe by expected lengths.
#include "pagoda/client/client.h"

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

class ClientVariantTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.block_size = 16;
    c.split_tokens = 32;
    return c;
  }
};

TEST_F(ClientVariantTest, DraftsVerifiedTruncatedAndRetriedSafely) {
  auto client = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()));
  auto id = client->create_sequence("spec");
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  mirror_->create(*id);
  const auto prompt_k = random_kv(40), prompt_v = random_kv(40);
  ASSERT_TRUE(client->append_kv(*id, 0, prompt_k, prompt_v).ok());
  mirror_->append(*id, 0, prompt_k, prompt_v);

  // Four draft tokens: appended and attended in one call.
  const int32_t drafts = 4;
  const auto q = random_q(drafts), k = random_kv(drafts), v = random_kv(drafts);
  const auto sinks = random_values(rng_, static_cast<size_t>(g_.num_q_heads), -1.f, 3.f);
  client::DecodeArgs args{.layer = 0, .sequence_ids = {*id}, .q = q, .k = k, .v = v, .return_lse = true};
  args.q_lengths = {drafts};
  args.sliding_window = 20;
  args.logits_soft_cap = 30.f;
  args.sinks = sinks;
  args.expected_lengths = {40};
  auto r = client->decode(args);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  mirror_->append(*id, 0, k, v);
  const std::vector<int32_t> indptr{0, drafts};
  const std::vector<double> sinks_d(sinks.begin(), sinks.end());
  testing::ReferenceVariant rv{.q_indptr = indptr.data(), .window = 20, .soft_cap = 30, .sinks = &sinks_d};
  const auto want = mirror_->reference(0, {*id}, q, default_scale(g_), rv);
  ASSERT_EQ(r->output.size(), static_cast<size_t>(drafts) * g_.num_q_heads * g_.head_dim);
  expect_close(want.out, r->output, kOutTolerance, "output");
  expect_close(want.lse, r->lse, kLseTolerance, "lse");
  EXPECT_EQ(r->lengths, std::vector<int32_t>{44});

  // The same step retried: the server already has it, refuses, changes nothing.
  auto again = client->decode(args);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), client::ErrorCode::kFailedPrecondition);
  EXPECT_NE(again.error().message().find("expected_lengths[0]"), std::string::npos) << again.error().message();

  // Two drafts accepted: keep 42 tokens.
  auto lengths = client->truncate_sequence(*id, 42);
  ASSERT_TRUE(lengths.ok()) << lengths.error().to_string();
  EXPECT_EQ((*lengths)[0], 42);
  mirror_->truncate(*id, 42);
  auto info = client->get_sequence(*id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layer_lengths[0], 42);

  // The next token, appended only where the length is still 42.
  const auto k1 = random_kv(1), v1 = random_kv(1);
  auto stale = client->append_kv(*id, 0, k1, v1, DType::kFloat32, 41);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), client::ErrorCode::kFailedPrecondition);
  auto appended = client->append_kv(*id, 0, k1, v1, DType::kFloat32, 42);
  ASSERT_TRUE(appended.ok()) << appended.error().to_string();
  EXPECT_EQ(*appended, 43);
  mirror_->append(*id, 0, k1, v1);

  // A plain decode after the cut sees exactly the kept prefix and the new token.
  const auto q1 = random_q(1);
  auto step = client->decode({.layer = 0, .sequence_ids = {*id}, .q = q1, .return_lse = true});
  ASSERT_TRUE(step.ok()) << step.error().to_string();
  const auto want1 = mirror_->reference(0, {*id}, q1, default_scale(g_));
  expect_close(want1.out, step->output, kOutTolerance, "output after the cut");
}

TEST_F(ClientVariantTest, VariantSizesAreCheckedBeforeSending) {
  auto client = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()));
  const auto q = random_q(3);
  client::DecodeArgs args{.layer = 0, .sequence_ids = {1, 2}, .q = q};
  args.q_lengths = {2, 0};
  auto r = client->decode(args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("q_lengths[1]: expected >= 1, received 0"), std::string::npos)
      << r.error().message();
  args.q_lengths = {2, 1};
  args.sinks = {1.f};
  r = client->decode(args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("sinks: expected " + std::to_string(g_.num_q_heads)), std::string::npos)
      << r.error().message();
}

// A step applied whose answer was lost: decode_step, sent again with the same
// expected lengths, finds the step applied and re-reads it (the same bits)
// instead of appending the token twice.
TEST_F(ClientVariantTest, AStepAppliedButUnansweredIsReReadNotAppendedTwice) {
  auto client = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()));
  auto id = client->create_sequence("retry");
  ASSERT_TRUE(id.ok());
  const auto k0 = random_kv(30), v0 = random_kv(30);
  ASSERT_TRUE(client->append_kv(*id, 0, k0, v0).ok());
  const auto q = random_q(1), k = random_kv(1), v = random_kv(1);
  client::DecodeArgs args{.layer = 0, .sequence_ids = {*id}, .q = q, .k = k, .v = v, .return_lse = true};
  args.expected_lengths = {30};
  auto first = client->decode(args);  // its answer "lost"
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  auto step = client->decode_step(args);
  ASSERT_TRUE(step.ok()) << step.error().to_string();
  EXPECT_TRUE(step->replayed);
  EXPECT_EQ(step->output, first->output);
  EXPECT_EQ(step->lse, first->lse);
  EXPECT_EQ(client->get_sequence(*id)->layer_lengths[0], 31);
  // Another sequence's length moved meanwhile: not this step's doing, refused.
  args.expected_lengths = {29};
  auto stale = client->decode_step(args);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), client::ErrorCode::kFailedPrecondition);
  EXPECT_EQ(client->get_sequence(*id)->layer_lengths[0], 31);
}

// Nothing listening: every call is UNAVAILABLE, and the waits between them
// stop doubling at max_backoff (uncapped, eleven doublings from 1 ms would
// wait 2 s in all; capped at 2 ms, about 21 ms).
TEST(ClientRetry, BackoffStopsDoublingAtItsCap) {
  auto client = client::Client::connect("127.0.0.1:1", {.timeout = std::chrono::milliseconds(200)});
  const std::vector<float> row(static_cast<size_t>(8), 0.f);
  client::DecodeArgs args{.layer = 0, .sequence_ids = {1}, .q = row, .k = row, .v = row};
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client->decode_step(args, {.attempts = 12,
                                      .backoff = std::chrono::milliseconds(1),
                                      .max_backoff = std::chrono::milliseconds(2)});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), client::ErrorCode::kUnavailable) << r.error().to_string();
  EXPECT_LT(seconds, 1.0) << "the waits kept doubling past max_backoff";
}

// Steps under 1 ms deadlines, many timing out: through decode_step each is
// applied exactly once, and the outputs match the reference.
TEST_F(ClientVariantTest, TinyDeadlinesThroughTheHelperApplyEachStepOnce) {
  auto fast = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()),
                                      {.timeout = std::chrono::milliseconds(1)});
  auto plain = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()));
  auto id = plain->create_sequence("tiny");
  ASSERT_TRUE(id.ok());
  mirror_->create(*id);
  const auto k0 = random_kv(8), v0 = random_kv(8);
  ASSERT_TRUE(plain->append_kv(*id, 0, k0, v0).ok());
  mirror_->append(*id, 0, k0, v0);
  int replayed = 0, retried = 0;
  for (int s = 0; s < 40; ++s) {
    const auto q = random_q(1), k = random_kv(1), v = random_kv(1);
    client::DecodeArgs args{.layer = 0, .sequence_ids = {*id}, .q = q, .k = k, .v = v};
    auto r = fast->decode_step(args, {.attempts = 200, .backoff = std::chrono::milliseconds(1)});
    ASSERT_TRUE(r.ok()) << "step " << s << ": " << r.error().to_string();
    mirror_->append(*id, 0, k, v);
    replayed += r->replayed;
    retried += r->attempts > 1;
    const auto want = mirror_->reference(0, {*id}, q, default_scale(g_));
    expect_close(want.out, r->output, kOutTolerance, "step output");
    ASSERT_EQ(plain->get_sequence(*id)->layer_lengths[0], 8 + s + 1) << "step " << s << " applied twice or not";
  }
  RecordProperty("retried", retried);
  RecordProperty("replayed", replayed);
}

}  // namespace
}  // namespace pagoda::e2e
