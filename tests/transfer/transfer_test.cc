// ExportSequence and ImportSequence between two in-process servers (DESIGN
// §13): bits survive, block sizes may differ, every refusal creates nothing,
// an export is a pinned cut, stages append, tenants stay apart.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "e2e_fixture.h"
#include "transfer_support.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;

// Small chunks: an export of a few dozen tokens spans many.
ServerConfig chunked(int32_t block_size) {
  ServerConfig c = small_config();
  c.block_size = block_size;
  c.num_blocks = 1024 / block_size;
  c.max_message_bytes = 4096;  // 3 tokens of 2 heads x 64 fp32 K and V per chunk
  return c;
}

class TransferTest : public ::testing::Test {
 protected:
  const CacheGeometry& g() const { return a_->server->config().geometry; }
  std::vector<float> kv(size_t tokens) { return random_values(rng_, tokens * g().num_kv_heads * g().head_dim); }
  std::vector<float> q() { return random_values(rng_, static_cast<size_t>(g().num_q_heads * g().head_dim)); }

  // A sequence on `node` with lengths[l] random tokens in layer l.
  uint64_t make(Node& node, const std::vector<int32_t>& lengths, const std::string& label = "") {
    uint64_t id = 0;
    EXPECT_TRUE(node.session.create(id, label).ok());
    for (size_t l = 0; l < lengths.size(); ++l) {
      append(node, id, static_cast<int32_t>(l), lengths[l]);
    }
    return id;
  }

  // Appends in pieces that fit the server's --max-message-bytes.
  void append(Node& node, uint64_t id, int32_t layer, int32_t tokens) {
    const auto piece = static_cast<int32_t>((node.server->config().raw.max_message_bytes - 512) /
                                            (2 * g().num_kv_heads * g().head_dim * sizeof(float)));
    for (int32_t done = 0; done < tokens; done += piece) {
      const auto n = static_cast<size_t>(std::min(piece, tokens - done));
      const grpc::Status s = node.session.append(id, layer, kv(n), kv(n));
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
  }

  // Decodes `id` on `node` for every layer; outputs and LSEs concatenated.
  std::string decode_bits(Node& node, uint64_t id, const std::vector<float>& query) {
    std::string bits;
    for (int32_t l = 0; l < g().num_layers; ++l) {
      v1::DecodeResponse r;
      const grpc::Status s = node.session.decode(l, {id}, query, r);
      EXPECT_TRUE(s.ok()) << s.error_message();
      bits += r.output().data() + r.lse().data();
    }
    return bits;
  }

  std::vector<v1::SequenceChunk> exported(Node& node, uint64_t id, const std::vector<int32_t>& from = {}) {
    grpc::Status status;
    std::vector<v1::SequenceChunk> chunks = export_chunks(*node.stub, id, from, &status);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return chunks;
  }

  // An import that must fail with `code`, leaving `node` as it was.
  void expect_refused(Node& node, const std::vector<v1::SequenceChunk>& chunks, grpc::StatusCode code,
                      const std::vector<std::string>& message_has = {}) {
    const v1::GetConfigResponse before = node.config();
    v1::ImportSequenceResponse response;
    const grpc::Status s = import_chunks(*node.stub, chunks, &response);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    for (const std::string& part : message_has) EXPECT_NE(s.error_message().find(part), std::string::npos) << s.error_message();
    const v1::GetConfigResponse after = node.config();
    EXPECT_EQ(after.tenant_sequences(), before.tenant_sequences());
    EXPECT_EQ(after.free_blocks(), before.free_blocks());
  }

  std::mt19937 rng_{77};
  std::unique_ptr<Node> a_ = std::make_unique<Node>(chunked(4));
  std::unique_ptr<Node> b_ = std::make_unique<Node>(chunked(4));
};

TEST_F(TransferTest, RoundTripKeepsEveryBitAndTheLabel) {
  const uint64_t id = make(*a_, {37, 29}, "prompt-7");
  const std::vector<v1::SequenceChunk> chunks = exported(*a_, id);
  ASSERT_GT(chunks.size(), 10u);
  ASSERT_TRUE(chunks[0].has_header());
  EXPECT_EQ(chunks[0].header().layer_lengths(0), 37);
  EXPECT_EQ(chunks[0].header().layer_lengths(1), 29);
  for (const v1::SequenceChunk& c : chunks) EXPECT_LE(static_cast<int64_t>(c.ByteSizeLong()), 4096);
  // fp32 cache: the bytes are 37 + 29 tokens of K and V rows.
  EXPECT_EQ(data_of(chunks).size(), size_t{66} * 2 * 2 * 64 * 4);

  v1::ImportSequenceResponse imported;
  ASSERT_TRUE(import_chunks(*b_->stub, chunks, &imported).ok());
  EXPECT_NE(imported.sequence_id(), 0u);
  EXPECT_EQ(std::vector<int32_t>(imported.layer_lengths().begin(), imported.layer_lengths().end()),
            (std::vector<int32_t>{37, 29}));
  v1::GetSequenceResponse info;
  ASSERT_TRUE(b_->session.get(imported.sequence_id(), info).ok());
  EXPECT_EQ(info.label(), "prompt-7");

  const std::vector<float> query = q();
  EXPECT_EQ(decode_bits(*a_, id, query), decode_bits(*b_, imported.sequence_id(), query));
  // And back out again: the same bytes.
  EXPECT_EQ(data_of(exported(*b_, imported.sequence_id())), data_of(chunks));
}

TEST_F(TransferTest, BlockSizesMayDiffer) {
  Node seven(chunked(8));
  Node sixteen(chunked(16));
  const uint64_t id = make(*a_, {41, 23});
  const std::vector<v1::SequenceChunk> chunks = exported(*a_, id);
  v1::ImportSequenceResponse in7;
  ASSERT_TRUE(import_chunks(*seven.stub, chunks, &in7).ok());
  v1::GetSequenceResponse info;
  ASSERT_TRUE(seven.session.get(in7.sequence_id(), info).ok());
  EXPECT_EQ(info.blocks_held(), 6);  // ceil(41 / 8)
  // 4 -> 8 -> 16: still the same bytes and the same outputs.
  v1::ImportSequenceResponse in16;
  ASSERT_TRUE(import_chunks(*sixteen.stub, exported(seven, in7.sequence_id()), &in16).ok());
  EXPECT_EQ(data_of(exported(sixteen, in16.sequence_id())), data_of(chunks));
  const std::vector<float> query = q();
  const std::string want = decode_bits(*a_, id, query);
  EXPECT_EQ(decode_bits(seven, in7.sequence_id(), query), want);
  EXPECT_EQ(decode_bits(sixteen, in16.sequence_id(), query), want);
}

TEST_F(TransferTest, EmptySequenceTravelsToo) {
  const uint64_t id = make(*a_, {0, 0}, "empty");
  const std::vector<v1::SequenceChunk> chunks = exported(*a_, id);
  ASSERT_EQ(chunks.size(), 1u);
  v1::ImportSequenceResponse r;
  ASSERT_TRUE(import_chunks(*b_->stub, chunks, &r).ok());
  EXPECT_EQ(r.layer_lengths(0), 0);
}

TEST_F(TransferTest, CorruptChunksCreateNothing) {
  const uint64_t id = make(*a_, {20, 20});
  const std::vector<v1::SequenceChunk> good = exported(*a_, id);
  ASSERT_GT(good.size(), 5u);

  auto flipped = good;
  (*flipped[3].mutable_data())[5] ^= 0x01;
  expect_refused(*b_, flipped, grpc::StatusCode::DATA_LOSS, {"chunk 3", "checksum"});
  auto bad_sum = good;
  bad_sum[2].set_checksum(bad_sum[2].checksum() + 1);
  expect_refused(*b_, bad_sum, grpc::StatusCode::DATA_LOSS, {"checksum"});

  auto missing = good;
  missing.erase(missing.begin() + 2);
  expect_refused(*b_, missing, grpc::StatusCode::INVALID_ARGUMENT, {"missing"});
  auto reordered = good;
  std::swap(reordered[2], reordered[3]);
  expect_refused(*b_, reordered, grpc::StatusCode::INVALID_ARGUMENT, {"chunk index"});
  auto duplicated = good;
  duplicated.insert(duplicated.begin() + 2, good[2]);
  expect_refused(*b_, duplicated, grpc::StatusCode::INVALID_ARGUMENT, {"repeated"});
  // Renumbered so that only the positions tell: a gap is still refused.
  auto gap = missing;
  for (size_t i = 0; i < gap.size(); ++i) gap[i].set_index(static_cast<uint32_t>(i));
  expect_refused(*b_, gap, grpc::StatusCode::INVALID_ARGUMENT, {"layer 0 tokens from"});
  auto short_stream = good;
  short_stream.pop_back();
  expect_refused(*b_, short_stream, grpc::StatusCode::DATA_LOSS, {"ended"});
  expect_refused(*b_, {good[0]}, grpc::StatusCode::DATA_LOSS, {"ended"});
  expect_refused(*b_, std::vector<v1::SequenceChunk>(good.begin() + 1, good.end()),
                 grpc::StatusCode::INVALID_ARGUMENT, {"header"});
  expect_refused(*b_, {}, grpc::StatusCode::INVALID_ARGUMENT, {"header"});
  auto resized = good;
  resized[1].mutable_data()->pop_back();
  expect_refused(*b_, resized, grpc::StatusCode::INVALID_ARGUMENT, {"bytes"});
  // The good stream still imports after all that.
  v1::ImportSequenceResponse r;
  EXPECT_TRUE(import_chunks(*b_->stub, good, &r).ok());
}

TEST_F(TransferTest, MismatchedGeometryDtypeOrScalesNameBothValues) {
  const uint64_t id = make(*a_, {8, 8});
  const std::vector<v1::SequenceChunk> good = exported(*a_, id);
  auto heads = good;
  heads[0].mutable_header()->set_num_kv_heads(4);
  expect_refused(*b_, heads, grpc::StatusCode::FAILED_PRECONDITION, {"num_kv_heads", "expected 2", "received 4"});
  auto dim = good;
  dim[0].mutable_header()->set_head_dim(128);
  expect_refused(*b_, dim, grpc::StatusCode::FAILED_PRECONDITION, {"head_dim", "expected 64", "received 128"});
  auto layers = good;
  layers[0].mutable_header()->set_num_layers(3);
  expect_refused(*b_, layers, grpc::StatusCode::FAILED_PRECONDITION, {"num_layers", "expected 2", "received 3"});
  auto dtype = good;
  dtype[0].mutable_header()->set_cache_dtype(v1::FLOAT16);
  expect_refused(*b_, dtype, grpc::StatusCode::FAILED_PRECONDITION, {"cache_dtype", "fp32", "fp16"});
  auto scale = good;
  scale[0].mutable_header()->set_v_scales(1, 0.5f);
  expect_refused(*b_, scale, grpc::StatusCode::FAILED_PRECONDITION, {"v_scales[1]", "expected 1", "received 0.5"});

  // A real server of another dtype refuses a real export the same way.
  ServerConfig half = chunked(4);
  half.cache_dtype = "fp16";
  Node fp16(half);
  expect_refused(fp16, good, grpc::StatusCode::FAILED_PRECONDITION, {"expected fp16", "received fp32"});
}

TEST_F(TransferTest, QuotasAndLimitsCreateNothing) {
  const uint64_t id = make(*a_, {40, 40});  // 10 blocks of 4
  const std::vector<v1::SequenceChunk> chunks = exported(*a_, id);
  ServerConfig few = chunked(4);
  few.tenant_max_blocks = 6;  // the import runs out half way, after several chunks took blocks
  Node small(few);
  expect_refused(small, chunks, grpc::StatusCode::RESOURCE_EXHAUSTED, {"max_blocks"});
  ServerConfig tokens = chunked(4);
  tokens.max_sequence_tokens = 32;
  Node short_server(tokens);
  expect_refused(short_server, chunks, grpc::StatusCode::RESOURCE_EXHAUSTED, {"--max-sequence-tokens"});
  ServerConfig one = chunked(4);
  one.max_sequences = 1;
  Node single(one);
  make(single, {1, 1});
  expect_refused(single, chunks, grpc::StatusCode::RESOURCE_EXHAUSTED, {"--max-sequences"});
  ServerConfig tiny = chunked(4);
  tiny.num_blocks = 8;
  Node full(tiny);
  expect_refused(full, chunks, grpc::StatusCode::RESOURCE_EXHAUSTED, {"blocks"});
}

TEST_F(TransferTest, ExportIsAPinnedCutWhileTheSequenceChanges) {
  // 2 layers x 3000 tokens x 1 KiB: far more than the transport buffers, so
  // the export is still sending when the sequence changes under it.
  ServerConfig big = chunked(16);
  big.num_blocks = 1024;
  big.max_message_bytes = 64 << 10;
  Node source(big);
  const uint64_t id = make(source, {3000, 3000});
  const std::string want = data_of(exported(source, id));
  const std::vector<float> query = q();
  const std::string want_bits = decode_bits(source, id, query);

  grpc::ClientContext ctx;
  v1::ExportSequenceRequest request;
  request.set_sequence_id(id);
  auto reader = source.stub->ExportSequence(&ctx, request);
  std::vector<v1::SequenceChunk> chunks(1);
  ASSERT_TRUE(reader->Read(&chunks[0]));
  // Appends, a truncation and the free, then new sequences that would reuse
  // the blocks were they not pinned.
  append(source, id, 0, 9);
  grpc::ClientContext tctx;
  v1::TruncateSequenceRequest cut;
  cut.set_sequence_id(id);
  cut.set_length(1000);
  v1::TruncateSequenceResponse cut_response;
  ASSERT_TRUE(source.stub->TruncateSequence(&tctx, cut, &cut_response).ok());
  append(source, id, 1, 50);
  grpc::ClientContext fctx;
  v1::FreeSequenceRequest free_request;
  free_request.set_sequence_id(id);
  v1::FreeSequenceResponse freed;
  ASSERT_TRUE(source.stub->FreeSequence(&fctx, free_request, &freed).ok());
  std::vector<uint64_t> others;
  for (int i = 0; i < 4; ++i) others.push_back(make(source, {800, 800}));
  for (v1::SequenceChunk c; reader->Read(&c);) chunks.push_back(c);
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(data_of(chunks), want);
  Node target(big);
  v1::ImportSequenceResponse r;
  ASSERT_TRUE(import_chunks(*target.stub, chunks, &r).ok());
  EXPECT_EQ(decode_bits(target, r.sequence_id(), query), want_bits);
  // The pins went with the export: only the four new sequences hold blocks.
  EXPECT_EQ(source.config().free_blocks(), 1024 - 4 * 50);  // 800 / 16 each
  // (tests/unit/sequence_cut_test.cc checks the pins themselves, step by step.)
}

TEST_F(TransferTest, StagesAppendToAnEarlierImport) {
  const uint64_t id = make(*a_, {20, 18});
  v1::ImportSequenceResponse first;
  ASSERT_TRUE(import_chunks(*b_->stub, exported(*a_, id), &first).ok());
  // The source grows meanwhile; the next stage sends only the tail.
  append(*a_, id, 0, 5);
  append(*a_, id, 1, 7);
  std::vector<v1::SequenceChunk> tail = exported(*a_, id, {20, 18});
  EXPECT_EQ(data_of(tail).size(), size_t{12} * 2 * 2 * 64 * 4);
  tail[0].mutable_header()->set_into_sequence_id(first.sequence_id());
  v1::ImportSequenceResponse second;
  ASSERT_TRUE(import_chunks(*b_->stub, tail, &second).ok());
  EXPECT_EQ(second.sequence_id(), first.sequence_id());
  EXPECT_EQ(second.layer_lengths(0), 25);
  EXPECT_EQ(second.layer_lengths(1), 25);
  const std::vector<float> query = q();
  EXPECT_EQ(decode_bits(*b_, first.sequence_id(), query), decode_bits(*a_, id, query));
  EXPECT_EQ(data_of(exported(*b_, first.sequence_id())), data_of(exported(*a_, id)));

  // The same stage again: the target no longer holds from_lengths.
  expect_refused(*b_, tail, grpc::StatusCode::FAILED_PRECONDITION, {"expected sequence", "hold 20", "holding 25"});
  v1::GetSequenceResponse info;
  ASSERT_TRUE(b_->session.get(first.sequence_id(), info).ok());
  EXPECT_EQ(info.layer_lengths(0), 25);
  // A stage with no target, an unknown target, a from_lengths past the end.
  auto no_target = tail;
  no_target[0].mutable_header()->set_into_sequence_id(0);
  expect_refused(*b_, no_target, grpc::StatusCode::INVALID_ARGUMENT, {"into_sequence_id"});
  auto unknown = tail;
  unknown[0].mutable_header()->set_into_sequence_id(first.sequence_id() ^ 0x5a5a);
  expect_refused(*b_, unknown, grpc::StatusCode::NOT_FOUND);
  grpc::Status status;
  export_chunks(*a_->stub, id, {26, 0}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  export_chunks(*a_->stub, id, {1}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  export_chunks(*a_->stub, id ^ 1, {}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
}

TEST(TransferTenants, EachTenantSeesOnlyItsOwn) {
  const fs::path tokens = fs::temp_directory_path() / ("pagoda-transfer-tokens-" + std::to_string(::getpid()));
  std::ofstream(tokens) << "alice token-a\nbob token-b\n";
  ServerConfig c = chunked(4);
  c.auth_tokens = tokens.string();
  Node node(c);
  // Alice's sequence, appended over an authenticated stub call.
  grpc::ClientContext cctx;
  cctx.AddMetadata("authorization", "Bearer token-a");
  v1::CreateSequenceRequest create;
  v1::CreateSequenceResponse created;
  ASSERT_TRUE(node.stub->CreateSequence(&cctx, create, &created).ok());
  const uint64_t id = created.sequence_id();

  grpc::Status status;
  const auto chunks = export_chunks(*node.stub, id, {}, &status, "token-a");
  ASSERT_TRUE(status.ok()) << status.error_message();
  export_chunks(*node.stub, id, {}, &status, "token-b");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  export_chunks(*node.stub, id, {}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  v1::ImportSequenceResponse bobs;
  ASSERT_TRUE(import_chunks(*node.stub, chunks, &bobs, "token-b").ok());
  export_chunks(*node.stub, bobs.sequence_id(), {}, &status, "token-a");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  export_chunks(*node.stub, bobs.sequence_id(), {}, &status, "token-b");
  EXPECT_TRUE(status.ok());
  // Bob cannot append a stage to Alice's sequence.
  auto stage = chunks;
  stage[0].mutable_header()->set_into_sequence_id(id);
  v1::ImportSequenceResponse r;
  EXPECT_EQ(import_chunks(*node.stub, stage, &r, "token-b").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(import_chunks(*node.stub, stage, &r, "token-a").ok());
  fs::remove(tokens);
}

}  // namespace
}  // namespace pagoda::e2e
