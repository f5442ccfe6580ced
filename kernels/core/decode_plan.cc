#include "pagoda/decode_plan.h"

#include <algorithm>
#include <cassert>

#include "pagoda/softmax_state.h"

namespace pagoda {
namespace {

// The keys rows of sequence `s` read inside [chunk_begin, chunk_end): rows'
// spans are contiguous and move forward with the row, so their hull runs from
// row 0's begin to the last row's end.
KeySpan sequence_keys_in(std::span<const KeySpan> row_keys, const PlanSequence& s, int64_t chunk_begin,
                         int64_t chunk_end) {
  const KeySpan first = row_keys[static_cast<size_t>(s.first_row)];
  const KeySpan last = row_keys[static_cast<size_t>(s.first_row + s.rows - 1)];
  return {std::max(first.begin, chunk_begin), std::min(last.end, chunk_end)};
}

}  // namespace

void DecodePlan::build(const DecodeLaunch& launch, const CacheGeometry& g, KvScale kv, const PlanOptions& options) {
  const BatchBlockTables& t = launch.tables;
  const int32_t batch = t.batch;
  num_q_heads_ = g.num_q_heads;

  SplitPlanInput split;
  split.mode = launch.mode;
  split.split_tokens = launch.split_tokens;
  split.block_size = g.block_size;
  split.num_kv_heads = g.num_kv_heads;
  split.num_workers = options.num_workers;
  for (int32_t b = 0; b < batch; ++b) {
    split.total_tokens += t.lengths[b];
    split.max_length = std::max(split.max_length, t.lengths[b]);
  }
  chunk_tokens_ = choose_chunk_tokens(split);

  seqs_.resize(static_cast<size_t>(batch));
  row_keys_.resize(static_cast<size_t>(launch.total_rows()));
  row_seq_.resize(row_keys_.size());
  partial_rows_ = 0;
  for (int32_t b = 0; b < batch; ++b) {
    PlanSequence& s = seqs_[static_cast<size_t>(b)];
    s.first_row = launch.first_row(b);
    s.rows = launch.rows_of(b);
    assert(s.rows <= t.lengths[b] || (s.rows == 1 && t.lengths[b] == 0));
    s.chunks = chunks_needed(t.lengths[b], s.rows, launch.sliding_window, chunk_tokens_);
    s.first_partial = partial_rows_;
    partial_rows_ += static_cast<int64_t>(s.chunks.count()) * s.rows * g.num_q_heads;
    for (int32_t i = 0; i < s.rows; ++i) {
      row_keys_[static_cast<size_t>(s.first_row + i)] = pagoda::row_keys(t.lengths[b], s.rows, i, launch.sliding_window);
      row_seq_[static_cast<size_t>(s.first_row + i)] = b;
    }
  }

  constants_ = {};
  constants_.q_scale = (launch.soft_cap > 0.f ? launch.scale : scale_log2(launch.scale)) * kv.k;
  if (launch.soft_cap > 0.f) {
    constants_.soft_cap = launch.soft_cap;
    constants_.inv_soft_cap = 1.f / launch.soft_cap;
    constants_.soft_cap_log2 = launch.soft_cap * static_cast<float>(kLog2e);
  }
  // V read from K's rows (latent attention) carries K's scale.
  constants_.out_scale = g.latent() ? kv.k : kv.v;
  constants_.has_sinks = launch.sinks != nullptr;
  sinks_log2_.clear();
  if (launch.sinks != nullptr) {
    for (int32_t h = 0; h < g.num_q_heads; ++h) sinks_log2_.push_back(static_cast<float>(launch.sinks[h] * kLog2e));
  }

  plan_items(launch, g, options);
}

bool DecodePlan::same_chunk_blocks(const DecodeLaunch& launch, int32_t block_size, int32_t a, int32_t b,
                                   int32_t chunk) const {
  const BatchBlockTables& t = launch.tables;
  const int32_t per_chunk = chunk_tokens_ / block_size;
  const int32_t* ba = t.block_ids + t.block_indptr[a] + chunk * per_chunk;
  const int32_t* bb = t.block_ids + t.block_indptr[b] + chunk * per_chunk;
  return std::equal(ba, ba + per_chunk, bb);
}

void DecodePlan::plan_items(const DecodeLaunch& launch, const CacheGeometry& g, const PlanOptions& options) {
  const bool share = options.share_chunks;
  const auto min_members = static_cast<size_t>(std::max(2, options.min_shared_members));
  const BatchBlockTables& t = launch.tables;
  const int32_t batch = t.batch;
  const int32_t bs = g.block_size;
  const int32_t per_chunk = chunk_tokens_ / bs;  // chunk lengths are multiples of the block size

  // Which (sequence, chunk) pairs join a shared group: whole chunks only (a
  // partly filled last chunk is never shared), grouped by their block ids.
  chunk_base_.resize(static_cast<size_t>(batch));
  int64_t seq_chunks = 0;
  candidates_.clear();
  for (int32_t b = 0; b < batch; ++b) {
    const PlanSequence& s = seqs_[static_cast<size_t>(b)];
    chunk_base_[static_cast<size_t>(b)] = seq_chunks;
    seq_chunks += s.chunks.count();
    if (!share || batch < 2) continue;
    for (int32_t c = s.chunks.first; c < s.chunks.end; ++c) {
      if (static_cast<int64_t>(c + 1) * chunk_tokens_ <= t.lengths[b]) candidates_.push_back({c, b});
    }
  }
  group_of_.assign(static_cast<size_t>(seq_chunks), -1);
  groups_.clear();
  group_members_.clear();
  if (candidates_.size() >= 2) {
    auto block_at = [&](const Candidate& x, int32_t j) {
      return t.block_ids[t.block_indptr[x.seq] + x.chunk * per_chunk + j];
    };
    std::sort(candidates_.begin(), candidates_.end(), [&](const Candidate& x, const Candidate& y) {
      if (x.chunk != y.chunk) return x.chunk < y.chunk;
      for (int32_t j = 0; j < per_chunk; ++j) {
        const int32_t bx = block_at(x, j);
        const int32_t by = block_at(y, j);
        if (bx != by) return bx < by;
      }
      return x.seq < y.seq;
    });
    for (size_t i = 0; i < candidates_.size();) {
      size_t j = i + 1;
      while (j < candidates_.size() && candidates_[j].chunk == candidates_[i].chunk &&
             same_chunk_blocks(launch, bs, candidates_[i].seq, candidates_[j].seq, candidates_[i].chunk)) {
        ++j;
      }
      if (j - i >= min_members) {
        const auto group = static_cast<int32_t>(groups_.size());
        PlanItem item;
        item.chunk = candidates_[i].chunk;
        item.first_member = static_cast<int32_t>(group_members_.size());
        for (size_t k = i; k < j; ++k) {
          const Candidate& c = candidates_[k];
          group_members_.push_back(c.seq);
          const PlanSequence& s = seqs_[static_cast<size_t>(c.seq)];
          group_of_[static_cast<size_t>(chunk_base_[static_cast<size_t>(c.seq)] + c.chunk - s.chunks.first)] = group;
        }
        item.end_member = static_cast<int32_t>(group_members_.size());
        groups_.push_back(item);
      }
      i = j;
    }
  }

  // Items in sequence-major chunk order; a shared chunk comes where its first
  // member's chunk would, and its other members skip it.
  items_.clear();
  members_.clear();
  read_tokens_ = 0;
  shared_tokens_ = 0;
  for (int32_t b = 0; b < batch; ++b) {
    const PlanSequence& s = seqs_[static_cast<size_t>(b)];
    for (int32_t c = s.chunks.first; c < s.chunks.end; ++c) {
      const int32_t group = group_of_[static_cast<size_t>(chunk_base_[static_cast<size_t>(b)] + c - s.chunks.first)];
      PlanItem item;
      item.chunk = c;
      item.first_member = static_cast<int32_t>(members_.size());
      if (group < 0) {
        members_.push_back(b);
      } else {
        const PlanItem& gi = groups_[static_cast<size_t>(group)];
        if (group_members_[static_cast<size_t>(gi.first_member)] != b) continue;
        members_.insert(members_.end(), group_members_.begin() + gi.first_member,
                        group_members_.begin() + gi.end_member);
      }
      item.end_member = static_cast<int32_t>(members_.size());
      items_.push_back(item);
      const int64_t read = span_tokens(item_keys(item));
      read_tokens_ += read;
      if (item.member_count() > 1) {
        const ChunkRange range = chunk_range(INT64_MAX, chunk_tokens_, c);
        int64_t alone = 0;
        for (int32_t m = item.first_member; m < item.end_member; ++m) {
          const PlanSequence& ms = seqs_[static_cast<size_t>(members_[static_cast<size_t>(m)])];
          alone += span_tokens(sequence_keys_in(row_keys_, ms, range.begin, range.end));
        }
        shared_tokens_ += alone - read;
      }
    }
  }
}

KeySpan DecodePlan::item_keys(const PlanItem& item) const {
  const ChunkRange range = chunk_range(INT64_MAX, chunk_tokens_, item.chunk);
  KeySpan hull{range.end, range.begin};
  for (int32_t m = item.first_member; m < item.end_member; ++m) {
    const PlanSequence& s = seqs_[static_cast<size_t>(members_[static_cast<size_t>(m)])];
    const KeySpan k = sequence_keys_in(row_keys_, s, range.begin, range.end);
    if (k.begin >= k.end) continue;
    hull.begin = std::min(hull.begin, k.begin);
    hull.end = std::max(hull.end, k.end);
  }
  return hull;
}

}  // namespace pagoda
