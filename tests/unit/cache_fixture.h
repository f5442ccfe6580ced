#pragma once
// The one fixture of the kernel tests: a backend (the CPU one unless told) and
// a cache manager filled with seeded random K/V, mirrored in double exactly as
// stored (rounded to the cache dtype) for the reference. More backends may be
// given every write too (the CUDA tests compare the CPU backend with the GPU's
// on one cache).
// The whole pool starts as NaN: free blocks and the unused tail of every last
// block stay NaN, so any read past a sequence's length poisons the output.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "pagoda/backend.h"
#include "reference/decode_table.h"
#include "reference/naive_attention.h"

namespace pagoda::testing {

// The attention variant of a decode (docs/design.md §9); defaults: one row per
// sequence, plain causal attention.
struct DecodeVariant {
  std::vector<int32_t> q_lengths;  // [batch] rows per sequence; empty: one each
  int32_t window = 0;
  float soft_cap = 0.f;
  std::vector<float> sinks;        // [num_q_heads] natural-log sinks; empty: none
};

struct FixtureOptions {
  // Not an aggregate, so that {geometry, threads, seed} leaves the rest at
  // their defaults without a missing-initializer warning.
  FixtureOptions(CacheGeometry g = {}, int32_t t = 1, uint64_t s = 1) : geometry(g), threads(t), seed(s) {}
  CacheGeometry geometry;
  int32_t threads = 1;  // CPU backend workers
  uint64_t seed = 1;
  std::string backend = "cpu";  // a make_backend kind
  std::vector<KvScale> kv_scales;  // [num_layers] or empty (1.0); the mirror holds stored * scale
  std::vector<std::string> also;   // more backends (make_backend kinds) given every write, same blocks
};

class CacheFixture {
 public:
  explicit CacheFixture(const FixtureOptions& options);

  Backend& backend() { return *backend_; }
  BackendStream& stream() { return *stream_; }
  // Backend i: 0 is backend(), 1.. are options.also in order.
  size_t backends() const { return 1 + also_backends_.size(); }
  Backend& backend(size_t i) { return i == 0 ? *backend_ : *also_backends_[i - 1]; }
  BackendStream& stream(size_t i) { return i == 0 ? *stream_ : *also_streams_[i - 1]; }
  CacheManager& cache() { return *cache_; }

  // A reservation pinning `ids` of `layer` at their current lengths (no append).
  Reservation pin(int32_t layer, const std::vector<SequenceId>& ids);
  const CacheGeometry& geometry() const { return geometry_; }

  // A new sequence whose layer `layer` holds `length` random tokens.
  SequenceId add_sequence(int32_t layer, int32_t length);
  // Appends `n` random tokens to `layer` of `id` through the cache manager.
  void append_random(SequenceId id, int32_t layer, int32_t n);
  // Appends given fp32 rows ([n, kv_heads, head_dim]) and mirrors them.
  void append_rows(SequenceId id, int32_t layer, int32_t n, const std::vector<float>& k,
                   const std::vector<float>& v);

  // Brings the mirror along the copy-on-write copies the cache made in the
  // table of `id` since it was `before` (block ids that changed were copied).
  void follow_copies(SequenceId id, const std::vector<int32_t>& before);

  // Records rows appended by other means (another thread's stream) in the
  // mirror: tokens [first, first + n) of `layer` of `id`.
  void mirror(SequenceId id, int32_t layer, int32_t first, int32_t n, const std::vector<float>& k,
              const std::vector<float>& v);

  // Random queries [batch, q_heads, head_dim], rounded to `dtype` (returned as
  // fp32 values and as raw bytes of that dtype).
  struct Queries {
    std::vector<float> values;
    std::vector<uint8_t> bytes;
    DType dtype;
  };
  Queries random_queries(int32_t batch, DType dtype);

  // New sequences of these lengths in `layer`, appended a block at a time in
  // turn, so that each one's blocks lie apart, between the others'. With
  // `spike`, sequence b's last token is append_spike(.., *spike, b).
  std::vector<SequenceId> add_sequences(int32_t layer, const std::vector<int32_t>& lengths,
                                        const Queries* spike = nullptr);

  // Appends one token whose key, for every KV head, is 4x the query of the
  // group's first head (row `row` of q): that head's row max then sits in the
  // last block, where a missing rescale of acc shows.
  void append_spike(SequenceId id, int32_t layer, const Queries& q, int32_t row);

  using Variant = DecodeVariant;

  // Decodes through the backend; output returned as fp32 values.
  struct Decoded {
    std::vector<float> out;
    std::vector<float> lse;
    std::vector<uint8_t> out_bytes;
    std::vector<int32_t> splits;
    int32_t chunk_tokens = 0;
    int64_t kv_bytes_read = 0;    // as the launch reported them
    int64_t kv_bytes_shared = 0;
  };
  Decoded decode(int32_t layer, const std::vector<SequenceId>& ids, const Queries& q, float scale,
                 SplitMode mode = SplitMode::kDeterministic, int32_t split_tokens = 64,
                 const Variant& variant = {}) {
    return decode_on(0, layer, ids, q, scale, mode, split_tokens, variant);
  }
  // The same on backend(i).
  Decoded decode_on(size_t backend, int32_t layer, const std::vector<SequenceId>& ids, const Queries& q,
                    float scale, SplitMode mode = SplitMode::kDeterministic, int32_t split_tokens = 64,
                    const Variant& variant = {});

  // The oracle over the mirrored cache.
  ReferenceResult reference(int32_t layer, const std::vector<SequenceId>& ids, const Queries& q, double scale,
                            const Variant& variant = {});

  // The value row of token `token` of `id` in `layer`, as stored: [head_dim].
  std::vector<double> value_row(int32_t layer, SequenceId id, int32_t token, int32_t kv_head);

  std::mt19937_64& rng() { return rng_; }

 private:
  CacheGeometry geometry_;
  std::vector<KvScale> kv_scales_;  // [num_layers]
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BackendStream> stream_;
  std::vector<std::unique_ptr<Backend>> also_backends_;
  std::vector<std::unique_ptr<BackendStream>> also_streams_;
  std::unique_ptr<CacheManager> cache_;
  std::vector<double> k_mirror_;
  std::vector<double> v_mirror_;
  std::mt19937_64 rng_;
};

// A small fp32 cache for the bookkeeping tests (forks, cuts, limits): two
// layers, one KV head of two query heads, head_dim 64, blocks of 4 tokens.
CacheGeometry bookkeeping_geometry(int32_t blocks);

// Rounds an fp32 value to `dtype` and back.
float round_to(float x, DType dtype);

// The arithmetic `backend` ("cpu" or "cuda") decodes geometry g with: bf16
// tiles where the CPU's AMX path serves it, fp32 otherwise.
Arithmetic arithmetic_of(const std::string& backend, const CacheGeometry& g);

// q as that arithmetic multiplies it, for the reference: rounded to bf16 for
// the tiles (the bytes sent stay q's own).
CacheFixture::Queries as_multiplied(const CacheFixture::Queries& q, Arithmetic arithmetic);

// Rows `rows` of `q` ([rows, row_elems] each), in that order.
CacheFixture::Queries select_rows(const CacheFixture::Queries& q, const std::vector<int32_t>& rows,
                                  int32_t row_elems);

}  // namespace pagoda::testing
