#pragma once
// End-to-end test support: a pagoda server started in-process on 127.0.0.1:0,
// generated stubs over a real loopback channel, and a mirror of what each
// sequence holds so that every output can be checked against the naive
// double-precision reference.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagoda/v1/decode_attention.grpc.pb.h"
#include "reference/decode_table.h"
#include "reference/naive_attention.h"
#include "app/server.h"

namespace pagoda::e2e {

// A small CPU server: fp32 cache (stored values are exact), blocks of 4 tokens
// and splits of 16 so that short sequences still span several blocks and chunks.
ServerConfig small_config();

// Starts a server; the test fails (fatally) if it cannot.
std::unique_ptr<PagodaServer> start_server(const ServerConfig& config);

std::unique_ptr<v1::DecodeAttention::Stub> make_stub(const PagodaServer& server);

// Tensors on the wire.
v1::Tensor f32_tensor(const std::vector<float>& values, std::vector<int64_t> shape);
v1::Tensor typed_tensor(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype);
std::vector<float> tensor_values(const v1::Tensor& t);  // any dtype, widened to fp32
std::vector<float> random_values(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f);

// K/V rows one layer of one sequence holds, in append order.
struct LayerHistory {
  std::vector<float> k;  // [tokens, num_kv_heads, head_dim]
  std::vector<float> v;  // [tokens, num_kv_heads, head_dim]
};

// What the server should hold: sequence id -> per-layer rows.
class Mirror {
 public:
  explicit Mirror(const CacheGeometry& g) : g_(g) {}
  void create(uint64_t id) { seqs_[id].assign(static_cast<size_t>(g_.num_layers), {}); }
  void fork(uint64_t source, uint64_t id) { seqs_[id] = seqs_.at(source); }
  void free(uint64_t id) { seqs_.erase(id); }
  // Every layer longer than `length` is cut to it.
  void truncate(uint64_t id, int32_t length);
  void append(uint64_t id, int32_t layer, const std::vector<float>& k, const std::vector<float>& v);
  int32_t length(uint64_t id, int32_t layer) const;
  const LayerHistory& history(uint64_t id, int32_t layer) const { return seqs_.at(id).at(static_cast<size_t>(layer)); }

  // The reference decode of `layer` for `ids` with q [rows, num_q_heads, head_dim].
  testing::ReferenceResult reference(int32_t layer, const std::vector<uint64_t>& ids, const std::vector<float>& q,
                                     double scale, const testing::ReferenceVariant& variant = {}) const;

 private:
  CacheGeometry g_;
  std::map<uint64_t, std::vector<LayerHistory>> seqs_;
};

// Typed calls with the status checked by the caller.
struct Session {
  v1::DecodeAttention::Stub* stub = nullptr;
  CacheGeometry g;

  grpc::Status create(uint64_t& id, const std::string& label = "");
  grpc::Status append(uint64_t id, int32_t layer, const std::vector<float>& k, const std::vector<float>& v,
                      int32_t* layer_length = nullptr);
  // q [rows, num_q_heads, head_dim]; k/v [rows, num_kv_heads, head_dim] or
  // empty (rows: one per sequence unless the request's q_lengths say more).
  grpc::Status decode(int32_t layer, const std::vector<uint64_t>& ids, const std::vector<float>& q,
                      v1::DecodeResponse& response, const std::vector<float>& k = {},
                      const std::vector<float>& v = {}, bool return_lse = true, float scale = 0.f);
  v1::DecodeRequest decode_request(int32_t layer, const std::vector<uint64_t>& ids, const std::vector<float>& q,
                                   const std::vector<float>& k = {}, const std::vector<float>& v = {},
                                   bool return_lse = true, float scale = 0.f) const;
  grpc::Status get(uint64_t id, v1::GetSequenceResponse& response);
  grpc::Status config(v1::GetConfigResponse& response);
};

// Expects `got` (fp32 output or LSE) to match the reference within fp32
// accumulation error, with no NaN.
void expect_close(const std::vector<double>& want, const std::vector<float>& got, double max_abs,
                  const std::string& what);

// A server per test with a stub, a session and a mirror of the cache.
class ServerTest : public ::testing::Test {
 protected:
  virtual ServerConfig config() const { return small_config(); }
  void SetUp() override;
  void TearDown() override;

  // Creates a sequence, appends `len` random tokens to every layer (one
  // AppendKV per layer), mirrors it and returns its id.
  uint64_t make_sequence(int32_t len, const std::string& label = "");
  std::vector<float> random_q(size_t batch) { return random_values(rng_, batch * g_.num_q_heads * g_.head_dim); }
  std::vector<float> random_kv(size_t tokens) { return random_values(rng_, tokens * g_.num_kv_heads * g_.head_dim); }
  // Decodes `ids` on `layer` and checks output and LSE against the mirror.
  v1::DecodeResponse decode_checked(int32_t layer, const std::vector<uint64_t>& ids,
                                    const std::vector<float>& k = {}, const std::vector<float>& v = {});

  std::unique_ptr<PagodaServer> server_;
  std::unique_ptr<v1::DecodeAttention::Stub> stub_;
  CacheGeometry g_;
  Session session_;
  std::unique_ptr<Mirror> mirror_;
  std::mt19937 rng_{1234};
};

// Tolerances against the double reference: fp32 accumulation over head_dim and
// a few hundred keys stays far below these.
inline constexpr double kOutTolerance = 2e-5;
inline constexpr double kLseTolerance = 2e-5;

// The default softmax scale.
inline double default_scale(const CacheGeometry& g) { return 1.0 / std::sqrt(static_cast<double>(g.head_dim)); }

}  // namespace pagoda::e2e
