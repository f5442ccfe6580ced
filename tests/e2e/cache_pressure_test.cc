// A nearly full cache under the main use case: pipelined decode-with-append
// steps whose last block has room. Pins (in-flight Decodes, the determinism
// checker at rate 1) must not count as shares: no step may be refused for want
// of a block, and no block may be copied needlessly.
#include <thread>

#include "e2e_fixture.h"
#include "engine/determinism_checker.h"

namespace pagoda::e2e {
namespace {

class CachePressureTest : public ServerTest {
 protected:
  static constexpr int32_t kSequences = 12;
  static constexpr int32_t kSteps = 15;  // in flight at once, all in one last block

  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.block_size = 16;
    c.split_tokens = 16;
    c.num_blocks = 2 * kSequences;  // each sequence: one full block and one with 15 free slots
    c.determinism_sample_rate = 1;
    c.max_batch_wait_us = 200;  // pipelined steps coalesce into shared launches
    return c;
  }
};

TEST_F(CachePressureTest, PipelinedStepsIntoPinnedBlocksNeedNoBlockAndCopyNothing) {
  std::vector<uint64_t> ids;
  for (int32_t s = 0; s < kSequences; ++s) ids.push_back(make_sequence(17));
  v1::GetConfigResponse before;
  ASSERT_TRUE(session_.config(before).ok());
  ASSERT_EQ(before.free_blocks(), 0) << "the cache is full before the steps";

  int refused = 0;
  for (uint64_t id : ids) {
    for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
      // Every step of this sequence and layer is written before any answer is read.
      std::vector<v1::DecodeRequest> requests;
      std::vector<std::vector<float>> qs, ks, vs;
      for (int32_t step = 0; step < kSteps; ++step) {
        qs.push_back(random_q(1));
        ks.push_back(random_kv(1));
        vs.push_back(random_kv(1));
        v1::DecodeRequest r = session_.decode_request(layer, {id}, qs.back(), ks.back(), vs.back());
        r.set_request_id(static_cast<uint64_t>(step) + 1);
        requests.push_back(r);
      }
      grpc::ClientContext ctx;
      auto stream = stub_->DecodeStream(&ctx);
      for (const auto& r : requests) ASSERT_TRUE(stream->Write(r));
      stream->WritesDone();
      std::vector<v1::DecodeResponse> responses;
      v1::DecodeResponse resp;
      while (stream->Read(&resp)) responses.push_back(resp);
      ASSERT_TRUE(stream->Finish().ok());
      ASSERT_EQ(responses.size(), requests.size());
      int32_t length = mirror_->length(id, layer);
      for (int32_t step = 0; step < kSteps; ++step) {
        const v1::DecodeResponse& got = responses[static_cast<size_t>(step)];
        if (got.has_error()) {
          ++refused;
          ADD_FAILURE() << "step " << step << " of sequence " << id << " layer " << layer << ": "
                        << got.error().message();
          continue;
        }
        // Each step attends over exactly the tokens before it and its own.
        mirror_->append(id, layer, ks[static_cast<size_t>(step)], vs[static_cast<size_t>(step)]);
        EXPECT_EQ(got.lengths(0), ++length);
        const auto want = mirror_->reference(layer, {id}, qs[static_cast<size_t>(step)], default_scale(g_));
        expect_close(want.out, tensor_values(got.output()), kOutTolerance, "output");
      }
    }
  }
  EXPECT_EQ(refused, 0) << "of " << kSequences * g_.num_layers * kSteps << " steps";

  // Once the checks are done nothing is pinned: the free blocks are exactly
  // what the sequences do not hold (no needless copy-on-write copy happened).
  server_->checker().wait_idle();
  int32_t held = 0;
  for (uint64_t id : ids) {
    v1::GetSequenceResponse info;
    ASSERT_TRUE(session_.get(id, info).ok());
    EXPECT_EQ(info.layer_lengths(0), 17 + kSteps);
    EXPECT_EQ(info.layer_lengths(1), 17 + kSteps);
    held += info.blocks_held();
  }
  EXPECT_EQ(held, 2 * kSequences);
  v1::GetConfigResponse after;
  ASSERT_TRUE(session_.config(after).ok());
  EXPECT_EQ(after.free_blocks(), after.total_blocks() - held);
  const DeterminismChecker::Stats checks = server_->checker().stats();
  EXPECT_GT(checks.checked, 0u);
  EXPECT_EQ(checks.mismatches, 0u);
}

// A sequence and its fork in one Decode with one free block: one copy, then the
// last holder writes in place, as the same two appends made one at a time.
TEST_F(CachePressureTest, ForkPairInOneBatchNeedsWhatTwoSeparateCallsNeed) {
  std::vector<uint64_t> ids;
  for (int32_t s = 0; s < kSequences - 1; ++s) ids.push_back(make_sequence(17));
  const uint64_t a = make_sequence(17);  // the cache is full
  v1::ForkSequenceRequest fork;
  fork.set_source_id(a);
  v1::ForkSequenceResponse forked;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ForkSequence(&ctx, fork, &forked).ok());
  }
  mirror_->fork(a, forked.sequence_id());
  // Free one sequence (two blocks back) and take one of them again: one block is free.
  {
    grpc::ClientContext ctx;
    v1::FreeSequenceRequest free;
    free.set_sequence_id(ids.back());
    v1::FreeSequenceResponse freed;
    ASSERT_TRUE(stub_->FreeSequence(&ctx, free, &freed).ok());
    mirror_->free(ids.back());
  }
  make_sequence(16);
  server_->checker().wait_idle();
  v1::GetConfigResponse cfg;
  ASSERT_TRUE(session_.config(cfg).ok());
  ASSERT_EQ(cfg.free_blocks(), 1);
  const std::vector<uint64_t> pair{a, forked.sequence_id()};
  const auto k = random_kv(2), v = random_kv(2);
  decode_checked(0, pair, k, v);
  server_->checker().wait_idle();
  ASSERT_TRUE(session_.config(cfg).ok());
  EXPECT_EQ(cfg.free_blocks(), 0) << "one copy-on-write copy, the last holder writes in place";
}

}  // namespace
}  // namespace pagoda::e2e
