// Sequences and blocks: create, fork, free, info, and the counts that decide
// when a block returns to the pool. Reservations are in reservation.cc.
#include "cache/cache_manager.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "pagoda/geometry_rules.h"

namespace pagoda {

CacheManager::CacheManager(const CacheGeometry& geometry)
    : geometry_(geometry), writers_(new std::mutex[static_cast<size_t>(geometry.num_layers)]) {
  shares_.assign(geometry_.num_blocks, 0);
  pins_.assign(geometry_.num_blocks, 0);
  fill_.assign(geometry_.num_blocks, Fill::kReady);
  owner_.assign(geometry_.num_blocks, kDefaultTenant);
  free_list_.reserve(geometry_.num_blocks);
  // Lowest ids are handed out first.
  for (int32_t b = geometry_.num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

CacheManager::Sequence* CacheManager::find(SequenceId id) {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : &it->second;
}

CacheManager::Sequence* CacheManager::find(SequenceId id, TenantId tenant) {
  Sequence* s = find(id);
  return s != nullptr && s->tenant == tenant ? s : nullptr;
}

TenantUsage& CacheManager::usage_of(TenantId tenant) {
  if (tenant >= usage_.size()) usage_.resize(tenant + 1);
  return usage_[tenant];
}

const TenantLimits* CacheManager::limits_of(TenantId tenant) const {
  return tenant < limits_.size() ? &limits_[tenant] : nullptr;
}

void CacheManager::set_tenant_limits(TenantId tenant, TenantLimits limits) {
  std::lock_guard lock(mu_);
  if (tenant >= limits_.size()) limits_.resize(tenant + 1);
  limits_[tenant] = std::move(limits);
}

TenantUsage CacheManager::usage(TenantId tenant) const {
  std::lock_guard lock(mu_);
  return tenant < usage_.size() ? usage_[tenant] : TenantUsage{};
}

void CacheManager::for_each_tenant(
    const std::function<void(TenantId, const TenantLimits&, const TenantUsage&)>& fn) const {
  std::lock_guard lock(mu_);
  for (size_t t = 0; t < limits_.size(); ++t) {
    fn(static_cast<TenantId>(t), limits_[t], t < usage_.size() ? usage_[t] : TenantUsage{});
  }
}

TenantLimits CacheManager::limits(TenantId tenant) const {
  std::lock_guard lock(mu_);
  const TenantLimits* l = limits_of(tenant);
  return l != nullptr ? *l : TenantLimits{};
}

// Room for `adding` more sequences of `tenant`; the message names the limit,
// what is held and what was asked when more than one.
Status CacheManager::check_sequence_quota(TenantId tenant, int64_t adding) {
  const std::string asked = adding > 1 ? fmt::format(", {} more requested", adding) : std::string();
  const auto held_all = static_cast<int64_t>(sequences_.size());
  if (max_sequences_ > 0 && held_all + adding > max_sequences_) {
    return ResourceExhausted("cache: expected at most {} sequences (--max-sequences), it holds {}{}", max_sequences_,
                             held_all, asked);
  }
  const TenantLimits* l = limits_of(tenant);
  const int64_t held = usage_of(tenant).sequences;
  if (l == nullptr || l->max_sequences == 0 || held + adding <= l->max_sequences) return Status::Ok();
  return ResourceExhausted("tenant '{}': expected at most {} sequences (its max_sequences quota), it holds {}{}",
                           l->name, l->max_sequences, held, asked);
}

SequenceId CacheManager::create(std::string label) {
  ChangeNotice notice(*this);
  notice.arm();
  std::lock_guard lock(mu_);
  const SequenceId id = ids_.next();
  ++usage_of(kDefaultTenant).sequences;
  const auto layers = static_cast<size_t>(geometry_.num_layers);
  Sequence s;
  s.label = std::move(label);
  s.lengths.assign(layers, 0);
  s.pending.assign(layers, -1);
  sequences_.emplace(id, std::move(s));
  return id;
}

StatusOr<SequenceId> CacheManager::create_for(TenantId tenant, std::string label) {
  return add_sequence(tenant, std::move(label), 0);
}

StatusOr<SequenceId> CacheManager::fork(SequenceId source, TenantId tenant) {
  StatusOr<std::vector<SequenceId>> ids = fork(source, tenant, 1);
  if (!ids.ok()) return ids.status();
  return ids->front();
}

StatusOr<std::vector<SequenceId>> CacheManager::fork(SequenceId source, TenantId tenant, int32_t count) {
  assert(count >= 1 && "the rpc layer validates the count");
  ChangeNotice notice(*this);
  std::lock_guard lock(mu_);
  Sequence* s = find(source, tenant);
  if (s == nullptr) return NotFound("source_id: no sequence {}", source);
  PAGODA_RETURN_IF_ERROR(check_sequence_quota(tenant, count));
  s->last_used = std::chrono::steady_clock::now();
  // A fork shares the committed state: an append in flight on the source is
  // the source's alone (its table may already hold the block it writes into:
  // sharing it is harmless, the fork never reads past its own lengths).
  Sequence copy = *s;
  std::fill(copy.pending.begin(), copy.pending.end(), -1);
  std::vector<SequenceId> ids;
  ids.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    for (int32_t b : copy.blocks) ++shares_[b];
    const SequenceId id = ids_.next();
    ++usage_of(tenant).sequences;
    sequences_.emplace(id, copy);
    ids.push_back(id);
  }
  notice.arm();
  return ids;
}

Status CacheManager::free(SequenceId id, TenantId tenant) {
  ChangeNotice notice(*this);
  std::lock_guard lock(mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second.tenant != tenant) return NotFound("sequence_id: no sequence {}", id);
  // Blocks a reservation still pins stay allocated until it releases them; an
  // append in flight finds the sequence gone at commit and drops its lengths.
  for (int32_t b : it->second.blocks) unshare(b);
  --usage_of(tenant).sequences;
  sequences_.erase(it);
  notice.arm();
  return Status::Ok();
}

StatusOr<std::vector<int32_t>> CacheManager::truncate(SequenceId id, int32_t length, TenantId tenant) {
  if (length < 0) return InvalidArgument("length: expected >= 0, received {}", length);
  ChangeNotice notice(*this);
  // Every layer's writer token, in layer order: no append is between its
  // reservation and its commit, so no reserved slot is cut away under it.
  std::vector<std::unique_lock<std::mutex>> writers;
  writers.reserve(static_cast<size_t>(geometry_.num_layers));
  for (int32_t l = 0; l < geometry_.num_layers; ++l) writers.emplace_back(writers_[static_cast<size_t>(l)]);
  std::lock_guard lock(mu_);
  Sequence* s = find(id, tenant);
  if (s == nullptr) return NotFound("sequence_id: no sequence {}", id);
  s->last_used = std::chrono::steady_clock::now();
  int32_t longest = 0;
  for (int32_t& len : s->lengths) {
    len = std::min(len, length);
    longest = std::max(longest, len);
  }
  const int32_t bs = geometry_.block_size;
  const auto keep = static_cast<size_t>((longest + bs - 1) / bs);
  while (s->blocks.size() > keep) {
    unshare(s->blocks.back());
    s->blocks.pop_back();
  }
  if (s->copy_if_pinned >= static_cast<int32_t>(keep)) s->copy_if_pinned = -1;
  // A partly kept last block that a reservation still reads past the cut:
  // the next write into it must not land where that reservation reads.
  if (longest % bs != 0 && pins_[s->blocks.back()] > 0) s->copy_if_pinned = static_cast<int32_t>(keep) - 1;
  notice.arm();
  return s->lengths;
}

StatusOr<SequenceInfo> CacheManager::info(SequenceId id, TenantId tenant) {
  std::lock_guard lock(mu_);
  Sequence* s = find(id, tenant);
  if (s == nullptr) return NotFound("sequence_id: no sequence {}", id);
  s->last_used = std::chrono::steady_clock::now();
  return SequenceInfo{s->label, s->lengths, static_cast<int32_t>(s->blocks.size())};
}

std::vector<CacheManager::Evicted> CacheManager::evict_idle(std::chrono::steady_clock::duration ttl) {
  std::vector<Evicted> evicted;
  ChangeNotice notice(*this);
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    const auto idle = now - it->second.last_used;
    if (idle <= ttl) {
      ++it;
      continue;
    }
    evicted.push_back({it->first, it->second.label, std::chrono::duration<double>(idle).count()});
    for (int32_t b : it->second.blocks) unshare(b);
    --usage_of(it->second.tenant).sequences;
    it = sequences_.erase(it);
  }
  if (!evicted.empty()) notice.arm();
  return evicted;
}

int32_t CacheManager::allocate_block(TenantId owner) {
  assert(!free_list_.empty() && "reserve counts the blocks it needs before allocating");
  const int32_t b = free_list_.back();
  free_list_.pop_back();
  owner_[b] = owner;
  ++usage_of(owner).blocks;
  shares_[b] = 1;
  pins_[b] = 0;
  fill_[b] = Fill::kReady;
  return b;
}

void CacheManager::maybe_free(int32_t block) {
  if (shares_[block] != 0 || pins_[block] != 0) return;
  free_list_.push_back(block);
  --usage_of(owner_[block]).blocks;
}

void CacheManager::unshare(int32_t block) {
  assert(shares_[block] > 0);
  --shares_[block];
  maybe_free(block);
}

void CacheManager::unpin(int32_t block) {
  assert(pins_[block] > 0);
  --pins_[block];
  maybe_free(block);
}

int64_t CacheManager::cached_tokens(int32_t layer, std::span<const SequenceId> ids) const {
  std::lock_guard lock(mu_);
  int64_t tokens = 0;
  for (SequenceId id : ids) {
    auto it = sequences_.find(id);
    if (it != sequences_.end()) tokens += it->second.lengths[static_cast<size_t>(layer)];
  }
  return tokens;
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

std::vector<int32_t> CacheManager::block_table(SequenceId id) const {
  std::lock_guard lock(mu_);
  auto it = sequences_.find(id);
  return it == sequences_.end() ? std::vector<int32_t>{} : it->second.blocks;
}

}  // namespace pagoda
