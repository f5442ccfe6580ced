#include "cache_manager.h"

#include <algorithm>
#include <utility>

namespace pagoda {

// ---- Lease ----------------------------------------------------------------

Lease::Lease(Lease&& o) noexcept { *this = std::move(o); }

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::exchange(o.owner_, nullptr);
    layer_ = o.layer_;
    lengths_ = std::move(o.lengths_);
    block_indptr_ = std::move(o.block_indptr_);
    block_ids_ = std::move(o.block_ids_);
  }
  return *this;
}

Lease::~Lease() { release(); }

void Lease::release() {
  if (owner_ == nullptr) return;
  owner_->release_blocks(block_ids_);
  owner_ = nullptr;
}

BatchBlockTables Lease::tables() const {
  return {batch(), block_indptr_.data(), block_ids_.data(), lengths_.data()};
}

// ---- CacheManager ---------------------------------------------------------

CacheManager::CacheManager(Backend& backend) : backend_(backend), geometry_(backend.geometry()) {
  refcount_.assign(geometry_.num_blocks, 0);
  free_list_.reserve(geometry_.num_blocks);
  // Lowest ids are handed out first.
  for (int32_t b = geometry_.num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

SequenceId CacheManager::create(std::string label) {
  std::lock_guard lock(mu_);
  const SequenceId id = next_id_++;
  sequences_.emplace(id, Sequence{std::move(label), {}, std::vector<int32_t>(geometry_.num_layers, 0)});
  return id;
}

StatusOr<SequenceId> CacheManager::fork(SequenceId source) {
  std::lock_guard lock(mu_);
  auto it = sequences_.find(source);
  if (it == sequences_.end()) return NotFound("source_id: no sequence {}", source);
  Sequence copy = it->second;
  for (int32_t b : copy.blocks) ++refcount_[b];
  const SequenceId id = next_id_++;
  sequences_.emplace(id, std::move(copy));
  return id;
}

Status CacheManager::free(SequenceId id) {
  std::lock_guard lock(mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFound("sequence_id: no sequence {}", id);
  for (int32_t b : it->second.blocks) unref_block(b);
  sequences_.erase(it);
  return Status::Ok();
}

StatusOr<SequenceInfo> CacheManager::info(SequenceId id) const {
  std::lock_guard lock(mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFound("sequence_id: no sequence {}", id);
  return SequenceInfo{it->second.label, it->second.lengths, static_cast<int32_t>(it->second.blocks.size())};
}

Status CacheManager::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= geometry_.num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", geometry_.num_layers, layer);
  }
  return Status::Ok();
}

int32_t CacheManager::blocks_needed(const Sequence& s, int32_t layer, int32_t n) const {
  if (n <= 0) return 0;
  const int64_t len = s.lengths[layer];
  const int64_t first_block = len / geometry_.block_size;
  const int64_t last_block = (len + n - 1) / geometry_.block_size;
  int32_t needed = 0;
  for (int64_t b = first_block; b <= last_block; ++b) {
    if (b >= static_cast<int64_t>(s.blocks.size())) {
      ++needed;                                     // a new block
    } else if (refcount_[s.blocks[b]] > 1) {
      ++needed;                                     // copy-on-write of a shared block
    }
  }
  return needed;
}

int32_t CacheManager::allocate_block() {
  const int32_t b = free_list_.back();
  free_list_.pop_back();
  refcount_[b] = 1;
  return b;
}

void CacheManager::unref_block(int32_t block) {
  if (--refcount_[block] == 0) free_list_.push_back(block);
}

void CacheManager::release_blocks(const std::vector<int32_t>& blocks) {
  std::lock_guard lock(mu_);
  for (int32_t b : blocks) unref_block(b);
}

Status CacheManager::reserve(Sequence& s, int32_t layer, int32_t n, std::vector<int64_t>& slots) {
  const int32_t bs = geometry_.block_size;
  const int64_t len = s.lengths[layer];
  for (int64_t pos = len; pos < len + n; ++pos) {
    const auto index = static_cast<size_t>(pos / bs);
    if (index == s.blocks.size()) {
      s.blocks.push_back(allocate_block());
    } else if (refcount_[s.blocks[index]] > 1) {
      const int32_t copy = allocate_block();
      PAGODA_RETURN_IF_ERROR(backend_.copy_block(s.blocks[index], copy));
      unref_block(s.blocks[index]);
      s.blocks[index] = copy;
    }
    slots.push_back(flat_slot(s.blocks[index], static_cast<int32_t>(pos % bs), bs));
  }
  return Status::Ok();
}

StatusOr<int32_t> CacheManager::append(SequenceId id, int32_t layer, int32_t num_tokens, const void* k,
                                       const void* v, DType dtype) {
  const SequenceId ids[] = {id};
  const AppendRows rows{num_tokens, k, v, dtype};
  StatusOr<Lease> lease = acquire(layer, ids, &rows);
  if (!lease.ok()) return lease.status();
  return lease->lengths()[0];
}

StatusOr<Lease> CacheManager::acquire(int32_t layer, std::span<const SequenceId> ids, const AppendRows* rows) {
  PAGODA_RETURN_IF_ERROR(check_layer(layer));
  const int32_t n = rows ? rows->tokens_per_sequence : 0;
  if (n < 0) return InvalidArgument("tokens: expected >= 0, received {}", n);

  // Scratch reused by the calling thread: a warm Decode path allocates only the lease.
  thread_local std::vector<SequenceId> sorted;
  thread_local std::vector<Sequence*> seqs;
  sorted.assign(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), *dup) - ids.begin());
    const size_t again = static_cast<size_t>(std::find(ids.begin() + i + 1, ids.end(), *dup) - ids.begin());
    return InvalidArgument("sequence_ids[{}]: expected each id at most once, received {} again (first at [{}])",
                           again, *dup, i);
  }

  std::lock_guard lock(mu_);
  seqs.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = sequences_.find(ids[i]);
    if (it == sequences_.end()) return NotFound("sequence_ids[{}]: no sequence {}", i, ids[i]);
    seqs.push_back(&it->second);
  }

  if (n > 0) {
    // All or nothing: count every block the whole request needs before touching any.
    int64_t needed = 0;
    for (const Sequence* s : seqs) needed += blocks_needed(*s, layer, n);
    if (needed > static_cast<int64_t>(free_list_.size())) {
      return ResourceExhausted("cache: expected at most {} free blocks to be needed, request needs {}",
                               free_list_.size(), needed);
    }
    thread_local std::vector<int64_t> slots;
    slots.clear();
    for (Sequence* s : seqs) PAGODA_RETURN_IF_ERROR(reserve(*s, layer, n, slots));
    const KvWrite w{layer, static_cast<int32_t>(slots.size()), slots.data(), rows->k, rows->v, rows->dtype};
    PAGODA_RETURN_IF_ERROR(backend_.write_kv(w));
    for (Sequence* s : seqs) s->lengths[layer] += n;
  }

  thread_local std::vector<int32_t> lengths;
  lengths.clear();
  for (const Sequence* s : seqs) lengths.push_back(s->lengths[layer]);
  return make_lease(layer, seqs, lengths);
}

StatusOr<Lease> CacheManager::acquire_prefix(SequenceId id, int32_t layer, int32_t length) {
  PAGODA_RETURN_IF_ERROR(check_layer(layer));
  std::lock_guard lock(mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFound("sequence_id: no sequence {}", id);
  const int32_t current = it->second.lengths[layer];
  if (length < 0 || length > current) {
    return InvalidArgument("length: expected [0, {}], received {}", current, length);
  }
  const Sequence* seqs[] = {&it->second};
  const int32_t lengths[] = {length};
  return make_lease(layer, seqs, lengths);
}

Lease CacheManager::make_lease(int32_t layer, std::span<const Sequence* const> seqs,
                               std::span<const int32_t> lengths) {
  Lease lease;
  lease.owner_ = this;
  lease.layer_ = layer;
  lease.lengths_.assign(lengths.begin(), lengths.end());
  lease.block_indptr_.reserve(seqs.size() + 1);
  lease.block_indptr_.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    // Only the blocks that hold the leased tokens are pinned.
    const auto used = static_cast<size_t>((lengths[i] + geometry_.block_size - 1) / geometry_.block_size);
    for (size_t j = 0; j < used; ++j) {
      lease.block_ids_.push_back(seqs[i]->blocks[j]);
      ++refcount_[seqs[i]->blocks[j]];
    }
    lease.block_indptr_.push_back(static_cast<int32_t>(lease.block_ids_.size()));
  }
  return lease;
}

int32_t CacheManager::free_blocks() const {
  std::lock_guard lock(mu_);
  return static_cast<int32_t>(free_list_.size());
}

size_t CacheManager::num_sequences() const {
  std::lock_guard lock(mu_);
  return sequences_.size();
}

std::vector<int32_t> CacheManager::free_block_ids() const {
  std::lock_guard lock(mu_);
  return free_list_;
}

}  // namespace pagoda
