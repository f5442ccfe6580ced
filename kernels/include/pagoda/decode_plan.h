#pragma once
// The decode plan: everything about a launch that does not depend on the
// backend, computed once on the host and then executed by the CPU and the CUDA
// backend alike (FlashInfer's plan()/run() split). From the batch's lengths,
// query rows, variant and split setting it fixes
//  - the chunk length (split_plan.h) and the chunks each sequence attends
//    (key_ranges.h: bottom-right causal rows, sliding window);
//  - the keys of every query row;
//  - the work items: one chunk each, with the sequences whose rows read it.
//    Sequences whose blocks are identical over a whole chunk (forks of one
//    prefix; docs/design.md, "Shared prefixes") share one item, so the
//    chunk's K/V is read once for the rows of all of them;
//  - the partial layout: where the state of (sequence, chunk, row, query head)
//    lives, the same on every backend;
//  - the per-launch constants: q's factor (softmax scale, log2(e), the layer's K
//    scale; the soft-cap), the sinks in base 2, the V scale.
//
// Bits: a row's partial state for a chunk depends on that chunk's keys and the
// row's own key range alone, wherever the row sits in an item, so sharing a
// chunk changes which rows are computed together, never what any row computes.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/backend.h"
#include "pagoda/key_ranges.h"
#include "pagoda/paged_kv.h"
#include "pagoda/split_plan.h"

namespace pagoda {

// What every backend folds into a launch once, never per element.
struct LaunchConstants {
  // q's factor: scale * log2(e) * k_scale (scores in base 2), or scale *
  // k_scale under a soft-cap, whose tanh comes first and soft_cap_log2 after it.
  float q_scale = 0.f;
  float soft_cap = 0.f;       // 0: none
  float inv_soft_cap = 0.f;   // 1 / soft_cap
  float soft_cap_log2 = 0.f;  // soft_cap * log2(e)
  float out_scale = 1.f;      // the layer's V scale (K's when V is K's prefix), folded into the merge's 1 / l
  bool has_sinks = false;     // sinks_log2() is [num_q_heads] when set
};

// One sequence of the launch: its query rows and its chunks.
struct PlanSequence {
  int32_t first_row = 0;      // its rows are [first_row, first_row + rows) of the launch
  int32_t rows = 1;
  ChunkSpan chunks;           // chunks its rows attend; only these have partials
  int64_t first_partial = 0;  // partial index of (chunks.first, row 0, query head 0)
};

// One work item: chunk `chunk` of the sequences members()[first_member ..
// end_member), ascending. More than one member: a shared chunk (their block
// ids are equal over the whole chunk), read once for all their rows.
struct PlanItem {
  int32_t chunk = 0;
  int32_t first_member = 0;
  int32_t end_member = 0;

  int32_t member_count() const { return end_member - first_member; }
};

struct PlanOptions {
  int32_t num_workers = 1;    // threads or resident CTAs the fast split balances over
  bool share_chunks = true;   // group sequences with identical whole chunks
  // Fewest sequences a shared item has: a smaller group is planned unshared
  // (a backend whose shared tasks cost more than the reads they save sets it).
  int32_t min_shared_members = 2;
};

class DecodePlan {
 public:
  // Plans `launch` (validated inputs) on a cache of geometry `g` whose layer
  // has K/V scales `kv`. Buffers are reused: a warm plan allocates nothing.
  void build(const DecodeLaunch& launch, const CacheGeometry& g, KvScale kv, const PlanOptions& options);

  int32_t chunk_tokens() const { return chunk_tokens_; }
  int32_t num_q_heads() const { return num_q_heads_; }
  std::span<const PlanSequence> sequences() const { return seqs_; }
  // [rows] the keys each query row attends; the sequence of each row.
  std::span<const KeySpan> row_keys() const { return row_keys_; }
  std::span<const int32_t> row_sequence() const { return row_seq_; }
  std::span<const PlanItem> items() const { return items_; }
  std::span<const int32_t> members() const { return members_; }
  const LaunchConstants& constants() const { return constants_; }
  // [num_q_heads] sink * log2(e) (rounded to fp32 once, here), when has_sinks.
  std::span<const float> sinks_log2() const { return sinks_log2_; }

  // Partial states: one (m, l, acc) per (sequence, attended chunk, row, query
  // head), sequence-major, then chunk, row and head.
  int64_t partial_rows() const { return partial_rows_; }
  int64_t partial_index(int32_t seq, int32_t chunk, int32_t row, int32_t q_head) const {
    const PlanSequence& s = seqs_[static_cast<size_t>(seq)];
    return s.first_partial + (static_cast<int64_t>(chunk - s.chunks.first) * s.rows + row) * num_q_heads_ + q_head;
  }

  // The keys of item i that its rows read: the hull of their ranges inside the
  // chunk (begin >= end: none).
  KeySpan item_keys(const PlanItem& item) const;
  // Key rows of one KV head the launch reads (each item's hull once), and the
  // reads sharing saved (what the members of shared items would have read
  // alone, less what the item reads).
  int64_t read_tokens() const { return read_tokens_; }
  int64_t shared_tokens() const { return shared_tokens_; }

 private:
  struct Candidate {
    int32_t chunk;
    int32_t seq;
  };
  void plan_items(const DecodeLaunch& launch, const CacheGeometry& g, const PlanOptions& options);
  bool same_chunk_blocks(const DecodeLaunch& launch, int32_t block_size, int32_t a, int32_t b, int32_t chunk) const;

  int32_t chunk_tokens_ = 0;
  int32_t num_q_heads_ = 0;
  std::vector<PlanSequence> seqs_;
  std::vector<KeySpan> row_keys_;
  std::vector<int32_t> row_seq_;
  std::vector<PlanItem> items_;
  std::vector<int32_t> members_;
  std::vector<float> sinks_log2_;
  LaunchConstants constants_;
  int64_t partial_rows_ = 0;
  int64_t read_tokens_ = 0;
  int64_t shared_tokens_ = 0;
  // Scratch of plan_items.
  std::vector<Candidate> candidates_;
  std::vector<int32_t> group_of_;     // [sequence chunks] the shared group a (sequence, chunk) joins, or -1
  std::vector<int64_t> chunk_base_;   // [batch] index of a sequence's first chunk in group_of_
  std::vector<PlanItem> groups_;      // shared groups, members in members_ scratch below
  std::vector<int32_t> group_members_;
};

}  // namespace pagoda
