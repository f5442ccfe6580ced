#pragma once
// Sequences of seeded random K/V written identically into one or more backends
// (the CUDA backend, and the CPU backend when the two are compared), mirrored in
// double exactly as stored (rounded to the cache dtype) for the reference.
//
// Every block starts as NaN. Blocks are handed out in a shuffled order and every
// table holds one block more than its length needs, so free blocks, the unused
// tail of last blocks and unused table entries stay NaN: any read past a length
// poisons the output.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backend.h"
#include "reference/naive_attention.h"

// Skips the current test where no CUDA device answers (build machines: the
// runtime finds only a stub driver and returns cudaErrorInsufficientDriver).
#define PAGODA_SKIP_WITHOUT_CUDA_DEVICE()                                                  \
  do {                                                                                     \
    if (!::pagoda::cuda_device_available())                                                \
      GTEST_SKIP() << "no usable CUDA device (cudaGetDeviceCount found none or no driver)"; \
  } while (0)

namespace pagoda::testing {

// Queries [batch, num_q_heads, head_dim]: values as stored in `dtype`.
struct Queries {
  DType dtype = DType::kFloat32;
  std::vector<double> values;
  std::vector<uint8_t> bytes;
};

// Rows `rows` of `q`, in that order.
Queries select_rows(const Queries& q, const std::vector<int32_t>& rows, int32_t row_elems);

// x rounded to `dtype` (nearest even) and back.
float round_to(DType dtype, float x);

struct Decoded {
  std::vector<uint8_t> out_bytes;  // [batch, q_heads, head_dim] in q's dtype
  std::vector<float> out;          // the same, widened
  std::vector<float> lse;          // [batch, q_heads]
  std::vector<int32_t> splits;     // [batch]
  int32_t chunk_tokens = 0;
};

class KvFixture {
 public:
  // One backend per entry of `kinds` ("cuda", "cpu"); ok() says whether all came up.
  KvFixture(const CacheGeometry& g, const std::vector<std::string>& kinds, uint64_t seed);

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  Backend& backend(size_t i) { return *backends_[i]; }
  BackendStream& stream(size_t i) { return *streams_[i]; }
  const CacheGeometry& geometry() const { return geometry_; }

  Queries random_queries(int32_t batch, DType dtype);

  // A new sequence of `length` random tokens in `layer`. With `spike` set, the
  // last token's key for each KV head is half of query row `spike_row`'s first
  // head of that group: the row max sits in the last block, where a missing
  // rescale shows. Returns the sequence's index.
  int32_t add_sequence(int32_t layer, int32_t length, const Queries* spike = nullptr,
                       int32_t spike_row = 0);

  // Tables of the given sequences, in that order.
  struct Tables {
    std::vector<int32_t> indptr;
    std::vector<int32_t> ids;
    std::vector<int32_t> lengths;
    BatchBlockTables view() const;
  };
  Tables tables(const std::vector<int32_t>& seqs) const;

  Decoded decode(size_t backend, int32_t layer, const std::vector<int32_t>& seqs,
                 const Queries& q, float scale, SplitMode mode, int32_t split_tokens);
  ReferenceResult reference(int32_t layer, const std::vector<int32_t>& seqs, const Queries& q,
                            double scale) const;

  // Value row of token `token` of sequence `seq`, as stored: [head_dim].
  std::vector<double> value_row(int32_t layer, int32_t seq, int32_t token, int32_t kv_head) const;

  std::mt19937_64& rng() { return rng_; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int32_t length = 0;
  };
  void write(int32_t layer, const std::vector<int64_t>& slots, const std::vector<float>& k,
             const std::vector<float>& v);

  CacheGeometry geometry_;
  Status status_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<BackendStream>> streams_;  // one per backend
  std::vector<int32_t> free_blocks_;  // shuffled; handed out from the back
  std::vector<Sequence> sequences_;
  std::vector<double> k_mirror_;
  std::vector<double> v_mirror_;
  std::mt19937_64 rng_;
};

}  // namespace pagoda::testing
