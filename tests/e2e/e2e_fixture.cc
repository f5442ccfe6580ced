#include "e2e_fixture.h"

#include <cmath>
#include <cstring>

#include "observability/logging.h"
#include "pagoda/host_convert.h"

namespace pagoda::e2e {

ServerConfig small_config() {
  ServerConfig c;
  c.listen = "127.0.0.1:0";
  // No /metrics endpoint (stopping one takes about 2 s); the metrics are still recorded.
  c.metrics_address = "";
  // No re-checks: their leases pin blocks for a moment, and tests compare free-block
  // counts exactly (the observability tests run the checker at rate 1).
  c.determinism_sample_rate = 0;
  c.layers = 2;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.block_size = 4;
  c.num_blocks = 512;
  c.max_request_blocks = INT32_MAX;  // tests fill small caches in one request on purpose
  c.cache_dtype = "fp32";
  c.split_tokens = 16;
  c.max_batch_wait_us = 0;
  c.threads = 2;
  c.backend = "cpu";
  c.drain_timeout = 5;
  c.log_level = "error";
  return c;
}

std::unique_ptr<PagodaServer> start_server(const ServerConfig& config) {
  EXPECT_TRUE(configure_logging(config.log_level, config.log_format).ok());
  StatusOr<EffectiveConfig> effective = resolve_config(config);
  EXPECT_TRUE(effective.ok()) << effective.status().message();
  if (!effective.ok()) return nullptr;
  StatusOr<std::unique_ptr<PagodaServer>> server = PagodaServer::start(*effective);
  EXPECT_TRUE(server.ok()) << server.status().message();
  if (!server.ok()) return nullptr;
  return std::move(*server);
}

std::unique_ptr<v1::DecodeAttention::Stub> make_stub(const PagodaServer& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A channel of its own per stub: concurrent clients do not share one connection.
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server.port()),
                                           grpc::InsecureChannelCredentials(), args);
  return v1::DecodeAttention::NewStub(channel);
}

v1::Tensor typed_tensor(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype) {
  v1::Tensor t;
  t.set_dtype(static_cast<v1::DType>(static_cast<int>(dtype)));
  for (int64_t d : shape) t.add_shape(d);
  std::string& data = *t.mutable_data();
  data.resize(values.size() * dtype_size(dtype));
  convert_from_float(values.data(), data.data(), dtype, static_cast<int64_t>(values.size()));
  return t;
}

v1::Tensor f32_tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  return typed_tensor(values, std::move(shape), DType::kFloat32);
}

std::vector<float> tensor_values(const v1::Tensor& t) {
  const auto dtype = static_cast<DType>(static_cast<int>(t.dtype()));
  std::vector<float> out(t.data().size() / dtype_size(dtype));
  convert_to_float(t.data().data(), dtype, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

std::vector<float> random_values(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void Mirror::append(uint64_t id, int32_t layer, const std::vector<float>& k, const std::vector<float>& v) {
  LayerHistory& h = seqs_.at(id).at(static_cast<size_t>(layer));
  h.k.insert(h.k.end(), k.begin(), k.end());
  h.v.insert(h.v.end(), v.begin(), v.end());
}

int32_t Mirror::length(uint64_t id, int32_t layer) const {
  const size_t row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
  return static_cast<int32_t>(seqs_.at(id).at(static_cast<size_t>(layer)).k.size() / row);
}

void Mirror::truncate(uint64_t id, int32_t length) {
  const size_t row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
  for (LayerHistory& h : seqs_.at(id)) {
    if (h.k.size() > static_cast<size_t>(length) * row) {
      h.k.resize(static_cast<size_t>(length) * row);
      if (!h.v.empty()) h.v.resize(static_cast<size_t>(length) * row);  // empty: V is K's prefix
    }
  }
}

testing::ReferenceResult Mirror::reference(int32_t layer, const std::vector<uint64_t>& ids,
                                           const std::vector<float>& q, double scale,
                                           const testing::ReferenceVariant& variant) const {
  // A private pool of one layer where each sequence gets fresh contiguous blocks.
  CacheGeometry g = g_;
  g.num_layers = 1;
  std::vector<int32_t> indptr{0}, block_ids, lengths;
  int32_t blocks = 0;
  for (uint64_t id : ids) {
    const int32_t len = length(id, layer);
    const int32_t n = (len + g.block_size - 1) / g.block_size;
    for (int32_t b = 0; b < n; ++b) block_ids.push_back(blocks + b);
    blocks += n;
    indptr.push_back(blocks);
    lengths.push_back(len);
  }
  g.num_blocks = std::max(blocks, 1);
  std::vector<double> k_pool(static_cast<size_t>(g.pool_elements()), 0.0);
  std::vector<double> v_pool(k_pool.size(), 0.0);
  for (size_t s = 0; s < ids.size(); ++s) {
    const LayerHistory& h = seqs_.at(ids[s]).at(static_cast<size_t>(layer));
    for (int32_t t = 0; t < lengths[s]; ++t) {
      const int32_t block = block_ids[static_cast<size_t>(indptr[s] + t / g.block_size)];
      for (int32_t kvh = 0; kvh < g.num_kv_heads; ++kvh) {
        const int64_t dst = g.element_offset(0, block, kvh, t % g.block_size);
        const size_t src = (static_cast<size_t>(t) * g.num_kv_heads + kvh) * g.head_dim;
        for (int32_t i = 0; i < g.head_dim; ++i) {
          k_pool[static_cast<size_t>(dst + i)] = h.k[src + i];
          if (!g.latent()) v_pool[static_cast<size_t>(dst + i)] = h.v[src + i];
        }
      }
    }
  }
  BatchBlockTables tables;
  tables.batch = static_cast<int32_t>(ids.size());
  tables.block_indptr = indptr.data();
  tables.block_ids = block_ids.data();
  tables.lengths = lengths.data();
  const std::vector<double> qd(q.begin(), q.end());
  return testing::naive_decode(g, k_pool, v_pool, 0, tables, qd, scale, variant);
}

grpc::Status Session::create(uint64_t& id, const std::string& label) {
  grpc::ClientContext ctx;
  v1::CreateSequenceRequest req;
  req.set_label(label);
  v1::CreateSequenceResponse resp;
  grpc::Status s = stub->CreateSequence(&ctx, req, &resp);
  id = resp.sequence_id();
  return s;
}

grpc::Status Session::append(uint64_t id, int32_t layer, const std::vector<float>& k, const std::vector<float>& v,
                             int32_t* layer_length) {
  const int64_t row = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
  grpc::ClientContext ctx;
  v1::AppendKVRequest req;
  req.set_sequence_id(id);
  req.set_layer(layer);
  *req.mutable_k() = f32_tensor(k, {static_cast<int64_t>(k.size()) / row, g.num_kv_heads, g.head_dim});
  if (!v.empty()) *req.mutable_v() = f32_tensor(v, {static_cast<int64_t>(v.size()) / row, g.num_kv_heads, g.head_dim});
  v1::AppendKVResponse resp;
  grpc::Status s = stub->AppendKV(&ctx, req, &resp);
  if (layer_length) *layer_length = resp.layer_length();
  return s;
}

v1::DecodeRequest Session::decode_request(int32_t layer, const std::vector<uint64_t>& ids,
                                          const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, bool return_lse, float scale) const {
  const auto q_rows = static_cast<int64_t>(q.size()) / (g.num_q_heads * g.head_dim);
  const auto kv_rows = static_cast<int64_t>(k.size()) / (g.num_kv_heads * g.head_dim);
  v1::DecodeRequest req;
  req.set_layer(layer);
  for (uint64_t id : ids) req.add_sequence_ids(id);
  *req.mutable_q() = f32_tensor(q, {q_rows, g.num_q_heads, g.head_dim});
  if (!k.empty()) *req.mutable_k() = f32_tensor(k, {kv_rows, g.num_kv_heads, g.head_dim});
  if (!v.empty()) *req.mutable_v() = f32_tensor(v, {kv_rows, g.num_kv_heads, g.head_dim});
  req.set_return_lse(return_lse);
  req.set_scale(scale);
  return req;
}

grpc::Status Session::decode(int32_t layer, const std::vector<uint64_t>& ids, const std::vector<float>& q,
                             v1::DecodeResponse& response, const std::vector<float>& k, const std::vector<float>& v,
                             bool return_lse, float scale) {
  grpc::ClientContext ctx;
  return stub->Decode(&ctx, decode_request(layer, ids, q, k, v, return_lse, scale), &response);
}

grpc::Status Session::get(uint64_t id, v1::GetSequenceResponse& response) {
  grpc::ClientContext ctx;
  v1::GetSequenceRequest req;
  req.set_sequence_id(id);
  return stub->GetSequence(&ctx, req, &response);
}

grpc::Status Session::config(v1::GetConfigResponse& response) {
  grpc::ClientContext ctx;
  return stub->GetConfig(&ctx, v1::GetConfigRequest(), &response);
}

void expect_close(const std::vector<double>& want, const std::vector<float>& got, double max_abs,
                  const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(static_cast<double>(got[i]), want[i]) << what << " at " << i;
      continue;
    }
    ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    ASSERT_NEAR(got[i], want[i], max_abs) << what << " at " << i;
  }
}

void ServerTest::SetUp() {
  server_ = start_server(config());
  ASSERT_NE(server_, nullptr);
  stub_ = make_stub(*server_);
  g_ = server_->config().geometry;
  session_.stub = stub_.get();
  session_.g = g_;
  mirror_ = std::make_unique<Mirror>(g_);
}

void ServerTest::TearDown() {
  stub_.reset();
  if (server_) server_->shutdown(1.0);
  server_.reset();
}

uint64_t ServerTest::make_sequence(int32_t len, const std::string& label) {
  uint64_t id = 0;
  EXPECT_TRUE(session_.create(id, label).ok());
  mirror_->create(id);
  for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
    if (len == 0) continue;
    const auto k = random_kv(static_cast<size_t>(len));
    const auto v = random_kv(static_cast<size_t>(len));
    int32_t length = 0;
    const grpc::Status s = session_.append(id, layer, k, v, &length);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(length, len);
    mirror_->append(id, layer, k, v);
  }
  return id;
}

v1::DecodeResponse ServerTest::decode_checked(int32_t layer, const std::vector<uint64_t>& ids,
                                              const std::vector<float>& k, const std::vector<float>& v) {
  const auto q = random_q(ids.size());
  v1::DecodeResponse resp;
  const grpc::Status s = session_.decode(layer, ids, q, resp, k, v);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!k.empty()) {
    const size_t row = static_cast<size_t>(g_.num_kv_heads) * g_.head_dim;
    for (size_t b = 0; b < ids.size(); ++b) {
      mirror_->append(ids[b], layer, std::vector<float>(k.begin() + b * row, k.begin() + (b + 1) * row),
                      std::vector<float>(v.begin() + b * row, v.begin() + (b + 1) * row));
    }
  }
  // The server's arithmetic, from the device name it reports: on a CPU matrix
  // unit (AMX or AVX512-BF16, a bf16 cache) q reaches the multiplies rounded
  // to bf16, and the output has the bound of decode_table.h beyond the fp32
  // tolerance.
  v1::GetConfigResponse config;
  EXPECT_TRUE(session_.config(config).ok());
  const std::string& device = config.device_name();
  const bool tiles =
      device.find("+AMX-BF16") != std::string::npos || device.find("+AVX512-BF16") != std::string::npos;
  std::vector<float> q_multiplied = q;
  if (tiles) {
    for (float& x : q_multiplied) x = bf16_to_float(float_to_bf16(x));
  }
  const testing::ReferenceResult want = mirror_->reference(layer, ids, q_multiplied, default_scale(g_));
  if (tiles) {
    testing::expect_within_tile_bounds(tensor_values(resp.output()), tensor_values(resp.lse()), want, kOutTolerance,
                                       [](size_t) { return kLseTolerance; });
  } else {
    expect_close(want.out, tensor_values(resp.output()), kOutTolerance, "output");
    expect_close(want.lse, tensor_values(resp.lse()), kLseTolerance, "lse");
  }
  EXPECT_EQ(resp.lengths_size(), static_cast<int>(ids.size()));
  for (size_t b = 0; b < ids.size() && b < static_cast<size_t>(resp.lengths_size()); ++b) {
    EXPECT_EQ(resp.lengths(static_cast<int>(b)), mirror_->length(ids[b], layer));
  }
  return resp;
}

}  // namespace pagoda::e2e
