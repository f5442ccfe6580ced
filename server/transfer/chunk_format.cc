#include "transfer/chunk_format.h"

#include <xxhash.h>

#include <algorithm>

#include <fmt/format.h>

namespace pagoda {
namespace {

v1::DType wire_dtype(DType t) { return static_cast<v1::DType>(static_cast<int>(t)); }

std::string_view wire_dtype_name(int value) {
  const auto t = static_cast<DType>(value);
  return known_dtype(t) ? dtype_name(t) : std::string_view("unknown");
}

}  // namespace

uint64_t chunk_checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

StatusOr<ExportChunks> ExportChunks::create(const SequenceCut& cut, std::span<const int32_t> from_lengths,
                                            const Backend& backend, int64_t max_message_bytes) {
  const CacheGeometry& g = backend.geometry();
  ExportChunks chunks(cut, g);
  const auto layers = static_cast<size_t>(g.num_layers);
  if (!from_lengths.empty() && from_lengths.size() != layers) {
    return FailedPrecondition("from_lengths: expected {} entries (one per layer) or none, received {}", layers,
                              from_lengths.size());
  }
  chunks.from_.assign(layers, 0);
  for (size_t l = 0; l < from_lengths.size(); ++l) {
    if (from_lengths[l] < 0 || from_lengths[l] > cut.lengths[l]) {
      return FailedPrecondition("from_lengths[{}]: expected 0 to the {} tokens sequence {} holds in layer {}, "
                                "received {}", l, cut.lengths[l], cut.id, l, from_lengths[l]);
    }
    chunks.from_[l] = from_lengths[l];
  }
  const int64_t token_bytes = g.token_kv_bytes();
  if (token_bytes + kChunkOverheadBytes > max_message_bytes) {
    return ResourceExhausted("export: expected one token ({} bytes) to fit in --max-message-bytes {}", token_bytes,
                             max_message_bytes);
  }
  chunks.chunk_tokens_ = static_cast<int32_t>(
      std::min<int64_t>((max_message_bytes - kChunkOverheadBytes) / token_bytes, int64_t{1} << 20));
  for (size_t l = 0; l < layers; ++l) {
    chunks.total_bytes_ += (cut.lengths[l] - chunks.from_[l]) * token_bytes;
    chunks.k_scales_.push_back(backend.kv_scale(static_cast<int32_t>(l)).k);
    chunks.v_scales_.push_back(backend.kv_scale(static_cast<int32_t>(l)).v);
  }
  chunks.position_ = chunks.from_[0];
  return chunks;
}

void ExportChunks::header(v1::SequenceChunk* out) const {
  out->Clear();
  out->set_index(0);
  v1::SequenceHeader* h = out->mutable_header();
  h->set_num_layers(geometry_.num_layers);
  h->set_num_kv_heads(geometry_.num_kv_heads);
  h->set_head_dim(geometry_.head_dim);
  h->set_v_head_dim(geometry_.v_dim());
  h->set_cache_dtype(wire_dtype(geometry_.dtype));
  h->mutable_k_scales()->Add(k_scales_.begin(), k_scales_.end());
  h->mutable_v_scales()->Add(v_scales_.begin(), v_scales_.end());
  h->mutable_layer_lengths()->Add(cut_->lengths.begin(), cut_->lengths.end());
  h->mutable_from_lengths()->Add(from_.begin(), from_.end());
  h->set_label(cut_->label);
  h->set_source_sequence_id(cut_->id);
  h->set_source_block_size(geometry_.block_size);
  h->set_total_bytes(total_bytes_);
}

StatusOr<bool> ExportChunks::next(BackendStream& stream, v1::SequenceChunk* out) {
  while (layer_ < geometry_.num_layers && position_ >= cut_->lengths[static_cast<size_t>(layer_)]) {
    if (++layer_ < geometry_.num_layers) position_ = from_[static_cast<size_t>(layer_)];
  }
  if (layer_ >= geometry_.num_layers) return false;
  const int32_t end = std::min(position_ + chunk_tokens_, cut_->lengths[static_cast<size_t>(layer_)]);
  const int32_t n = end - position_;
  // K rows, then V rows (none when V is K's prefix).
  const int parts = geometry_.latent() ? 1 : 2;
  const size_t half = static_cast<size_t>(n) * static_cast<size_t>(geometry_.token_kv_bytes() / parts);
  // Fields set one by one rather than Clear(): a reused message keeps its data
  // string, so a chunk of the same size is not zero-filled before read_kv
  // overwrites it.
  out->clear_header();
  out->set_index(index_++);
  out->set_layer(layer_);
  out->set_first_token(position_);
  out->set_num_tokens(n);
  std::string* data = out->mutable_data();
  data->resize(parts * half);
  cut_->slots(position_, end, slots_);
  PAGODA_RETURN_IF_ERROR(stream.read_kv(layer_, slots_, data->data(), parts == 2 ? data->data() + half : nullptr));
  out->set_checksum(chunk_checksum(data->data(), data->size()));
  position_ = end;
  return true;
}

ImportAssembler::ImportAssembler(const Backend& backend, int32_t max_label_bytes, int64_t max_sequence_tokens)
    : backend_(backend),
      geometry_(backend.geometry()),
      max_label_bytes_(max_label_bytes),
      max_sequence_tokens_(max_sequence_tokens) {}

Status ImportAssembler::check_header(const v1::SequenceHeader& h) {
  const CacheGeometry& g = geometry_;
  if (h.num_layers() != g.num_layers) {
    return FailedPrecondition("header.num_layers: expected {} (this server's --layers), received {}", g.num_layers,
                              h.num_layers());
  }
  if (h.num_kv_heads() != g.num_kv_heads) {
    return FailedPrecondition("header.num_kv_heads: expected {} (this server's --kv-heads), received {}",
                              g.num_kv_heads, h.num_kv_heads());
  }
  if (h.head_dim() != g.head_dim) {
    return FailedPrecondition("header.head_dim: expected {} (this server's --head-dim), received {}", g.head_dim,
                              h.head_dim());
  }
  // 0: an exporter older than v_head_dim, whose V was always head_dim wide.
  const int32_t v_head_dim = h.v_head_dim() != 0 ? h.v_head_dim() : h.head_dim();
  if (v_head_dim != g.v_dim()) {
    return FailedPrecondition("header.v_head_dim: expected {} (this server's --v-head-dim), received {}", g.v_dim(),
                              v_head_dim);
  }
  if (static_cast<int>(h.cache_dtype()) != static_cast<int>(g.dtype)) {
    return FailedPrecondition("header.cache_dtype: expected {} (this server's --cache-dtype), received {}",
                              dtype_name(g.dtype), wire_dtype_name(h.cache_dtype()));
  }
  const auto layers = static_cast<size_t>(g.num_layers);
  if (static_cast<size_t>(h.k_scales_size()) != layers || static_cast<size_t>(h.v_scales_size()) != layers) {
    return FailedPrecondition("header.k_scales, header.v_scales: expected {} entries each, received {} and {}",
                              layers, h.k_scales_size(), h.v_scales_size());
  }
  for (size_t l = 0; l < layers; ++l) {
    const KvScale mine = backend_.kv_scale(static_cast<int32_t>(l));
    const auto i = static_cast<int>(l);
    if (h.k_scales(i) != mine.k) {
      return FailedPrecondition("header.k_scales[{}]: expected {} (this server's --kv-scales), received {}", l,
                                mine.k, h.k_scales(i));
    }
    if (h.v_scales(i) != mine.v) {
      return FailedPrecondition("header.v_scales[{}]: expected {} (this server's --kv-scales), received {}", l,
                                mine.v, h.v_scales(i));
    }
  }
  if (static_cast<size_t>(h.layer_lengths_size()) != layers) {
    return InvalidArgument("header.layer_lengths: expected {} entries, received {}", layers, h.layer_lengths_size());
  }
  if (h.from_lengths_size() != 0 && static_cast<size_t>(h.from_lengths_size()) != layers) {
    return InvalidArgument("header.from_lengths: expected {} entries or none, received {}", layers,
                           h.from_lengths_size());
  }
  from_.assign(layers, 0);
  int32_t longest = 0;
  for (size_t l = 0; l < layers; ++l) {
    const auto i = static_cast<int>(l);
    const int32_t len = h.layer_lengths(i);
    const int32_t from = h.from_lengths_size() != 0 ? h.from_lengths(i) : 0;
    if (from < 0 || len < from) {
      return InvalidArgument("header.from_lengths[{}]: expected 0 to layer_lengths[{}] = {}, received {}", l, l, len,
                             from);
    }
    from_[l] = from;
    longest = std::max(longest, len);
  }
  if (h.into_sequence_id() == 0 && std::any_of(from_.begin(), from_.end(), [](int32_t f) { return f != 0; })) {
    return InvalidArgument("header.into_sequence_id: expected the sequence holding from_lengths (a later stage), "
                           "received 0");
  }
  if (static_cast<int64_t>(h.label().size()) > max_label_bytes_) {
    return InvalidArgument("header.label: expected at most {} bytes (--max-label-bytes), received {}",
                           max_label_bytes_, h.label().size());
  }
  if (max_sequence_tokens_ > 0 && longest > max_sequence_tokens_) {
    return ResourceExhausted("header.layer_lengths: expected at most {} tokens in a layer (--max-sequence-tokens), "
                             "received {}", max_sequence_tokens_, longest);
  }
  const int64_t blocks = (static_cast<int64_t>(longest) + g.block_size - 1) / g.block_size;
  if (blocks > g.num_blocks) {
    return ResourceExhausted("header.layer_lengths: expected at most the {} blocks of this cache to be needed, "
                             "{} tokens need {}", g.num_blocks, longest, blocks);
  }
  return Status::Ok();
}

std::string ImportAssembler::expected_next() const {
  if (layer_ >= geometry_.num_layers) return "no chunk (every token has come)";
  return fmt::format("layer {} tokens from {} (chunk {})", layer_, position_, next_index_);
}

Status ImportAssembler::add(v1::SequenceChunk& chunk) {
  if (!has_header_) {
    if (!chunk.has_header() || chunk.index() != 0) {
      return InvalidArgument("chunk {}: expected the header as chunk 0 first, received {}", chunk.index(),
                             chunk.has_header() ? "a header with another index" : "K/V bytes");
    }
    PAGODA_RETURN_IF_ERROR(check_header(chunk.header()));
    header_ = chunk.header();
    has_header_ = true;
    next_index_ = 1;
    position_ = from_[0];
    layer_ = 0;
    while (layer_ < geometry_.num_layers && position_ >= header_.layer_lengths(layer_)) {
      if (++layer_ < geometry_.num_layers) position_ = from_[static_cast<size_t>(layer_)];
    }
    return Status::Ok();
  }
  if (chunk.index() != next_index_) {
    return InvalidArgument("chunk index: expected {} ({}), received {} ({})", next_index_,
                           chunk.index() > next_index_ ? "a chunk is missing" : "a chunk is repeated or reordered",
                           chunk.index(), expected_next());
  }
  if (chunk.has_header()) return InvalidArgument("chunk {}: expected K/V bytes, received a second header", chunk.index());
  if (layer_ >= geometry_.num_layers) {
    return InvalidArgument("chunk {}: expected the end of the stream, every token has come", chunk.index());
  }
  if (chunk.layer() != layer_ || chunk.first_token() != position_) {
    return InvalidArgument("chunk {}: expected {}, received layer {} tokens from {}", chunk.index(), expected_next(),
                           chunk.layer(), chunk.first_token());
  }
  const int32_t left = header_.layer_lengths(layer_) - position_;
  if (chunk.num_tokens() <= 0 || chunk.num_tokens() > left) {
    return InvalidArgument("chunk {}: num_tokens: expected 1 to the {} tokens left in layer {}, received {}",
                           chunk.index(), left, layer_, chunk.num_tokens());
  }
  const int64_t want = static_cast<int64_t>(chunk.num_tokens()) * geometry_.token_kv_bytes();
  if (static_cast<int64_t>(chunk.data().size()) != want) {
    return InvalidArgument("chunk {}: data: expected {} bytes ({} tokens), received {}", chunk.index(), want,
                           chunk.num_tokens(), chunk.data().size());
  }
  const uint64_t sum = chunk_checksum(chunk.data().data(), chunk.data().size());
  if (sum != chunk.checksum()) {
    return DataLoss("chunk {}: checksum: expected {:016x} (XXH3-64 of its data), received {:016x}", chunk.index(),
                    sum, chunk.checksum());
  }
  bytes_ += want;
  pieces_.push_back({layer_, chunk.num_tokens(), std::move(*chunk.mutable_data())});
  ++next_index_;
  position_ += chunk.num_tokens();
  while (layer_ < geometry_.num_layers && position_ >= header_.layer_lengths(layer_)) {
    if (++layer_ < geometry_.num_layers) position_ = from_[static_cast<size_t>(layer_)];
  }
  return Status::Ok();
}

Status ImportAssembler::finish() const {
  if (!has_header_) return InvalidArgument("stream: expected a header chunk first, received no chunk");
  if (layer_ < geometry_.num_layers) {
    return DataLoss("stream: ended after chunk {}; expected {}", next_index_ - 1, expected_next());
  }
  return Status::Ok();
}

ImportRequest ImportAssembler::request(TenantId tenant) {
  rows_.clear();
  const bool latent = geometry_.latent();  // K rows alone: V is their prefix
  for (const Piece& p : pieces_) {
    const size_t half = p.data.size() / 2;
    rows_.push_back({p.layer, p.num_tokens, p.data.data(), latent ? nullptr : p.data.data() + half});
  }
  ImportRequest r;
  r.tenant = tenant;
  r.label = header_.label();
  r.into = header_.into_sequence_id();
  if (r.into != 0) r.expected_lengths = from_;
  r.rows = rows_;
  return r;
}

}  // namespace pagoda
