// The CPU backend's pools, factory and block-level operations (writes, copies,
// poisoning, the bandwidth baseline). The decode launch is in cpu_launch.cc.
#include "cpu/cpu_backend.h"

#include <sys/mman.h>

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include "pagoda/host_convert.h"
#include "cpu/cpu_backend_impl.h"
#include "cpu/decode_cpu.h"
#include "pagoda/geometry_rules.h"

namespace pagoda {
namespace cpu {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "cpu";
}

}  // namespace

HostBuffer aligned_buffer(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, rounded ? rounded : align));
  if (p != nullptr && align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
  return HostBuffer(p);
}

CpuBackend::CpuBackend(const CacheGeometry& g, int32_t threads, std::vector<KvScale> scales, HostBuffer k,
                       HostBuffer v)
    : geometry_(g), threads_(threads), scales_(std::move(scales)), arena_(threads), k_(std::move(k)), v_(std::move(v)),
      nan_free_(g),
      device_name_(cpu_model_name() + " (" + kernel_target_name(g) + ", " + std::to_string(threads) + " threads)") {}

StatusOr<std::unique_ptr<BackendStream>> CpuBackend::open_stream() {
  return std::unique_ptr<BackendStream>(new CpuStream(*this));
}

Status CpuStream::write_kv(std::span<const KvWrite> writes) {
  const CacheGeometry& g = backend_.geometry();
  const int64_t row = g.head_dim;
  const bool with_v = !g.latent();  // latent attention: V is K's prefix, written with it
  // An e4m3 cache's marks learn of each slot written (a NaN input's code among them or not).
  NanFreeSlots& nan_free = backend_.nan_free_slots();
  for (const KvWrite& w : writes) {
    const size_t in_size = dtype_size(w.dtype);
    const KvScale scale = backend_.kv_scale(w.layer);
    const bool plain = scale.k == 1.f && scale.v == 1.f && !is_fp8(g.dtype);
    int64_t saturated = 0;
    for (int32_t i = 0; i < w.num_tokens; ++i) {
      assert(w.slots[i] >= 0 && w.slots[i] < static_cast<int64_t>(g.num_blocks) * g.block_size);
      const auto block = static_cast<int32_t>(w.slots[i] / g.block_size);
      const auto slot = static_cast<int32_t>(w.slots[i] % g.block_size);
      bool nan = false;
      // One head's row in, converted into the cache at dst.
      const auto store = [&](const void* in, int64_t at, float s, std::byte* dst) {
        const std::byte* src = static_cast<const std::byte*>(in) + at * in_size;
        if (plain) {
          convert(src, w.dtype, dst, g.dtype, row);
        } else {
          saturated += store_scaled(src, w.dtype, s, dst, g.dtype, row);
        }
        if (nan_free.tracking() && !nan) nan = first_non_finite(dst, g.dtype, row) >= 0;
      };
      for (int32_t h = 0; h < g.num_kv_heads; ++h) {
        const int64_t at = (static_cast<int64_t>(i) * g.num_kv_heads + h) * row;
        store(w.k, at, scale.k, backend_.k_at(w.layer, block, h, slot));
        if (with_v) store(w.v, at, scale.v, backend_.v_at(w.layer, block, h, slot));
      }
      nan_free.wrote(w.layer, block, slot, nan);
    }
    if (w.saturated != nullptr) *w.saturated += saturated;
  }
  return Status::Ok();
}

Status CpuStream::read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) {
  const CacheGeometry& g = backend_.geometry();
  const size_t row = static_cast<size_t>(g.head_dim) * dtype_size(g.dtype);
  const bool with_v = !g.latent();
  auto* k_out = static_cast<std::byte*>(k);
  auto* v_out = static_cast<std::byte*>(v);
  for (size_t i = 0; i < slots.size(); ++i) {
    assert(slots[i] >= 0 && slots[i] < static_cast<int64_t>(g.num_blocks) * g.block_size);
    const auto block = static_cast<int32_t>(slots[i] / g.block_size);
    const auto slot = static_cast<int32_t>(slots[i] % g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const size_t at = (i * static_cast<size_t>(g.num_kv_heads) + static_cast<size_t>(h)) * row;
      std::memcpy(k_out + at, backend_.k_at(layer, block, h, slot), row);
      if (with_v) std::memcpy(v_out + at, backend_.v_at(layer, block, h, slot), row);
    }
  }
  return Status::Ok();
}

Status CpuStream::write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void* v) {
  const CacheGeometry& g = backend_.geometry();
  const size_t row = static_cast<size_t>(g.head_dim) * dtype_size(g.dtype);
  const bool with_v = !g.latent();
  const auto* k_in = static_cast<const std::byte*>(k);
  const auto* v_in = static_cast<const std::byte*>(v);
  NanFreeSlots& nan_free = backend_.nan_free_slots();  // raw bytes (an import) may hold NaN codes
  for (size_t i = 0; i < slots.size(); ++i) {
    assert(slots[i] >= 0 && slots[i] < static_cast<int64_t>(g.num_blocks) * g.block_size);
    const auto block = static_cast<int32_t>(slots[i] / g.block_size);
    const auto slot = static_cast<int32_t>(slots[i] % g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const size_t at = (i * static_cast<size_t>(g.num_kv_heads) + static_cast<size_t>(h)) * row;
      std::memcpy(backend_.k_at(layer, block, h, slot), k_in + at, row);
      if (with_v) std::memcpy(backend_.v_at(layer, block, h, slot), v_in + at, row);
    }
    // The token's rows of every head lie together in the input: one scan each for K and V.
    const size_t token = i * static_cast<size_t>(g.num_kv_heads) * row;
    const int64_t elements = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
    const bool nan = nan_free.tracking() && (first_non_finite(k_in + token, g.dtype, elements) >= 0 ||
                                             (with_v && first_non_finite(v_in + token, g.dtype, elements) >= 0));
    nan_free.wrote(layer, block, slot, nan);
  }
  return Status::Ok();
}

Status CpuStream::copy_block(int32_t src, int32_t dst) {
  const CacheGeometry& g = backend_.geometry();
  assert(src >= 0 && src < g.num_blocks && dst >= 0 && dst < g.num_blocks);
  const size_t bytes = g.block_stride() * dtype_size(g.dtype);
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    std::memcpy(backend_.k_at(layer, dst, 0, 0), backend_.k_at(layer, src, 0, 0), bytes);
    if (!g.latent()) std::memcpy(backend_.v_at(layer, dst, 0, 0), backend_.v_at(layer, src, 0, 0), bytes);
  }
  backend_.nan_free_slots().copied(src, dst);
  return Status::Ok();
}

Status CpuStream::poison_blocks(std::span<const int32_t> blocks) {
  // All-ones bytes are a NaN in fp32, fp16 and bf16 alike.
  const CacheGeometry& g = backend_.geometry();
  const size_t bytes = g.block_stride() * dtype_size(g.dtype);
  for (int32_t block : blocks) {
    assert(block >= 0 && block < g.num_blocks);
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      std::memset(backend_.k_at(layer, block, 0, 0), 0xff, bytes);
      if (!g.latent()) std::memset(backend_.v_at(layer, block, 0, 0), 0xff, bytes);
    }
    backend_.nan_free_slots().poisoned(block);
  }
  return Status::Ok();
}

StatusOr<double> CpuStream::measure_memory_bandwidth(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("bytes: expected > 0, received {}", bytes);
  using Clock = std::chrono::steady_clock;
  const int32_t threads = backend_.threads();
  const int64_t n = bytes / static_cast<int64_t>(sizeof(uint64_t));
  HostBuffer buf = aligned_buffer(static_cast<size_t>(n) * sizeof(uint64_t));
  if (!buf) return ResourceExhausted("bytes: could not allocate {} bytes for the bandwidth baseline", bytes);
  auto* p = reinterpret_cast<uint64_t*>(buf.get());
  uint64_t expected = 0;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    expected ^= p[i];
  }
  // A streaming read on the backend's threads, the same threads decode uses.
  // XOR is associative, so the compiler vectorises the loop and the read, not
  // the arithmetic, sets the pace. Best of three; each read must see every word.
  double best = std::numeric_limits<double>::infinity();
  std::vector<uint64_t> partial(static_cast<size_t>(threads), 0);
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    backend_.arena().execute([&] {
      tbb::parallel_for(int32_t{0}, threads, [&](int32_t w) {
        const int64_t lo = n * w / threads, hi = n * (w + 1) / threads;
        uint64_t x = 0;
        for (int64_t i = lo; i < hi; ++i) x ^= p[i];
        partial[static_cast<size_t>(w)] = x;
      });
    });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    uint64_t seen = 0;
    for (uint64_t x : partial) seen ^= x;
    if (seen != expected) {
      return Internal("measure_memory_bandwidth: expected the read to see XOR {:#x}, received {:#x}", expected, seen);
    }
  }
  return static_cast<double>(n) * sizeof(uint64_t) / best;
}

}  // namespace cpu

StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options) {
  const CacheGeometry& g = options.geometry;
  PAGODA_RETURN_IF_ERROR(validate_geometry(g));
  PAGODA_RETURN_IF_ERROR(validate_kv_scales(options.kv_scales, g.num_layers));
  if (options.cpu_threads < 0) {
    return InvalidArgument("threads: expected >= 0 (0 = all cores), received {}", options.cpu_threads);
  }
  if (options.cpu_target != "best") PAGODA_RETURN_IF_ERROR(cpu::select_simd_target(options.cpu_target));
  if (options.cpu_prefetch != "auto") PAGODA_RETURN_IF_ERROR(cpu::select_prefetch_level(options.cpu_prefetch));
  const int32_t threads = options.cpu_threads > 0
                              ? options.cpu_threads
                              : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t bytes = static_cast<size_t>(g.pool_elements()) * dtype_size(g.dtype);
  // Latent attention has no V pool: V is the prefix of each K row.
  const int pools = g.latent() ? 1 : 2;
  cpu::HostBuffer k = cpu::aligned_buffer(bytes);
  cpu::HostBuffer v = g.latent() ? nullptr : cpu::aligned_buffer(bytes);
  if (!k || (pools == 2 && !v)) {
    return ResourceExhausted("cache: could not allocate {} x {} bytes of host memory for {} blocks", pools, bytes,
                             g.num_blocks);
  }
  std::vector<KvScale> scales = options.kv_scales;
  if (scales.empty()) scales.assign(static_cast<size_t>(g.num_layers), KvScale{});
  return std::unique_ptr<Backend>(new cpu::CpuBackend(g, threads, std::move(scales), std::move(k), std::move(v)));
}

}  // namespace pagoda
