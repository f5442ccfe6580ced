#pragma once
// The units of work the rpc handlers hand to the engine. Inputs point into the
// request's own bytes, outputs into the response's buffers; both stay alive
// until `done` is told.

#include <array>
#include <atomic>
#include <memory>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

#include "cache/cache_manager.h"
#include "pagoda/status.h"

namespace pagoda {

using EngineClock = std::chrono::steady_clock;

class SharedMemoryRegion;
// Shared-memory regions a request's tensors lie in (docs/design.md §15), held
// until its work item is gone: an unregistered region stays mapped meanwhile.
using RegionPin = std::shared_ptr<const SharedMemoryRegion>;

// Told once when its work item is done (from an engine worker thread).
class WorkDone {
 public:
  virtual void work_done(const Status& status) = 0;

 protected:
  ~WorkDone() = default;
};

// One Decode request. Rows: its query rows, sum of q_lengths (batch when empty).
struct DecodeWork {
  TenantId tenant = kDefaultTenant;      // the caller's: its ids only
  int32_t layer = 0;
  std::span<const SequenceId> ids;       // [batch], distinct
  std::span<const int32_t> q_lengths;    // [batch] rows per sequence, or empty: 1 each
  int32_t rows = 0;
  std::span<const int32_t> expected_lengths;  // [batch] lengths before the append, or empty
  const void* q = nullptr;               // [rows, num_q_heads, head_dim]
  DType q_dtype = DType::kFloat32;
  const void* k = nullptr;               // [rows, num_kv_heads, head_dim] or null
  const void* v = nullptr;               // [rows, num_kv_heads, head_dim] or null (always: V is K's prefix)
  DType kv_dtype = DType::kFloat32;
  float scale = 0.f;                     // resolved: > 0
  int32_t sliding_window = 0;            // 0: none
  float soft_cap = 0.f;                  // 0: none
  const void* sinks = nullptr;           // [num_q_heads] fp32 bytes (any alignment), or null
  void* out = nullptr;                   // [rows, num_q_heads, v_head_dim], q_dtype
  float* lse = nullptr;                  // [rows, num_q_heads] or null
  std::array<RegionPin, 5> regions;      // of q, k, v, out, lse when they lie in shared memory
  int32_t* lengths = nullptr;            // [batch] tokens attended
  int32_t* splits = nullptr;             // [batch] chunks per sequence
  // Filled by the engine:
  int32_t chunk_tokens = 0;
  double queue_us = 0;                   // enqueue -> its batch starts
  double compute_us = 0;                 // the batch's reservation + launch
  EngineClock::time_point enqueued;
  WorkDone* done = nullptr;
  // Set when the caller gave up (cancelled, deadline passed): if the engine has
  // not reserved yet, the item fails and changes nothing (refusal()).
  std::atomic<bool> cancelled{false};
  // The call's deadline (max: none). Checked when the item is reserved: past
  // it, nothing happens and the answer is DEADLINE_EXCEEDED; once reserved,
  // the item completes (its append is committed) whatever the caller does.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();

  DecodeWork() = default;
  DecodeWork(const DecodeWork&) = delete;
  DecodeWork& operator=(const DecodeWork&) = delete;
  // The request's inputs and output buffers of `other` (a validated item that
  // moves to another owner before it was submitted).
  void take_request(const DecodeWork& other) {
    tenant = other.tenant;
    layer = other.layer;
    ids = other.ids;
    q_lengths = other.q_lengths;
    rows = other.rows;
    expected_lengths = other.expected_lengths;
    sliding_window = other.sliding_window;
    soft_cap = other.soft_cap;
    sinks = other.sinks;
    q = other.q;
    q_dtype = other.q_dtype;
    k = other.k;
    v = other.v;
    kv_dtype = other.kv_dtype;
    scale = other.scale;
    out = other.out;
    lse = other.lse;
    regions = other.regions;
    lengths = other.lengths;
    splits = other.splits;
  }
};

// One AppendKV request (run alone, in its layer's queue order).
struct AppendWork {
  TenantId tenant = kDefaultTenant;      // the caller's: its ids only
  SequenceId id = 0;
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const void* k = nullptr;               // [num_tokens, num_kv_heads, head_dim]
  const void* v = nullptr;               // [num_tokens, num_kv_heads, head_dim]; null when V is K's prefix
  DType dtype = DType::kFloat32;
  std::array<RegionPin, 2> regions;      // of k and v when they lie in shared memory
  std::optional<int32_t> expected_length;  // the layer's length before the append, when set
  int32_t layer_length = 0;              // filled: the layer's length after the append
  WorkDone* done = nullptr;
  std::atomic<bool> cancelled{false};    // as DecodeWork::cancelled
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();  // as DecodeWork's
};

// Why a work item must not start, checked at its reservation: its deadline has
// passed (DEADLINE_EXCEEDED) or its caller gave up (CANCELLED); OK otherwise.
template <typename Work>
Status refusal(const Work& w) {
  if (w.deadline != std::chrono::system_clock::time_point::max() && std::chrono::system_clock::now() >= w.deadline) {
    return Status(StatusCode::kDeadlineExceeded, "request: deadline passed before it ran; nothing was changed");
  }
  if (w.cancelled.load(std::memory_order_relaxed)) {
    return Status(StatusCode::kCancelled, "request: cancelled before it ran; nothing was changed");
  }
  return Status::Ok();
}

}  // namespace pagoda
