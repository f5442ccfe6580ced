#pragma once
// The attention backend: owns the K/V pools and runs the append and split-KV
// decode computations. The cache manager (block tables, shares and pins) and the
// engine (batching) live in server/ and drive a backend through this interface.
//
// Work goes through a BackendStream: an ordered channel with its own scratch (on
// CUDA a cudaStream_t with its staging and workspace buffers; on the CPU the
// per-launch scratch). Each engine worker and the determinism checker own one,
// so calls on different streams run concurrently and no lock is held across a
// launch. Callers hand validated inputs (the rpc layer checks every request);
// the backends keep debug assertions only.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"
#include "pagoda/split_plan.h"
#include "pagoda/status.h"

namespace pagoda {

// New tokens to scatter into their reserved slots of one layer.
struct KvWrite {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const int64_t* slots = nullptr;  // [num_tokens] flat slots (block * block_size + offset)
  const void* k = nullptr;         // [num_tokens, num_kv_heads, head_dim]
  const void* v = nullptr;         // [num_tokens, num_kv_heads, head_dim]; unread (null) when V is K's prefix
  DType dtype = DType::kFloat32;   // element type of k and v (converted to the cache dtype)
  // fp8 cache: elements clamped to the format's largest finite value are
  // added here when set (pagoda/fp8.h).
  int64_t* saturated = nullptr;
};

// One decode launch: every sequence of the batch attends over its first
// tables.lengths[b] tokens of `layer`, with one or more query positions.
//
// Positions (docs/design.md §9): sequence b has n_b = q_indptr[b+1] - q_indptr[b]
// query rows (1 each when q_indptr is null), the last n_b of its L_b tokens:
// row i sits at position p = L_b - n_b + i and attends keys [0, p], within
// (p - W, p] when a sliding window W is set. Rows are counted over the whole
// batch ("rows" below: the sum of n_b).
struct DecodeLaunch {
  int32_t layer = 0;
  BatchBlockTables tables;
  const int32_t* q_indptr = nullptr;  // [batch + 1] rows of each sequence; null: one each
  const void* q = nullptr;   // [rows, num_q_heads, head_dim]
  DType q_dtype = DType::kFloat32;
  float scale = 0.f;         // softmax scale in natural units (> 0)
  int32_t sliding_window = 0;  // 0: none; W > 0: keys (p - W, p]
  float soft_cap = 0.f;        // 0: none; c > 0: score = c * tanh(q.k * scale / c)
  const float* sinks = nullptr;  // [num_q_heads] natural-log sink logits, or null
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
  // Sequences whose blocks are equal over a whole chunk read it once, for all
  // their rows (pagoda/decode_plan.h); the bits are the same either way.
  bool share_chunks = true;

  int32_t rows_of(int32_t b) const { return q_indptr ? q_indptr[b + 1] - q_indptr[b] : 1; }
  int32_t first_row(int32_t b) const { return q_indptr ? q_indptr[b] : b; }
  int32_t total_rows() const { return q_indptr ? q_indptr[tables.batch] : tables.batch; }
};

struct DecodeOutputs {
  void* out = nullptr;       // [rows, num_q_heads, v_head_dim], dtype of q
  float* lse = nullptr;      // [rows, num_q_heads] natural log, -inf for no keys; may be null
  int32_t* splits = nullptr; // [batch] chunks launched per sequence; may be null
  int32_t chunk_tokens = 0;  // chunk length the launch used
  int64_t kv_bytes_read = 0;    // K/V bytes the launch read (a shared chunk once, skipped chunks not at all)
  int64_t kv_bytes_shared = 0;  // K/V bytes sharing saved: the members' own reads less the shared ones
  double attention_seconds = 0;  // partial + merge computation alone
  double merge_seconds = 0;      // the merge alone (part of attention_seconds)
  double transfer_seconds = 0;   // host<->device copies (0 on the CPU)
};

// An ordered channel of work on one backend. Not thread-safe: one caller at a
// time. Every call returns when its effects are complete and visible to every
// other stream of the backend.
class BackendStream {
 public:
  virtual ~BackendStream() = default;

  // Writes each KvWrite's rows into its slots (dtype converted). The slots of
  // concurrent calls on different streams must not overlap.
  virtual Status write_kv(std::span<const KvWrite> writes) = 0;
  // The rows of `slots` in `layer` exactly as stored (cache dtype bytes: no
  // scale, no conversion) into k and v, each [slots, num_kv_heads, head_dim]
  // (an export: the bits leave as they are). Latent attention (V is K's
  // prefix, geometry().latent()) has K rows only: v is neither read nor written.
  virtual Status read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) = 0;
  // The reverse of read_kv: stored bytes into the slots, copied unchanged (an
  // import keeps the exporter's bits). The slots must not overlap another
  // stream's concurrent writes.
  virtual Status write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void* v) = 0;
  // Copies block `src` into block `dst` in every layer (copy-on-write).
  virtual Status copy_block(int32_t src, int32_t dst) = 0;
  // Fills every element of the given blocks with NaN (tests: any read past a
  // length then poisons the output).
  virtual Status poison_blocks(std::span<const int32_t> blocks) = 0;
  virtual Status decode(const DecodeLaunch& launch, DecodeOutputs& outputs) = 0;

  // The memory-bandwidth baseline a kernel's achieved bandwidth is divided by,
  // measured now on a buffer of `bytes` bytes, in bytes per second. CPU: a
  // streaming read. CUDA: a device-to-device copy, bytes counted read + write.
  virtual StatusOr<double> measure_memory_bandwidth(int64_t bytes) = 0;
};

// A layer's K and V scales (docs/design.md §9): the cache stores x / scale and reads
// stored * scale. Folded once per launch (K into the softmax scale, V into the
// output), never per element.
struct KvScale {
  float k = 1.f;
  float v = 1.f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;         // "cpu" or "cuda"
  virtual std::string device_name() const = 0;  // e.g. the CPU model or GPU name
  virtual const CacheGeometry& geometry() const = 0;
  // Workers the fast split plan balances over (threads, or resident CTAs).
  virtual int32_t num_workers() const = 0;
  virtual KvScale kv_scale(int32_t layer) const = 0;

  // A new stream with its own scratch (thread-safe). CUDA: fails with
  // RESOURCE_EXHAUSTED when the device has no room for its workspaces.
  virtual StatusOr<std::unique_ptr<BackendStream>> open_stream() = 0;
};

struct BackendOptions {
  std::string kind = "auto";  // auto, cpu, cuda
  CacheGeometry geometry;
  int32_t cpu_threads = 0;    // 0 = all cores
  // CPU kernel target (pagoda/cpu_targets.h): best, amx, avx512bf16, avx3 or avx2. Other
  // than best it is selected for the whole process.
  std::string cpu_target = "best";
  // Where the CPU kernel's tasks request their lines (select_prefetch_level in
  // pagoda/cpu_targets.h): auto, l1 or l2. Other than auto it is selected for
  // the whole process.
  std::string cpu_prefetch = "auto";
  int32_t cuda_device = 0;
  int32_t max_batch = 256;    // sizes each stream's device workspaces
  std::vector<KvScale> kv_scales;  // [num_layers], or empty: 1.0 everywhere
};

// Creates the backend `options.kind` names; "auto" picks CUDA when it was built
// and a device is usable, the CPU otherwise.
StatusOr<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);

// Whether this build has the CUDA backend and, if so, whether a device answers.
bool cuda_built();
bool cuda_device_available();

}  // namespace pagoda
