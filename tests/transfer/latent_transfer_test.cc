// Export and import of latent-attention sequences (docs/design.md §13, §16): the
// header carries v_head_dim, the data holds K rows alone (V is their prefix),
// the bits survive, and an import whose v_head_dim differs is refused naming it.
#include <gtest/gtest.h>

#include <cmath>

#include "e2e_fixture.h"
#include "transfer_support.h"

namespace pagoda::e2e {
namespace {

ServerConfig latent_config() {
  ServerConfig c = small_config();
  c.kv_heads = 1;
  c.q_heads = 16;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.max_message_bytes = 65536;  // a decode of 16 x 576 fp32 queries fits; an export spans a chunk per layer
  return c;
}

class LatentTransferTest : public ::testing::Test {
 protected:
  std::vector<float> rows(size_t n) { return random_values(rng_, n * 576); }

  // Decodes `id`'s layers with q; outputs and LSEs concatenated.
  std::string decode_bits(Node& node, uint64_t id, const std::vector<float>& q) {
    std::string bits;
    for (int32_t l = 0; l < 2; ++l) {
      v1::DecodeResponse r;
      const grpc::Status s = node.session.decode(l, {id}, q, r, {}, {}, true, 1.f / std::sqrt(192.f));
      EXPECT_TRUE(s.ok()) << s.error_message();
      bits += r.output().data() + r.lse().data();
    }
    return bits;
  }

  std::mt19937 rng_{5};
  Node a_{latent_config()};
  Node b_{latent_config()};
};

TEST_F(LatentTransferTest, RoundTripCarriesKRowsAloneAndKeepsEveryBit) {
  uint64_t id = 0;
  ASSERT_TRUE(a_.session.create(id, "latent").ok());
  ASSERT_TRUE(a_.session.append(id, 0, rows(23), {}).ok());
  ASSERT_TRUE(a_.session.append(id, 1, rows(9), {}).ok());
  grpc::Status status;
  const std::vector<v1::SequenceChunk> chunks = export_chunks(*a_.stub, id, {}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(chunks[0].has_header());
  EXPECT_EQ(chunks[0].header().head_dim(), 576);
  EXPECT_EQ(chunks[0].header().v_head_dim(), 512);
  EXPECT_EQ(data_of(chunks).size(), size_t{32} * 576 * 4);  // fp32 K rows, no V

  v1::ImportSequenceResponse imported;
  ASSERT_TRUE(import_chunks(*b_.stub, chunks, &imported).ok());
  const std::vector<float> q = random_values(rng_, 16 * 576);
  EXPECT_EQ(decode_bits(a_, id, q), decode_bits(b_, imported.sequence_id(), q));
}

TEST_F(LatentTransferTest, AnImportWhoseVHeadDimDiffersIsRefusedNamingIt) {
  uint64_t id = 0;
  ASSERT_TRUE(a_.session.create(id).ok());
  ASSERT_TRUE(a_.session.append(id, 0, rows(4), {}).ok());
  grpc::Status status;
  std::vector<v1::SequenceChunk> chunks = export_chunks(*a_.stub, id, {}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  chunks[0].mutable_header()->set_v_head_dim(576);  // what a plain 576-wide server would send
  v1::ImportSequenceResponse r;
  const grpc::Status s = import_chunks(*b_.stub, chunks, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "header.v_head_dim: expected 512 (this server's --v-head-dim), received 576");
}

}  // namespace
}  // namespace pagoda::e2e
