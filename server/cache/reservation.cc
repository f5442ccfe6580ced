// Reservations: the bookkeeping of an append or a pin under the lock, and the
// copies and K/V writes after it (cache_manager.h explains the counts).
#include <algorithm>
#include <cassert>
#include <utility>

#include "cache/cache_manager.h"
#include "pagoda/geometry_rules.h"

namespace pagoda {

// ---- Reservation -----------------------------------------------------------

Reservation::Reservation(Reservation&& other) noexcept { *this = std::move(other); }

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    layer_ = other.layer_;
    committed_ = other.committed_;
    writer_ = std::move(other.writer_);
    lengths_ = std::move(other.lengths_);
    block_indptr_ = std::move(other.block_indptr_);
    block_ids_ = std::move(other.block_ids_);
    slots_ = std::move(other.slots_);
    parts_ = std::move(other.parts_);
    copies_ = std::move(other.copies_);
    growth_ = std::move(other.growth_);
    awaited_ = std::move(other.awaited_);
    other.clear();
  }
  return *this;
}

int32_t Reservation::release() {
  const int32_t freed = owner_ != nullptr ? owner_->release(*this) : 0;
  clear();
  return freed;
}

void Reservation::clear() {
  owner_ = nullptr;
  layer_ = 0;
  committed_ = false;
  if (writer_.owns_lock()) writer_.unlock();
  writer_ = {};
  lengths_.clear();
  block_indptr_.assign(1, 0);
  block_ids_.clear();
  slots_.clear();
  parts_.clear();
  copies_.clear();
  growth_.clear();
  awaited_.clear();
}

// ---- CacheManager: reservations ---------------------------------------------

void CacheManager::begin(int32_t layer, bool appends, Reservation& r) {
  r.release();
  assert(layer >= 0 && layer < geometry_.num_layers && "admission validates the layer");
  if (appends) r.writer_ = std::unique_lock<std::mutex>(writers_[static_cast<size_t>(layer)]);
  r.owner_ = this;
  r.layer_ = layer;
}

bool CacheManager::needs_copy(const Sequence& s, int32_t index, int32_t copies_planned) const {
  const int32_t b = s.blocks[static_cast<size_t>(index)];
  return shares_[b] - copies_planned > 1 || (index == s.copy_if_pinned && pins_[b] > 0);
}

// Blocks the request takes from the free list: new blocks past the tables'
// ends, and a copy of each shared block a write lands in. When several of the
// request's sequences write into one shared block (a sequence and its fork),
// each copy leaves one share fewer, and the last holder writes in place: the
// count follows the order the writes will happen in.
StatusOr<int64_t> CacheManager::blocks_needed(Reservation& r, std::span<Sequence* const> seqs,
                                              const ReserveRequest& request) {
  const int32_t bs = geometry_.block_size;
  auto& planned = r.shares_taken_;
  planned.clear();
  int64_t needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *seqs[i];
    const int32_t n = request.tokens_of(i);
    if (n == 0) continue;
    const int64_t base = s.reserved_length(r.layer_);
    const int64_t first = base / bs;
    const int64_t last = (base + n - 1) / bs;
    for (int64_t index = first; index <= last; ++index) {
      if (index >= static_cast<int64_t>(s.blocks.size())) {
        ++needed;
        continue;
      }
      const int32_t b = s.blocks[static_cast<size_t>(index)];
      auto it = std::find_if(planned.begin(), planned.end(), [b](const auto& p) { return p.first == b; });
      const int32_t taken = it == planned.end() ? 0 : it->second;
      if (!needs_copy(s, static_cast<int32_t>(index), taken)) continue;
      ++needed;
      if (it == planned.end()) {
        planned.emplace_back(b, 1);
      } else {
        ++it->second;
      }
    }
  }
  return needed;
}

void CacheManager::pin_range(Reservation& r, const Sequence& s, int32_t length) {
  const auto used = static_cast<size_t>((length + geometry_.block_size - 1) / geometry_.block_size);
  for (size_t j = 0; j < used; ++j) {
    const int32_t b = s.blocks[j];
    ++pins_[b];
    r.block_ids_.push_back(b);
    if (fill_[b] != Fill::kReady) {
      const bool own = std::any_of(r.copies_.begin(), r.copies_.end(), [b](const auto& c) { return c.dst == b; });
      if (!own) r.awaited_.push_back(b);
    }
  }
  r.lengths_.push_back(length);
  r.block_indptr_.push_back(static_cast<int32_t>(r.block_ids_.size()));
}

// Under mu_: the request's sequences into seqs_ (the caller's tenant's only),
// then what their lengths must allow: expected lengths, --max-sequence-tokens,
// and no more query rows than tokens.
Status CacheManager::check_sequences(const Reservation& r, const ReserveRequest& request) {
  const int32_t layer = r.layer_;
  seqs_.clear();
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < request.ids.size(); ++i) {
    Sequence* s = find(request.ids[i], request.tenant);
    if (s == nullptr) {
      return request.scalar_fields ? NotFound("sequence_id: no sequence {}", request.ids[i])
                                   : NotFound("sequence_ids[{}]: no sequence {}", i, request.ids[i]);
    }
    s->last_used = now;
    seqs_.push_back(s);
  }
  for (size_t i = 0; i < request.expected_lengths.size(); ++i) {
    const int32_t have = seqs_[i]->reserved_length(layer);
    if (have != request.expected_lengths[i]) {
      const std::string field =
          request.scalar_fields ? "expected_length" : fmt::format("expected_lengths[{}]", i);
      return Status(StatusCode::kFailedPrecondition,
                    fmt::format("{}: expected sequence {} to hold {} tokens in layer {}, received a sequence holding {}",
                                field, request.ids[i], request.expected_lengths[i], layer, have));
    }
  }
  for (size_t i = 0; i < request.ids.size() && max_sequence_tokens_ > 0; ++i) {
    const int64_t after = seqs_[i]->reserved_length(layer) + request.tokens_of(i);
    if (after > max_sequence_tokens_) {
      return ResourceExhausted("sequence {}: expected at most {} tokens in a layer (--max-sequence-tokens), the "
                               "append would make {}", request.ids[i], max_sequence_tokens_, after);
    }
  }
  for (size_t i = 0; i < request.query_rows.size(); ++i) {
    const int64_t after = seqs_[i]->reserved_length(layer) + request.tokens_of(i);
    const int32_t rows = request.query_rows[i];
    if (rows > after && rows > 1) {
      return InvalidArgument("q_lengths[{}]: expected at most the {} tokens sequence {} holds in layer {}{}, "
                             "received {}",
                             i, after, request.ids[i], layer, request.tokens_of(i) > 0 ? " after the append" : "",
                             rows);
    }
  }
  return Status::Ok();
}

// Under mu_: whether `needed` new blocks fit --max-request-blocks, the
// tenant's quota and the free list.
Status CacheManager::check_blocks(const ReserveRequest& request, int64_t needed) {
  if (max_request_blocks_ > 0 && !request.whole_sequence && needed > max_request_blocks_) {
    return ResourceExhausted("request: expected at most {} new blocks per request (--max-request-blocks), needs {}",
                             max_request_blocks_, needed);
  }
  if (const TenantLimits* l = limits_of(request.tenant); l != nullptr && l->max_blocks > 0 && needed > 0) {
    const int64_t held = usage_of(request.tenant).blocks;
    if (held + needed > l->max_blocks) {
      return ResourceExhausted("tenant '{}': expected at most {} blocks (its max_blocks quota), it holds {} and "
                               "the request needs {} more",
                               l->name, l->max_blocks, held, needed);
    }
  }
  if (needed > static_cast<int64_t>(free_list_.size())) {
    // The tenant's quota allowed it, so the rest of the pool is held, maybe by
    // other tenants: quotas may add up to more than the cache.
    return ResourceExhausted("cache: expected a request needing at most the {} free blocks of {}, received one "
                             "needing {} (the rest are held; tenants' quotas may add up to more than the cache)",
                             free_list_.size(), geometry_.num_blocks, needed);
  }
  return Status::Ok();
}

// Under mu_, once everything was checked: the new blocks, the copy-on-write
// copies and the slots of seqs_' new tokens, their pending lengths, and pins
// on everything they will read; one more part of `r`.
void CacheManager::claim(Reservation& r, const ReserveRequest& request) {
  const int32_t layer = r.layer_;
  const int32_t bs = geometry_.block_size;
  Reservation::Part part;
  part.first_sequence = r.batch();
  part.first_slot = static_cast<int32_t>(r.slots_.size());
  for (size_t i = 0; i < seqs_.size(); ++i) {
    Sequence& s = *seqs_[i];
    const int32_t n = request.tokens_of(i);
    const int32_t base = s.reserved_length(layer);
    for (int32_t pos = base; pos < base + n; ++pos) {
      const int32_t index = pos / bs;
      if (index == static_cast<int32_t>(s.blocks.size())) {
        // Published at once: another layer appending at the same position
        // then writes its own part of this block instead of allocating another.
        s.blocks.push_back(allocate_block(request.tenant));
      } else if (needs_copy(s, index, 0)) {
        // Published at once too, marked as filling: whoever reads or writes it
        // before the copy is done waits for it (finish).
        const int32_t src = s.blocks[static_cast<size_t>(index)];
        const int32_t dst = allocate_block(request.tenant);
        fill_[dst] = Fill::kFilling;
        ++pins_[src];
        --shares_[src];  // never reaches free: pinned until the copy is done
        s.blocks[static_cast<size_t>(index)] = dst;
        r.copies_.push_back({src, dst, request.ids[i], index, false});
      }
      if (index == s.copy_if_pinned) s.copy_if_pinned = -1;  // copied, or written with no pin left
      r.slots_.push_back(flat_slot(s.blocks[static_cast<size_t>(index)], pos % bs, bs));
    }
    if (n > 0) {
      s.pending[layer] = base + n;
      r.growth_.push_back({request.ids[i], base + n});
    }
    pin_range(r, s, base + n);
  }
  part.end_sequence = r.batch();
  part.end_slot = static_cast<int32_t>(r.slots_.size());
  r.parts_.push_back(part);
}

Status CacheManager::reserve(Reservation& r, const ReserveRequest& request) {
  assert(r.owner_ == this);
  assert(request.expected_lengths.empty() || request.expected_lengths.size() == request.ids.size());
  for (size_t i = 0; i < request.ids.size(); ++i) {
    if (request.tokens_of(i) < 0) {
      return InvalidArgument("new tokens of sequence_ids[{}]: expected >= 0, received {}", i, request.tokens_of(i));
    }
    assert(request.tokens_of(i) == 0 || r.writer_.owns_lock());
  }
  std::lock_guard lock(mu_);
  PAGODA_RETURN_IF_ERROR(check_sequences(r, request));
  StatusOr<int64_t> needed = blocks_needed(r, seqs_, request);
  PAGODA_RETURN_IF_ERROR(needed.status());
  PAGODA_RETURN_IF_ERROR(check_blocks(request, *needed));
  claim(r, request);
  return Status::Ok();
}

Status CacheManager::make_copies(Reservation& r, BackendStream& stream) {
  assert(r.owner_ == this && !r.committed_);
  // The sources stay pinned until done.
  Status status;
  bool made = false;
  for (Reservation::Copy& c : r.copies_) {
    if (c.done) continue;  // made by an earlier call
    status = stream.copy_block(c.src, c.dst);
    if (!status.ok()) break;
    c.done = true;
    made = true;
  }
  if (made) {
    std::lock_guard lock(mu_);
    for (Reservation::Copy& c : r.copies_) {
      if (!c.done || c.src < 0) continue;
      fill_[c.dst] = Fill::kReady;
      unpin(c.src);
      c.src = -1;  // unpinned: release() leaves it alone
    }
    filled_.notify_all();
  }
  return status;
}

Status CacheManager::finish(Reservation& r, BackendStream& stream, std::span<const KvSource> sources) {
  assert(r.owner_ == this && !r.committed_);
  assert(sources.size() >= r.parts_.size() || r.slots_.empty());
  // 1. This reservation's copies (those make_copies has not made yet).
  PAGODA_RETURN_IF_ERROR(make_copies(r, stream));

  // 2. Copies other reservations are making into blocks this one uses. They
  // never wait for anything themselves, so this cannot deadlock.
  if (!r.awaited_.empty()) {
    std::unique_lock lock(mu_);
    filled_.wait(lock, [&] {
      return std::none_of(r.awaited_.begin(), r.awaited_.end(), [&](int32_t b) { return fill_[b] == Fill::kFilling; });
    });
    for (int32_t b : r.awaited_) {
      if (fill_[b] == Fill::kFailed) return Internal("cache: the copy-on-write copy into block {} failed", b);
    }
  }

  // 3. The new rows, into the slots the reservation owns.
  if (!r.slots_.empty()) {
    thread_local std::vector<KvWrite> writes;
    writes.clear();
    int64_t saturated = 0;
    for (size_t p = 0; p < r.parts_.size(); ++p) {
      const Reservation::Part& part = r.parts_[p];
      if (part.end_slot == part.first_slot) continue;
      if (sources[p].raw) {
        const std::span<const int64_t> slots(r.slots_.data() + part.first_slot,
                                             static_cast<size_t>(part.end_slot - part.first_slot));
        PAGODA_RETURN_IF_ERROR(stream.write_kv_raw(r.layer_, slots, sources[p].k, sources[p].v));
        continue;
      }
      writes.push_back({r.layer_, part.end_slot - part.first_slot, r.slots_.data() + part.first_slot, sources[p].k,
                        sources[p].v, sources[p].dtype, &saturated});
    }
    if (!writes.empty()) PAGODA_RETURN_IF_ERROR(stream.write_kv(writes));
    if (saturated > 0 && saturation_observer_) saturation_observer_(r.layer_, saturated);
  }

  // 4. Commit: the lengths become visible; a sequence freed meanwhile is gone.
  {
    std::lock_guard lock(mu_);
    for (const Reservation::Growth& g : r.growth_) {
      if (Sequence* s = find(g.id)) s->lengths[r.layer_] = g.length;
    }
    for (const Reservation::Growth& g : r.growth_) {
      if (Sequence* s = find(g.id)) s->pending[r.layer_] = -1;
    }
    r.committed_ = true;
  }
  if (r.writer_.owns_lock()) r.writer_.unlock();
  return Status::Ok();
}

void CacheManager::pin_copy(const Reservation& from, int32_t index, Reservation& r) {
  r.release();
  r.owner_ = this;
  r.layer_ = from.layer_;
  std::lock_guard lock(mu_);
  const int32_t first = from.block_indptr_[static_cast<size_t>(index)];
  const int32_t end = from.block_indptr_[static_cast<size_t>(index) + 1];
  for (int32_t j = first; j < end; ++j) {
    const int32_t b = from.block_ids_[static_cast<size_t>(j)];
    ++pins_[b];
    r.block_ids_.push_back(b);
  }
  r.lengths_.push_back(from.lengths_[static_cast<size_t>(index)]);
  r.block_indptr_.push_back(static_cast<int32_t>(r.block_ids_.size()));
  r.parts_.push_back({0, 1, 0, 0});
  r.committed_ = true;  // nothing to roll back
}

void CacheManager::trim_tail(Sequence& s) {
  int32_t tokens = 0;
  for (int32_t l = 0; l < geometry_.num_layers; ++l) tokens = std::max(tokens, s.reserved_length(l));
  const auto keep = static_cast<size_t>((tokens + geometry_.block_size - 1) / geometry_.block_size);
  // Blocks a fork took meanwhile (more than one share) stay where they are.
  while (s.blocks.size() > keep && shares_[s.blocks.back()] == 1) {
    unshare(s.blocks.back());
    s.blocks.pop_back();
  }
}

void CacheManager::rollback(Reservation& r) {
  for (const Reservation::Growth& g : r.growth_) {
    if (Sequence* s = find(g.id)) s->pending[r.layer_] = -1;
  }
  for (Reservation::Copy& c : r.copies_) {
    if (c.src < 0) continue;  // done: the copy is a faithful block, it stays
    // Not done: the table goes back to the source block.
    Sequence* s = find(c.id);
    if (s != nullptr && s->blocks[static_cast<size_t>(c.index)] == c.dst) {
      s->blocks[static_cast<size_t>(c.index)] = c.src;
      ++shares_[c.src];
      unshare(c.dst);
    }
    fill_[c.dst] = Fill::kFailed;  // whoever waits for it fails too
    unpin(c.src);
    c.src = -1;
  }
  filled_.notify_all();
  for (const Reservation::Growth& g : r.growth_) {
    if (Sequence* s = find(g.id)) trim_tail(*s);
  }
}

int32_t CacheManager::release(Reservation& r) {
  // An appending reservation changed occupancy (committed or rolled back); a
  // reading one only when its unpins return blocks a free left behind.
  ChangeNotice notice(*this);
  std::lock_guard lock(mu_);
  const size_t free_before = free_list_.size();
  if (!r.committed_) rollback(r);
  for (int32_t b : r.block_ids_) unpin(b);
  const auto freed = static_cast<int32_t>(free_list_.size() - free_before);
  if (freed > 0 || r.writer_.owns_lock()) notice.arm();
  return freed;
}

StatusOr<int32_t> CacheManager::append(BackendStream& stream, SequenceId id, int32_t layer, int32_t num_tokens,
                                       const void* k, const void* v, DType dtype,
                                       std::optional<int32_t> expected_length, TenantId tenant) {
  Reservation r;
  begin(layer, num_tokens > 0, r);
  const SequenceId ids[] = {id};
  const int32_t expected[] = {expected_length.value_or(0)};
  ReserveRequest request;
  request.tenant = tenant;
  request.ids = ids;
  request.new_tokens_each = num_tokens;
  if (expected_length) request.expected_lengths = expected;
  request.scalar_fields = true;
  PAGODA_RETURN_IF_ERROR(reserve(r, request));
  const KvSource source{k, v, dtype};
  PAGODA_RETURN_IF_ERROR(finish(r, stream, std::span<const KvSource>(&source, 1)));
  return r.lengths()[0];
}

}  // namespace pagoda
