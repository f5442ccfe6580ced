#pragma once
// The paged KV cache's bookkeeping (docs/design.md §3): the block pool, each sequence's
// block table and per-layer lengths, sharing between forks (copy-on-write), and
// reservations (reservation.h) that pin what a computation reads and own the
// slots an append writes.
//
// Every block has two counts, kept apart:
//  - shares: the block tables holding it (a sequence and its forks). Only a
//    block with more than one share is copied before a write.
//  - pins: reservations in flight. A pin keeps the block alive (its return to
//    the free list waits for it) but does not make it shared: a reservation
//    reads only up to the length fixed when it was made, so a pinned block may
//    be appended to in place past that length.
// A block is free when both are zero. One exception to "pins do not copy": a
// truncation that cuts into a pinned block marks it, and the next write into it
// copies it first, since that write lands below a length a pin still reads.
//
// Guarantees: an append is all-or-nothing (RESOURCE_EXHAUSTED, FAILED_PRECONDITION
// or a failed write leave every sequence as it was); a block id addresses the same
// slot in every layer and each layer has its own length; a sequence that is
// freed, forked, grown or truncated meanwhile never changes what a reservation
// reads.
//
// Locks: one mutex guards the bookkeeping and is never held across a copy or a
// K/V write. Appends to one layer take that layer's writer token from
// reservation to commit, so they are ordered per layer (the engine orders them
// so already); truncation takes every layer's token. All methods are safe to
// call concurrently.

#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/reservation.h"
#include "cache/sequence_cut.h"
#include "cache/sequence_ids.h"
#include "cache/tenant.h"
#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

struct SequenceInfo {
  std::string label;
  std::vector<int32_t> layer_lengths;  // [num_layers] tokens cached per layer
  int32_t blocks_held = 0;
};

// One request's claim on a reservation.
struct ReserveRequest {
  // The caller's tenant: another tenant's id is NOT_FOUND, as an unknown one.
  TenantId tenant = kDefaultTenant;
  std::span<const SequenceId> ids;
  // New tokens each sequence appends before attending: new_tokens[i] for
  // sequence i, or new_tokens_each for all when new_tokens is empty.
  std::span<const int32_t> new_tokens;
  int32_t new_tokens_each = 0;
  // [ids] the layer length each sequence must have before its append; empty:
  // unchecked. A mismatch is FAILED_PRECONDITION and nothing changes.
  std::span<const int32_t> expected_lengths;
  // The wire fields errors name: DecodeRequest's lists (sequence_ids[i],
  // expected_lengths[i]) or AppendKV's scalars (sequence_id, expected_length).
  bool scalar_fields = false;
  // [ids] query rows each sequence attends with (docs/design.md §9); empty: one each,
  // unchecked. A sequence holding fewer tokens than its rows after the append
  // is INVALID_ARGUMENT (one row on an empty sequence is allowed).
  std::span<const int32_t> query_rows;
  // An import's part: --max-request-blocks does not apply (its size is the
  // export's; quotas and the other limits do).
  bool whole_sequence = false;

  int32_t tokens_of(size_t i) const { return new_tokens.empty() ? new_tokens_each : new_tokens[i]; }
};

// Where a part's new rows come from: [tokens of the part, num_kv_heads, head_dim].
struct KvSource {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kFloat32;
  // k and v hold the cache dtype's stored bytes (an import): written as they
  // are, with no conversion or scale (BackendStream::write_kv_raw).
  bool raw = false;
};

// Stored rows to append to one layer (an import): k and v each
// [num_tokens, num_kv_heads, head_dim] in the cache dtype.
struct RawRows {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const void* k = nullptr;
  const void* v = nullptr;
};

// One import (sequence_transfer.cc): rows appended to a new sequence or to an
// existing one, all of them or none.
struct ImportRequest {
  TenantId tenant = kDefaultTenant;
  std::string label;  // a new sequence's
  // 0: a new sequence. Else append to this one (of `tenant`), which must hold
  // exactly expected_lengths[l] tokens in each layer l (FAILED_PRECONDITION).
  SequenceId into = 0;
  std::span<const int32_t> expected_lengths;  // [num_layers] with `into`
  // A new sequence takes this id instead of a fresh one (a snapshot's
  // restore); ALREADY_EXISTS when it is taken.
  SequenceId restore_id = 0;
  std::span<const RawRows> rows;  // layers in order, each layer's tokens in order
};

class CacheManager {
 public:
  // The backend owns the pools; the manager hands out their block ids.
  explicit CacheManager(const CacheGeometry& geometry);
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  const CacheGeometry& geometry() const { return geometry_; }

  // Told after every change of what the cache holds (blocks taken or freed,
  // sequences made or dropped, a tenant's usage), outside the bookkeeping
  // lock, on the thread that made it; set once before serving. The cache only
  // reports; observability decides what to count (CacheGauges listens).
  void set_change_listener(std::function<void()> listener) { change_listener_ = std::move(listener); }

  // Called with (layer, elements) after a write an fp8 cache saturated in;
  // set once before serving.
  void set_saturation_observer(std::function<void(int32_t, int64_t)> observer) {
    saturation_observer_ = std::move(observer);
  }

  // A tenant's quota (set at start and when the tokens file is reloaded);
  // tenants never set have none. Exceeding one is RESOURCE_EXHAUSTED naming
  // the quota, its limit and the usage, and changes nothing.
  void set_tenant_limits(TenantId tenant, TenantLimits limits);
  TenantUsage usage(TenantId tenant) const;
  TenantLimits limits(TenantId tenant) const;
  // Calls fn(tenant, limits, usage) for every tenant with limits set, under
  // the bookkeeping lock (one consistent reading; fn must not call back in).
  void for_each_tenant(const std::function<void(TenantId, const TenantLimits&, const TenantUsage&)>& fn) const;

  // Most new blocks one request may take (0: no limit beyond the free list);
  // set once before serving. A request past it is RESOURCE_EXHAUSTED naming it.
  void set_max_request_blocks(int64_t blocks) { max_request_blocks_ = blocks; }
  // Most sequences the cache holds, all tenants together, and most tokens one
  // sequence holds in a layer (0: no limit); set once before serving. Past
  // either: RESOURCE_EXHAUSTED naming the flag, and nothing changes.
  void set_max_sequences(int64_t n) { max_sequences_ = n; }
  void set_max_sequence_tokens(int64_t n) { max_sequence_tokens_ = n; }

  // Frees every sequence no call has named for longer than `ttl`, as
  // FreeSequence would (blocks a reservation pins stay until it releases).
  struct Evicted {
    SequenceId id;
    std::string label;
    double idle_seconds;
  };
  std::vector<Evicted> evict_idle(std::chrono::steady_clock::duration ttl);

  // Sequences belong to the tenant that created them (a fork to its
  // source's); every call naming an id acts for `tenant`, and another
  // tenant's id is NOT_FOUND with the message an unknown id gets.
  // A sequence of `tenant`: RESOURCE_EXHAUSTED past its sequences quota.
  StatusOr<SequenceId> create_for(TenantId tenant, std::string label);
  // The default tenant's, with no quota check (tests and tools).
  SequenceId create(std::string label);
  StatusOr<SequenceId> fork(SequenceId source, TenantId tenant = kDefaultTenant);
  // `count` forks at once, all or nothing against the quotas and limits.
  StatusOr<std::vector<SequenceId>> fork(SequenceId source, TenantId tenant, int32_t count);
  Status free(SequenceId id, TenantId tenant = kDefaultTenant);
  StatusOr<SequenceInfo> info(SequenceId id, TenantId tenant = kDefaultTenant);  // counts as a use (--idle-ttl)
  // Cuts every layer longer than `length` to it; whole blocks past every
  // layer's length go back (or stay with a fork that shares them). Waits for
  // appends in flight. Returns the layers' lengths after the cut.
  StatusOr<std::vector<int32_t>> truncate(SequenceId id, int32_t length, TenantId tenant = kDefaultTenant);

  // Starts `r` (emptied first) on `layer`. `appends`: some request will append,
  // so the layer's writer token is taken (waiting for another appender).
  // The layer comes validated (rpc/admission.h).
  void begin(int32_t layer, bool appends, Reservation& r);
  // Adds one request to `r`: its sequences (each with its length after the
  // append) and the slots and copies its new tokens need. All or nothing: on
  // error `r` is as before. Errors: NOT_FOUND (unknown id), FAILED_PRECONDITION
  // (expected_lengths), RESOURCE_EXHAUSTED (not enough free blocks).
  Status reserve(Reservation& r, const ReserveRequest& request);
  // Makes `r`'s copy-on-write copies, waits for copies other reservations are
  // making into blocks `r` reads or writes, writes each part's new rows
  // (sources[p] for part p) into their slots, then commits the new lengths. All
  // of it outside the bookkeeping lock. On error nothing is committed and `r`
  // rolls back when released.
  Status finish(Reservation& r, BackendStream& stream, std::span<const KvSource> sources);
  // Step 1 of finish alone: `r`'s copy-on-write copies, so that no block it
  // published stays unfilled while its caller waits for something else (an
  // import reserving its next layer). finish then makes only what is left.
  Status make_copies(Reservation& r, BackendStream& stream);
  // Starts `r` on the layer of `from` and pins exactly what sequence `index` of
  // `from` reads (the determinism checker re-reads a launch's view after it).
  void pin_copy(const Reservation& from, int32_t index, Reservation& r);

  // One request's append: begin, reserve, finish, release. Returns the layer's new length.
  StatusOr<int32_t> append(BackendStream& stream, SequenceId id, int32_t layer, int32_t num_tokens, const void* k,
                           const void* v, DType dtype, std::optional<int32_t> expected_length = std::nullopt,
                           TenantId tenant = kDefaultTenant);

  // A consistent cut of `id` for `tenant` (any tenant when unset: the
  // snapshot's), pinned until `cut` is released. Counts as a use (--idle-ttl).
  Status cut(SequenceId id, std::optional<TenantId> tenant, SequenceCut& cut);
  // Appends `request.rows` (stored bytes) to a new sequence or to
  // request.into, through the reservations appends take: every layer's writer
  // token in layer order, quotas and limits as for appends. All or nothing:
  // on error no sequence is created and `into` is unchanged (a backend write
  // failing after some layers committed is the one exception: INTERNAL).
  // Returns the sequence's id; `lengths` gets its lengths after.
  StatusOr<SequenceId> import_rows(BackendStream& stream, const ImportRequest& request,
                                   std::vector<int32_t>* lengths = nullptr);
  // Every sequence's id, all tenants (a snapshot lists them).
  std::vector<SequenceId> sequence_ids() const;
  // The id permutation's key and counter (a snapshot keeps them), and their
  // restore before serving (ids stay valid, new ones never repeat old ones).
  SequenceIdGenerator::State id_state() const;
  void restore_id_state(const SequenceIdGenerator::State& state);

  // Tokens `ids` hold in `layer` (committed), summed; unknown ids count 0.
  int64_t cached_tokens(int32_t layer, std::span<const SequenceId> ids) const;

  int32_t total_blocks() const { return geometry_.num_blocks; }
  int32_t free_blocks() const;
  size_t num_sequences() const;
  // Tests: blocks on the free list, so they can be filled with NaN; a
  // sequence's block table (empty when unknown).
  std::vector<int32_t> free_block_ids() const;
  std::vector<int32_t> block_table(SequenceId id) const;

 private:
  friend class Reservation;
  friend class SequenceCut;

  struct Sequence {
    TenantId tenant = kDefaultTenant;
    std::string label;
    std::vector<int32_t> blocks;
    std::vector<int32_t> lengths;  // [num_layers] committed
    std::vector<int32_t> pending;  // [num_layers] length after the append in flight, -1: none
    int32_t copy_if_pinned = -1;   // table index truncated into while pinned (see the top of this file)
    std::chrono::steady_clock::time_point last_used = std::chrono::steady_clock::now();  // for --idle-ttl

    int32_t reserved_length(int32_t layer) const {
      return pending[layer] >= 0 ? pending[layer] : lengths[layer];
    }
  };
  // A block being copied into by a reservation that has not finished its copy.
  enum class Fill : uint8_t { kReady, kFilling, kFailed };

  // Tells the change listener when it goes out of scope, if armed: declared
  // before the lock, so the listener runs after the lock is released.
  class ChangeNotice {
   public:
    explicit ChangeNotice(const CacheManager& cache) : cache_(cache) {}
    ~ChangeNotice() {
      if (armed_ && cache_.change_listener_) cache_.change_listener_();
    }
    void arm() { armed_ = true; }

   private:
    const CacheManager& cache_;
    bool armed_ = false;
  };

  // Under mu_:
  Sequence* find(SequenceId id);  // any tenant's: for the cache's own bookkeeping
  Sequence* find(SequenceId id, TenantId tenant);  // the caller's only
  bool needs_copy(const Sequence& s, int32_t index, int32_t copies_planned) const;
  StatusOr<int64_t> blocks_needed(Reservation& r, std::span<Sequence* const> seqs, const ReserveRequest& request);
  // The steps of reserve(), under mu_ (reservation.cc).
  Status check_sequences(const Reservation& r, const ReserveRequest& request);
  Status check_blocks(const ReserveRequest& request, int64_t needed);
  void claim(Reservation& r, const ReserveRequest& request);
  int32_t allocate_block(TenantId owner);
  TenantUsage& usage_of(TenantId tenant);
  const TenantLimits* limits_of(TenantId tenant) const;
  Status check_sequence_quota(TenantId tenant, int64_t adding = 1);
  void unshare(int32_t block);
  void unpin(int32_t block);
  void maybe_free(int32_t block);
  void pin_range(Reservation& r, const Sequence& s, int32_t length);
  void rollback(Reservation& r);
  void trim_tail(Sequence& s);
  // A new empty sequence of `tenant` with `id` (fresh when 0), quota checked.
  StatusOr<SequenceId> add_sequence(TenantId tenant, std::string label, SequenceId id);
  void release(SequenceCut& cut);
  // Called by Reservation::release: the blocks it returned to the free list.
  int32_t release(Reservation& r);

  const CacheGeometry geometry_;
  std::function<void(int32_t, int64_t)> saturation_observer_;
  std::function<void()> change_listener_;
  int64_t max_request_blocks_ = 0;
  int64_t max_sequences_ = 0;
  int64_t max_sequence_tokens_ = 0;
  mutable std::mutex mu_;
  std::condition_variable filled_;  // a Fill left kFilling
  std::unordered_map<SequenceId, Sequence> sequences_;
  std::vector<int32_t> shares_;  // [num_blocks]
  std::vector<int32_t> pins_;    // [num_blocks]
  std::vector<Fill> fill_;       // [num_blocks]
  std::vector<int32_t> free_list_;
  std::vector<TenantId> owner_;        // [num_blocks] the tenant an allocated block is charged to
  std::vector<TenantUsage> usage_;     // [tenant]
  std::vector<TenantLimits> limits_;   // [tenant]; past the end: no limits
  SequenceIdGenerator ids_;
  std::unique_ptr<std::mutex[]> writers_;  // [num_layers] the layers' writer tokens
  // Scratch of reserve(), under mu_.
  std::vector<Sequence*> seqs_;
};

}  // namespace pagoda
