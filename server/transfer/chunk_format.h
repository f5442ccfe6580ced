#pragma once
// The export format (docs/design.md §13, docs/snapshot-format.md): one SequenceChunk
// header, then each layer's K/V bytes in token order, as the cache stores
// them, in chunks of at most --max-message-bytes with an XXH3-64 checksum
// each. ExportChunks writes it from a cut; ImportAssembler checks and gathers
// it for CacheManager::import_rows. The RPCs and the snapshot share both.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "pagoda/backend.h"
#include "pagoda/v1/decode_attention.pb.h"

namespace pagoda {

// XXH3-64 (seed 0) of a chunk's data bytes.
uint64_t chunk_checksum(const void* data, size_t bytes);

// Bytes a chunk spends besides its data (tags, lengths, fields): a chunk of
// n tokens is at most n * token_kv_bytes + kChunkOverheadBytes.
inline constexpr int64_t kChunkOverheadBytes = 64;

// The chunks of one cut, in order. Not thread-safe.
class ExportChunks {
 public:
  // FAILED_PRECONDITION when from_lengths has not one entry per layer (or
  // none) or an entry is past its layer's length; RESOURCE_EXHAUSTED when one
  // token does not fit in max_message_bytes.
  static StatusOr<ExportChunks> create(const SequenceCut& cut, std::span<const int32_t> from_lengths,
                                       const Backend& backend, int64_t max_message_bytes);

  // Chunk 0.
  void header(v1::SequenceChunk* out) const;
  // The next data chunk into `out` (its bytes read through `stream`); false
  // when every token has been sent.
  StatusOr<bool> next(BackendStream& stream, v1::SequenceChunk* out);
  // Data bytes of every chunk, summed.
  int64_t total_bytes() const { return total_bytes_; }

 private:
  ExportChunks(const SequenceCut& cut, const CacheGeometry& g) : cut_(&cut), geometry_(g) {}

  const SequenceCut* cut_;
  CacheGeometry geometry_;
  std::vector<float> k_scales_;
  std::vector<float> v_scales_;
  std::vector<int32_t> from_;  // [num_layers]
  int32_t chunk_tokens_ = 1;
  int64_t total_bytes_ = 0;
  int32_t layer_ = 0;      // next chunk's layer
  int32_t position_ = 0;   // and first token
  uint32_t index_ = 1;
  std::vector<int64_t> slots_;
};

// Checks an export's chunks as they arrive against this server's geometry,
// dtype and scales and keeps their bytes; request() then describes them to
// the cache. Codes: INVALID_ARGUMENT (no header first, a chunk missing,
// reordered or duplicated, a bad size or field), DATA_LOSS (a checksum, a
// stream ending early), FAILED_PRECONDITION (geometry, dtype or scales
// differ), RESOURCE_EXHAUSTED (more tokens than the cache could ever hold).
class ImportAssembler {
 public:
  ImportAssembler(const Backend& backend, int32_t max_label_bytes, int64_t max_sequence_tokens);

  // Takes the chunk's data (the message is left without it).
  Status add(v1::SequenceChunk& chunk);
  // The stream has ended: DATA_LOSS unless every token the header announced came.
  Status finish() const;

  bool has_header() const { return has_header_; }
  const v1::SequenceHeader& header() const { return header_; }
  int64_t bytes() const { return bytes_; }
  // After finish(): the import of the gathered rows for `tenant`. Points into
  // this assembler, which must outlive its use.
  ImportRequest request(TenantId tenant);

 private:
  Status check_header(const v1::SequenceHeader& h);
  std::string expected_next() const;

  const Backend& backend_;
  const CacheGeometry geometry_;
  const int32_t max_label_bytes_;
  const int64_t max_sequence_tokens_;
  bool has_header_ = false;
  v1::SequenceHeader header_;
  std::vector<int32_t> from_;  // [num_layers]
  uint32_t next_index_ = 0;
  int32_t layer_ = 0;
  int32_t position_ = 0;
  int64_t bytes_ = 0;
  struct Piece {
    int32_t layer;
    int32_t num_tokens;
    std::string data;
  };
  std::vector<Piece> pieces_;
  std::vector<RawRows> rows_;
};

}  // namespace pagoda
