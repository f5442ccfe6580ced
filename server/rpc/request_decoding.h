#pragma once
// Checks requests against the server's geometry using the request's own bytes
// (no copy of a tensor) and turns them into engine work. This is where every
// request field is validated but the K/V values, which admission checks in
// one pass with the cache's range (kv_values.h); the engine, the cache
// manager and the backends take what it produces as given. Every message
// names the field and the expected vs. received value.

#include <cstdint>
#include <initializer_list>

#include "engine/work.h"
#include "shm/shared_memory_registry.h"
#include "pagoda/paged_kv.h"
#include "pagoda/v1/decode_attention.pb.h"

namespace pagoda {

// A wire tensor checked against an expected shape; data points into the
// message, or into a shared-memory region (pinned by `region`).
struct TensorView {
  DType dtype = DType::kFloat32;
  const void* data = nullptr;
  int64_t rows = 0;  // shape[0]
  RegionPin region;  // set when the bytes lie in shared memory
};

// Where a request's tensors may lie besides their data fields: the caller's
// shared-memory regions (null: none; a tensor naming one is refused).
struct TensorSources {
  TenantId tenant = kDefaultTenant;
  const SharedMemoryRegistry* shm = nullptr;
};

// Checks dtype (not unspecified, known), rank, every dimension of `shape` (a
// value < 0 accepts any size >= 0 there) and the byte count, of `data` or of
// the shared-memory range `shm` names (one of the two).
StatusOr<TensorView> check_tensor(const char* field, const v1::Tensor& t, std::initializer_list<int64_t> shape,
                                  const TensorSources& sources = {});

// INVALID_ARGUMENT naming the first non-finite element of `t` (rows x heads x
// head_dim values), with its row, head and element (the sinks).
Status check_finite(const char* field, const TensorView& t, int32_t heads, int32_t head_dim);

// Validates a DecodeRequest and fills `work`'s inputs. `max_batch` bounds
// sequence_ids. The outputs are pointed at the response by decode_response.h.
Status decode_request(const v1::DecodeRequest& request, const CacheGeometry& g, int32_t max_batch,
                      DecodeWork& work, const TensorSources& sources = {});

// Validates an AppendKVRequest and fills `work`.
Status decode_request(const v1::AppendKVRequest& request, const CacheGeometry& g, AppendWork& work,
                      const TensorSources& sources = {});

}  // namespace pagoda
