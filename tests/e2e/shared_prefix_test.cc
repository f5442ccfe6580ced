// Shared prefixes over the wire: ForkSequence's count (all or nothing), forks
// decoded in one batch with the bits of their unshared twins and of each fork
// alone, and the metrics counting the bytes actually read and the reads saved.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"

namespace pagoda::e2e {
namespace {

class SharedPrefixTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.tenant_max_sequences = 12;  // the default tenant's quota
    return c;
  }

  grpc::Status fork(uint64_t source, int32_t count, v1::ForkSequenceResponse& resp) {
    grpc::ClientContext ctx;
    v1::ForkSequenceRequest req;
    req.set_source_id(source);
    req.set_count(count);
    return stub_->ForkSequence(&ctx, req, &resp);
  }

  double metric(const std::string& name) {
    std::vector<std::string> errors;
    const auto e = testing::parse_exposition(server_->metrics().exposition(), &errors);
    return e.value(name, {}).value_or(0.0);
  }
};

TEST_F(SharedPrefixTest, ForkCountMakesThatManyAllOrNothing) {
  const uint64_t parent = make_sequence(40);
  v1::GetConfigResponse before;
  ASSERT_TRUE(session_.config(before).ok());
  v1::ForkSequenceResponse r;
  ASSERT_TRUE(fork(parent, 6, r).ok());
  ASSERT_EQ(r.sequence_ids_size(), 6);
  EXPECT_EQ(r.sequence_id(), r.sequence_ids(0));
  std::vector<uint64_t> ids(r.sequence_ids().begin(), r.sequence_ids().end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "ids repeat";
  v1::GetConfigResponse after;
  ASSERT_TRUE(session_.config(after).ok());
  EXPECT_EQ(after.free_blocks(), before.free_blocks()) << "forks share, they copy nothing";
  EXPECT_EQ(after.tenant_sequences(), before.tenant_sequences() + 6);
  for (uint64_t id : ids) {
    v1::GetSequenceResponse s;
    ASSERT_TRUE(session_.get(id, s).ok());
    EXPECT_EQ(s.layer_lengths(0), 40);
  }

  // 7 sequences held, quota 12: 6 more do not fit and none is made.
  v1::ForkSequenceResponse refused;
  const grpc::Status over = fork(parent, 6, refused);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(over.error_message().find("expected at most 12 sequences"), std::string::npos) << over.error_message();
  EXPECT_NE(over.error_message().find("it holds 7, 6 more requested"), std::string::npos) << over.error_message();
  v1::GetConfigResponse unchanged;
  ASSERT_TRUE(session_.config(unchanged).ok());
  EXPECT_EQ(unchanged.tenant_sequences(), after.tenant_sequences());

  for (int32_t bad : {-1, 4097}) {
    const grpc::Status s = fork(parent, bad, refused);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("count: expected 1 to 4096 forks (0 means 1), received " + std::to_string(bad)),
              std::string::npos)
        << s.error_message();
  }
  ASSERT_TRUE(fork(parent, 0, r).ok());  // 0 means one
  EXPECT_EQ(r.sequence_ids_size(), 1);
}

// 4 forks of a 70-token parent (splits of 16 on blocks of 4: 4 whole shared
// chunks) each appending a different token through Decode; their twins hold
// the same K/V unshared.
TEST_F(SharedPrefixTest, ForksDecodeWithTheBitsOfTwinsAndAloneAndTheMetricsCountTheReadsSaved) {
  constexpr int32_t kForks = 4;
  const uint64_t parent = make_sequence(70);
  v1::ForkSequenceResponse r;
  ASSERT_TRUE(fork(parent, kForks, r).ok());
  std::vector<uint64_t> forks(r.sequence_ids().begin(), r.sequence_ids().end());
  std::vector<uint64_t> twins;
  const std::vector<float> pk = mirror_->history(parent, 0).k;
  const std::vector<float> pv = mirror_->history(parent, 0).v;
  for (uint64_t f : forks) {
    mirror_->fork(parent, f);
    uint64_t twin = 0;
    ASSERT_TRUE(session_.create(twin).ok());
    ASSERT_TRUE(session_.append(twin, 0, pk, pv).ok());
    mirror_->create(twin);
    mirror_->append(twin, 0, pk, pv);
    twins.push_back(twin);
  }
  const std::vector<float> k = random_kv(kForks), v = random_kv(kForks), q = random_q(kForks);
  const double read_before = metric("pagoda_kv_read_bytes_total");
  const double shared_before = metric("pagoda_kv_shared_bytes_total");
  v1::DecodeResponse shared, unshared;
  ASSERT_TRUE(session_.decode(0, forks, q, shared, k, v).ok());
  const double read_shared = metric("pagoda_kv_read_bytes_total") - read_before;
  const double saved = metric("pagoda_kv_shared_bytes_total") - shared_before;
  ASSERT_TRUE(session_.decode(0, twins, q, unshared, k, v).ok());
  const double read_unshared = metric("pagoda_kv_read_bytes_total") - read_before - read_shared;
  EXPECT_EQ(shared.output().data(), unshared.output().data()) << "sharing changed the bits";
  EXPECT_EQ(shared.lse().data(), unshared.lse().data());
  const double token_bytes = static_cast<double>(g_.token_kv_bytes());
  EXPECT_EQ(read_unshared, kForks * 71 * token_bytes);
  EXPECT_EQ(saved, (kForks - 1) * 64 * token_bytes);  // chunks 0..3 of 16 tokens read once instead of 4 times
  EXPECT_EQ(read_shared + saved, read_unshared);
  for (int32_t i = 0; i < kForks; ++i) {
    const std::vector<float> ki(k.begin() + i * g_.num_kv_heads * g_.head_dim,
                                k.begin() + (i + 1) * g_.num_kv_heads * g_.head_dim);
    const std::vector<float> vi(v.begin() + i * g_.num_kv_heads * g_.head_dim,
                                v.begin() + (i + 1) * g_.num_kv_heads * g_.head_dim);
    mirror_->append(forks[static_cast<size_t>(i)], 0, ki, vi);
    mirror_->append(twins[static_cast<size_t>(i)], 0, ki, vi);
  }
  // Each fork alone (no append now), the same row bits as in the shared batch.
  const size_t row_bytes = static_cast<size_t>(g_.num_q_heads) * g_.head_dim * sizeof(float);
  for (int32_t i = 0; i < kForks; ++i) {
    const std::vector<float> qi(q.begin() + i * g_.num_q_heads * g_.head_dim,
                                q.begin() + (i + 1) * g_.num_q_heads * g_.head_dim);
    v1::DecodeResponse alone;
    ASSERT_TRUE(session_.decode(0, {forks[static_cast<size_t>(i)]}, qi, alone).ok());
    EXPECT_EQ(alone.output().data(), shared.output().data().substr(static_cast<size_t>(i) * row_bytes, row_bytes))
        << "fork " << i;
  }
  decode_checked(0, forks);
}

}  // namespace
}  // namespace pagoda::e2e
