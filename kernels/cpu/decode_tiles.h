#pragma once
// What one CPU work item reads and in which order, without SIMD: the keys of
// the item (the union of its positions' ranges inside the chunk) cut into
// sub-blocks, each read as K rows then V rows, in runs (the rows of one KV head
// inside one block are contiguous), and a prefetcher that walks the same runs
// a fixed distance ahead of the reads.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include <hwy/base.h>

#include "cpu/decode_cpu.h"
#include "cpu/nan_free_slots.h"
#include "cpu/prefetch_levels.h"

namespace pagoda::cpu {

// K or V rows converted to fp32 at a time: a tile of 16 KiB stays in L1 while
// every row of the task uses it. Latent attention's 576-wide rows make 16 of
// them 36 KiB, past a 32 KiB L1, yet fewer measured no faster: 8 rows took
// 1.09x the time and 12 rows 1.02x (AMD Zen 3, AVX2, bf16, 32 heads, 8 x 4096
// tokens on 2 threads, medians of 6 and 10 alternating runs).
constexpr int64_t tile_tokens(int64_t head_dim) { return head_dim <= 128 ? 32 : 16; }

// Rows of one KV head of a layer's pool: tokens of a head inside a block are
// contiguous rows of head_dim elements; blocks come from the table.
struct PoolRows {
  const std::byte* pool;
  const int32_t* blocks;
  const CacheGeometry& g;
  int32_t kv_head;
  int64_t row_bytes;                     // head_dim * element size
  const std::atomic<int32_t>* nan_free;  // the layer's NaN-free marks (nan_free_slots.h), or null

  PoolRows(const void* p, const int32_t* b, const CacheGeometry& geometry, int32_t head, size_t elem,
           const std::atomic<int32_t>* nan_free_marks = nullptr)
      : pool(static_cast<const std::byte*>(p)), blocks(b), g(geometry), kv_head(head),
        row_bytes(static_cast<int64_t>(geometry.head_dim) * static_cast<int64_t>(elem)), nan_free(nan_free_marks),
        block_bytes_(geometry.block_stride() * static_cast<int64_t>(elem)),
        head_bytes_(static_cast<int64_t>(head) * geometry.head_stride() * static_cast<int64_t>(elem)),
        block_shift_(std::has_single_bit(static_cast<uint32_t>(geometry.block_size))
                         ? std::countr_zero(static_cast<uint32_t>(geometry.block_size))
                         : -1) {}

  // The contiguous run of rows that starts at `pos` and ends at the block's end
  // or at `end`: its first byte and its row count. Byte strides are kept and a
  // power-of-two block size is shifted, not divided: a run is found for every
  // 16 or so rows read and as many prefetched, and the two 64-bit divisions it
  // took were half the prefetcher's time at head_dim 64.
  const std::byte* run(int64_t pos, int64_t end, int64_t* rows) const {
    int64_t block;
    int64_t slot;
    if (HWY_LIKELY(block_shift_ >= 0)) {
      block = pos >> block_shift_;
      slot = pos & (g.block_size - 1);
    } else {
      block = pos / g.block_size;
      slot = pos % g.block_size;
    }
    *rows = std::min<int64_t>(g.block_size - slot, end - pos);
    return pool + blocks[block] * block_bytes_ + head_bytes_ + slot * row_bytes;
  }

  // Whether the run of `rows` rows at `pos` (one block's) is known to hold no
  // e4m3 NaN code, so that it may be read without its scan.
  bool known_nan_free(int64_t pos, int64_t rows) const {
    if (nan_free == nullptr) return false;
    const int64_t block = block_shift_ >= 0 ? pos >> block_shift_ : pos / g.block_size;
    return cpu::known_nan_free(nan_free, blocks[block], pos - block * g.block_size, rows);
  }

 private:
  int64_t block_bytes_;
  int64_t head_bytes_;
  int block_shift_;  // log2(block_size) where a power of two, else -1
};

class ReadPlan {
 public:
  struct Span {
    int64_t begin;
    int64_t end;
  };

  explicit ReadPlan(const PartialTask& t) : t_(t) {
    begin_ = t.chunk_end;
    end_ = t.chunk_begin;
    for (int32_t p = 0; p < t.positions; ++p) {
      const KeySpan& k = t.position[p].keys;
      if (k.begin >= k.end) continue;
      begin_ = std::min(begin_, k.begin);
      end_ = std::max(end_, k.end);
    }
    begin_ = std::max(begin_, t.chunk_begin);
    end_ = std::min(end_, t.chunk_end);
  }

  bool empty() const { return begin_ >= end_; }
  // Sub-blocks are numbered from the chunk's start.
  int64_t first_sub_block() const { return (begin_ - t_.chunk_begin) / kSubBlockTokens; }
  int64_t end_sub_block() const { return (end_ - 1 - t_.chunk_begin) / kSubBlockTokens + 1; }
  // The keys sub-block `sb` reads: its part of [begin, end).
  Span sub_block(int64_t sb) const {
    const int64_t base = t_.chunk_begin + sb * kSubBlockTokens;
    return {std::max(begin_, base), std::min(end_, base + kSubBlockTokens)};
  }
  // Position p's keys inside sub-block sb (begin >= end when it has none).
  Span keys_of(int32_t p, int64_t sb) const {
    const Span s = sub_block(sb);
    const KeySpan& k = t_.position[p].keys;
    return {std::max(s.begin, k.begin), std::min(s.end, k.end)};
  }

 private:
  const PartialTask& t_;
  int64_t begin_;
  int64_t end_;
};

// Requests cache lines in the order the task reads them (per sub-block: the K
// runs, then the V runs), a fixed distance ahead. The runs of one KV head are
// 4 KiB pieces one block stride apart, which the hardware prefetcher does not
// follow from one to the next. The compute loops call step() as they consume
// rows, so the requests spread over the work instead of stalling the core in
// bursts on its fill buffers; the driver sets how far they may go (limit).
// A sub-block's runs are listed once, when the requests reach it, so moving
// to the next run inside the loops is a load, not a call: a call there made
// the loop keep its accumulators in memory across it (16 stores and loads at
// every 16-token block's end in P.V).
class LinePrefetch {
 public:
  LinePrefetch(const ReadPlan& plan, const PoolRows& k, const PoolRows& v, int64_t lines_ahead,
               PrefetchLevel level = PrefetchLevel::kL1)
      : plan_(plan), k_(k), v_(v), ahead_(lines_ahead), to_l2_(level == PrefetchLevel::kL2) {
    sb_ = plan.first_sub_block();
    list_runs();
    limit_ = lines_ahead;
    catch_up();
  }
  LinePrefetch(const LinePrefetch&) = delete;
  LinePrefetch& operator=(const LinePrefetch&) = delete;

  // Rows worth `lines` lines have been read: requests may run up to that many
  // lines past them.
  void consumed(int64_t lines) { limit_ += lines; }
  // Up to `lines` more requests, never past the limit. Inlined into the
  // compute loops: a compare and the prefetches, and where a run ends the
  // next one's bounds.
  HWY_INLINE void step(int64_t lines) {
    if (HWY_LIKELY(issued_ + lines <= limit_ && lines * 64 <= end_ - next_)) {
      for (int64_t i = 0; i < lines; ++i) request(next_ + i * 64);
      next_ += lines * 64;
      issued_ += lines;
      return;
    }
    if (issued_ < limit_) cross(std::min(lines, limit_ - issued_));  // none when at the limit
  }
  // The same with a count known at compile time (the score loop's): unrolled.
  template <int64_t kLines>
  HWY_INLINE void step() {
    if (HWY_LIKELY(issued_ + kLines <= limit_ && kLines * 64 <= end_ - next_)) {
      for (int64_t i = 0; i < kLines; ++i) request(next_ + i * 64);
      next_ += kLines * 64;
      issued_ += kLines;
      return;
    }
    if (issued_ < limit_) cross(std::min(kLines, limit_ - issued_));
  }
  void catch_up() {
    if (issued_ < limit_) cross(limit_ - issued_);
  }
  int64_t ahead() const { return ahead_; }

 private:
  struct Run {
    const std::byte* begin;
    const std::byte* end;
  };
  // A sub-block's runs, K's and V's: at most one per token each (one-token blocks).
  static constexpr int kMaxRuns = 2 * static_cast<int>(kSubBlockTokens);

  HWY_INLINE void request(const void* p) const {
    if (to_l2_) {
      __builtin_prefetch(p, /*rw=*/0, /*locality=*/2);
    } else {
      __builtin_prefetch(p, /*rw=*/0, /*locality=*/3);
    }
  }
  // `lines` requests (past the end of the task's runs: none), across runs.
  HWY_INLINE void cross(int64_t lines) {
    if (next_ == nullptr) return;  // every run requested
    issued_ += lines;
    const std::byte* next = next_;
    while (lines > 0) {
      if (next >= end_) {
        if (HWY_UNLIKELY(run_ + 1 >= run_count_)) {
          if (!next_sub_block()) return;
        } else {
          ++run_;
          end_ = runs_[run_].end;
        }
        next = runs_[run_].begin;
      }
      const int64_t n = std::min<int64_t>(lines, (end_ - next + 63) / 64);
      for (int64_t i = 0; i < n; ++i) request(next + i * 64);
      next += n * 64;
      lines -= n;
    }
    next_ = next;
  }
  // Lists sub-block sb_'s runs, K's then V's, and starts at the first.
  void list_runs() {
    const ReadPlan::Span span = plan_.sub_block(sb_);
    run_count_ = 0;
    for (const PoolRows* src : {&k_, &v_}) {
      for (int64_t pos = span.begin; pos < span.end;) {
        int64_t rows = 0;
        const std::byte* p = src->run(pos, span.end, &rows);
        runs_[run_count_++] = {p, p + rows * src->row_bytes};
        pos += rows;
      }
    }
    run_ = 0;
    next_ = runs_[0].begin;
    end_ = runs_[0].end;
  }
  // Past the last run: false, next_ null.
  HWY_NOINLINE bool next_sub_block() {
    if (++sb_ >= plan_.end_sub_block()) {
      next_ = end_ = nullptr;  // end - next stays defined (0): step() goes to cross(), which returns
      return false;
    }
    list_runs();
    return true;
  }

  const ReadPlan& plan_;
  const PoolRows& k_;
  const PoolRows& v_;
  int64_t ahead_;
  bool to_l2_;
  int64_t limit_ = 0;
  int64_t issued_ = 0;
  int64_t sb_ = 0;
  int run_ = 0;
  int run_count_ = 0;
  const std::byte* next_ = nullptr;  // the next line to request, in runs_[run_]
  const std::byte* end_ = nullptr;   // runs_[run_].end, beside next_ for step()'s one compare
  Run runs_[kMaxRuns];               // sub-block sb_'s, run_count_ of them
};

}  // namespace pagoda::cpu
