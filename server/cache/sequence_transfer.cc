// Sequences leaving and entering the cache whole (docs/design.md §13): the pinned cut
// an export or a snapshot reads, and the all-or-nothing append of stored rows
// an import or a restore makes.
#include <algorithm>
#include <cassert>

#include "cache/cache_manager.h"
#include "pagoda/geometry_rules.h"

namespace pagoda {

void SequenceCut::release() {
  if (owner_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  blocks.clear();
}

void SequenceCut::slots(int32_t first, int32_t end, std::vector<int64_t>& out) const {
  out.clear();
  for (int32_t t = first; t < end; ++t) {
    out.push_back(flat_slot(blocks[static_cast<size_t>(t / block_size)], t % block_size, block_size));
  }
}

void CacheManager::release(SequenceCut& cut) {
  std::lock_guard lock(mu_);
  for (int32_t b : cut.blocks) unpin(b);
}

Status CacheManager::cut(SequenceId id, std::optional<TenantId> tenant, SequenceCut& out) {
  out.release();
  std::unique_lock lock(mu_);
  for (;;) {
    Sequence* s = tenant ? find(id, *tenant) : find(id);
    if (s == nullptr) return NotFound("sequence_id: no sequence {}", id);
    s->last_used = std::chrono::steady_clock::now();
    const int32_t longest = *std::max_element(s->lengths.begin(), s->lengths.end());
    const auto used = static_cast<size_t>((longest + geometry_.block_size - 1) / geometry_.block_size);
    out.id = id;
    out.tenant = s->tenant;
    out.label = s->label;
    out.lengths = s->lengths;
    out.block_size = geometry_.block_size;
    out.blocks.assign(s->blocks.begin(), s->blocks.begin() + static_cast<std::ptrdiff_t>(used));
    for (int32_t b : out.blocks) ++pins_[b];
    out.owner_ = this;
    // A copy-on-write copy in flight into a block of the table: its bytes are
    // there once it is done.
    filled_.wait(lock, [&] {
      return std::none_of(out.blocks.begin(), out.blocks.end(), [&](int32_t b) { return fill_[b] == Fill::kFilling; });
    });
    if (std::none_of(out.blocks.begin(), out.blocks.end(), [&](int32_t b) { return fill_[b] == Fill::kFailed; })) {
      return Status::Ok();
    }
    // The copy failed and its append rolled back to the source block: cut again.
    for (int32_t b : out.blocks) unpin(b);
    out.blocks.clear();
    out.owner_ = nullptr;
  }
}

StatusOr<SequenceId> CacheManager::add_sequence(TenantId tenant, std::string label, SequenceId id) {
  ChangeNotice notice(*this);
  std::lock_guard lock(mu_);
  PAGODA_RETURN_IF_ERROR(check_sequence_quota(tenant));
  if (id == 0) {
    id = ids_.next();
  } else if (sequences_.count(id) != 0) {
    return Status(StatusCode::kAlreadyExists, fmt::format("sequence_id: sequence {} exists already", id));
  }
  ++usage_of(tenant).sequences;
  const auto layers = static_cast<size_t>(geometry_.num_layers);
  Sequence s;
  s.tenant = tenant;
  s.label = std::move(label);
  s.lengths.assign(layers, 0);
  s.pending.assign(layers, -1);
  sequences_.emplace(id, std::move(s));
  notice.arm();
  return id;
}

StatusOr<SequenceId> CacheManager::import_rows(BackendStream& stream, const ImportRequest& request,
                                               std::vector<int32_t>* lengths) {
  const auto layers = static_cast<size_t>(geometry_.num_layers);
  assert(request.into == 0 || request.expected_lengths.size() == layers);
  for (const RawRows& rows : request.rows) {
    PAGODA_RETURN_IF_ERROR(check_layer(rows.layer, geometry_.num_layers));
  }
  SequenceId id = request.into;
  if (id == 0) {
    StatusOr<SequenceId> created = add_sequence(request.tenant, request.label, request.restore_id);
    PAGODA_RETURN_IF_ERROR(created.status());
    id = *created;
  }
  // Every layer's reservation is made (its writer token held, layers in
  // order as truncate takes them) before any commits, so a refusal in any
  // layer rolls all of them back.
  std::vector<Reservation> reservations(layers);
  std::vector<std::vector<KvSource>> sources(layers);
  auto fail = [&](Status status) -> Status {
    for (Reservation& r : reservations) r.release();
    if (request.into == 0) (void)free(id, request.tenant);
    return status;
  };
  const SequenceId ids[] = {id};
  size_t next = 0;
  for (size_t l = 0; l < layers; ++l) {
    const auto layer = static_cast<int32_t>(l);
    begin(layer, true, reservations[l]);
    Status status;
    ReserveRequest reserve_request;
    reserve_request.tenant = request.tenant;
    reserve_request.ids = ids;
    reserve_request.whole_sequence = true;
    if (request.into != 0) {
      reserve_request.expected_lengths = request.expected_lengths.subspan(l, 1);
      reserve_request.scalar_fields = false;
    }
    bool reserved = false;
    for (; next < request.rows.size() && request.rows[next].layer == layer; ++next) {
      const RawRows& rows = request.rows[next];
      if (rows.num_tokens == 0) continue;
      reserve_request.new_tokens_each = rows.num_tokens;
      status = reserve(reservations[l], reserve_request);
      if (!status.ok()) return fail(status);
      sources[l].push_back({rows.k, rows.v, geometry_.dtype, true});
      reserve_request.expected_lengths = {};  // checked by the first part
      reserved = true;
    }
    if (!reserved && request.into != 0) {
      reserve_request.new_tokens_each = 0;
      status = reserve(reservations[l], reserve_request);  // the length check alone
      if (!status.ok()) return fail(status);
      sources[l].push_back({});
    }
    // Before the next layer's token: a reader of `into` on another layer may
    // wait for these copies, so they must not wait for that layer's writer.
    status = make_copies(reservations[l], stream);
    if (!status.ok()) return fail(status);
  }
  if (next != request.rows.size()) {
    return fail(InvalidArgument("rows: expected layers in order, received layer {} after layer {}",
                                request.rows[next].layer, request.rows[next - 1].layer));
  }
  for (size_t l = 0; l < layers; ++l) {
    Status status = finish(reservations[l], stream, sources[l]);
    if (!status.ok()) {
      if (request.into == 0) return fail(status);
      for (Reservation& r : reservations) r.release();
      return Internal("import into sequence {}: layers before {} committed, then: {}", id, l, status.message());
    }
    reservations[l].release();
  }
  if (lengths != nullptr) {
    std::lock_guard lock(mu_);
    if (Sequence* s = find(id)) *lengths = s->lengths;
  }
  return id;
}

std::vector<SequenceId> CacheManager::sequence_ids() const {
  std::lock_guard lock(mu_);
  std::vector<SequenceId> ids;
  ids.reserve(sequences_.size());
  for (const auto& [id, s] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

SequenceIdGenerator::State CacheManager::id_state() const {
  std::lock_guard lock(mu_);
  return ids_.state();
}

void CacheManager::restore_id_state(const SequenceIdGenerator::State& state) {
  std::lock_guard lock(mu_);
  ids_.restore(state);
}

}  // namespace pagoda
