#include "kernel_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace pagoda::bench {
namespace {

constexpr const char* kBaselineMethod =
    "CPU: streaming XOR read of a buffer as large as the launch's K/V on the backend's threads; "
    "CUDA: device-to-device copy, bytes counted read + write";

// FLOPs per byte of cache and query row: 2 (q.k) + 2 (p.v) per element pair
// for each head of the group, over the bytes one key row of a KV head takes
// (K and V, or K alone when V is its prefix).
double flops_per_byte(CacheGeometry g, DType dtype) {
  g.dtype = dtype;
  const double bytes = static_cast<double>(g.token_kv_bytes()) / g.num_kv_heads;
  return 2.0 * (g.head_dim + g.v_dim()) * g.group_size() / bytes;
}

// "1.72x", or "-" where there is nothing to compare with.
std::string ratio_cell(double ratio, int precision) {
  return ratio > 0 ? fmt::format("{:.{}f}x", ratio, precision) : "-";
}

using cpu::KernelPhase;
// The phases in the order both reports give them, with their JSON names.
constexpr struct {
  KernelPhase phase;
  const char* name;
} kPhases[] = {{KernelPhase::kScores, "scores"},
               {KernelPhase::kSoftmax, "softmax"},
               {KernelPhase::kValues, "values"},
               {KernelPhase::kMerge, "merge"},
               {KernelPhase::kOther, "other"}};

// --phases: where each row's launch spends its tasks' time, and how near
// its multiply-adds run to the compute peak inside q.k's and p.v's phases.
void print_phases(const KernelReport& rep) {
  if (std::none_of(rep.rows.begin(), rep.rows.end(), [](const KernelRow& r) { return r.phases_timed; })) return;
  fmt::print("\nphases (--phases): each phase's share of the tasks' time, on the kernel's own clock in launches "
             "of their own;\n\"peak\": the phase's multiply-adds at one thread's share of the compute peak, over "
             "the phase's time\n");
  fmt::print("{:>21} {:>8} {:>5} {:>14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9}\n", "target", "context",
             "q_len", "mode", "dtype", "scores", "softmax", "P.V", "merge", "other", "q.k peak", "P.V peak", "task us");
  for (const KernelRow& r : rep.rows) {
    if (!r.phases_timed) continue;
    const double total = r.phases.total();
    fmt::print("{:>21} {:>8} {:>5} {:>14} {:>8}", r.target, r.context, r.q_len, r.mode, dtype_name(r.dtype));
    for (const auto& p : kPhases) fmt::print(" {:>8.3f}", total > 0 ? r.phases.at(p.phase) / total : 0.0);
    fmt::print(" {:>10.3f} {:>10.3f} {:>9.1f}\n", rep.phase_of_peak(r, KernelPhase::kScores),
               rep.phase_of_peak(r, KernelPhase::kValues), total * 1e6);
  }
}

// ", \"phases\": {...}" for a row timed by phase, else "".
std::string phases_json(const KernelReport& rep, const KernelRow& r) {
  if (!r.phases_timed) return "";
  std::string out = ", \"phases\": {";
  for (const auto& p : kPhases) out += fmt::format("\"{}_us\": {:.3f}, ", p.name, r.phases.at(p.phase) * 1e6);
  return out + fmt::format("\"tasks\": {}, \"scores_of_peak\": {:.4f}, \"values_of_peak\": {:.4f}}}",
                           r.phases.tasks, rep.phase_of_peak(r, KernelPhase::kScores),
                           rep.phase_of_peak(r, KernelPhase::kValues));
}

}  // namespace

double KernelReport::time_over_one_row(const KernelRow& r) const {
  if (r.q_len == 1) return 0;
  for (const KernelRow& one : rows) {
    if (one.q_len == 1 && one.dtype == r.dtype && one.selection == r.selection && one.prefetch == r.prefetch &&
        one.context == r.context && one.window == r.window && one.shared_prefix == r.shared_prefix &&
        one.mode == r.mode) {
      return r.kernel_s / one.kernel_s;
    }
  }
  return 0;
}

double KernelReport::time_over_first_dtype(const KernelRow& r) const {
  if (dtypes.size() < 2 || r.dtype == dtypes.front()) return 0;
  for (const KernelRow& first : rows) {
    if (first.dtype == dtypes.front() && first.selection == r.selection && first.prefetch == r.prefetch &&
        first.context == r.context && first.q_len == r.q_len && first.window == r.window &&
        first.shared_prefix == r.shared_prefix && first.mode == r.mode) {
      return r.kernel_s / first.kernel_s;
    }
  }
  return 0;
}

double KernelReport::phase_of_peak(const KernelRow& r, cpu::KernelPhase p) const {
  const double seconds = r.phases.at(p);
  if (!r.phases_timed || seconds <= 0 || r.compute_peak <= 0 || threads <= 0) return 0;
  const double width = p == cpu::KernelPhase::kScores ? geometry.head_dim : geometry.v_dim();
  const double flops = r.flops * width / (geometry.head_dim + geometry.v_dim());
  return flops / (r.compute_peak / threads) / seconds;
}

double KernelReport::roofline_seconds(const KernelRow& r) const {
  const double memory = r.kv_bytes / r.baseline;
  return r.compute_peak > 0 ? std::max(memory, r.flops / r.compute_peak) : memory;
}

const char* KernelReport::bound(const KernelRow& r) const {
  return r.compute_peak > 0 && r.flops / r.compute_peak > r.kv_bytes / r.baseline ? r.compute.c_str() : "memory";
}

void print_table(const KernelReport& rep) {
  const CacheGeometry& g = rep.geometry;
  fmt::print("pagoda-bench kernel: {} on {}\n", rep.backend, rep.device);
  std::string caches;
  for (const DType d : rep.dtypes) {
    caches += fmt::format("{}{} cache ({:.1f} FLOP per K/V byte and query row)", caches.empty() ? "" : ", ",
                          dtype_name(d), flops_per_byte(g, d));
  }
  fmt::print("shape: batch {}, {} q heads, {} kv heads (group {}), head_dim {}, v_head_dim {}{}, block {}; {}\n"
             "baseline: {}\nK/V bytes: the keys the rows attend (a window reads fewer)\n\n",
             rep.batch, g.num_q_heads, g.num_kv_heads, g.group_size(), g.head_dim, g.v_dim(),
             g.latent() ? " (latent: V is K's prefix)" : "", g.block_size, caches, kBaselineMethod);
  if (!rep.prefetch_auto.empty()) fmt::print("prefetch auto on this CPU: {}\n\n", rep.prefetch_auto);
  // Several dtypes: a dtype column, and each later dtype's time over the first's.
  const bool several = rep.dtypes.size() > 1;
  const std::string vs_first = several ? fmt::format("vs {}", dtype_name(rep.dtypes.front())) : "";
  fmt::print("{:>21} {:>8} {:>8} {:>5} {:>6} {:>6} {:>14} {:>6} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7} {:>7} {:>9} {:>9}",
             "target", "prefetch", "context", "q_len", "window", "shared", "mode", "chunk", "kernel us", "K/V GB/s", "read GB/s",
             "of read", "peak GF/s", "of roof", "bound", "vs q1", "vs naive", "vs twins");
  if (several) fmt::print(" {:>8} {:>8}", "dtype", vs_first);
  fmt::print("\n");
  for (const KernelRow& r : rep.rows) {
    fmt::print(
        "{:>21} {:>8} {:>8} {:>5} {:>6} {:>6} {:>14} {:>6} {:>10.1f} {:>9.2f} {:>9.2f} {:>9.3f} {:>10.1f} {:>9.3f} {:>7} "
        "{:>7} {:>9} {:>9}",
        r.target, r.prefetch.empty() ? "-" : r.prefetch, r.context, r.q_len, r.window, r.shared_prefix, r.mode,
        r.chunk_tokens, r.kernel_s * 1e6, r.bandwidth() / 1e9, r.baseline / 1e9, r.bandwidth() / r.baseline, r.compute_peak / 1e9,
        rep.fraction_of_roofline(r), rep.bound(r), ratio_cell(rep.time_over_one_row(r), 2),
        ratio_cell(r.naive_s > 0 ? r.naive_s / r.kernel_s : 0.0, 1),
        ratio_cell(r.unshared_s > 0 ? r.unshared_s / r.kernel_s : 0.0, 2));
    if (several) fmt::print(" {:>8} {:>8}", dtype_name(r.dtype), ratio_cell(rep.time_over_first_dtype(r), 2));
    fmt::print("\n");
  }
  print_phases(rep);
}

void print_json(const KernelReport& rep) {
  const CacheGeometry& g = rep.geometry;
  fmt::print("{{\"benchmark\": \"kernel\", \"backend\": \"{}\", \"device\": \"{}\", \"threads\": {}, \"batch\": {}, "
             "\"q_heads\": {}, \"kv_heads\": {}, \"head_dim\": {}, \"v_head_dim\": {}, \"dtype\": \"{}\", "
             "\"block_size\": {}, \"split_tokens\": {}, \"flops_per_kv_byte_and_row\": {:.3f}, \"baseline_method\": "
             "\"{}\", \"prefetch_auto\": \"{}\", \"rows\": [",
             rep.backend, rep.device, rep.threads, rep.batch, g.num_q_heads, g.num_kv_heads, g.head_dim, g.v_dim(),
             dtype_name(g.dtype), g.block_size, rep.split_tokens, flops_per_byte(g, g.dtype), kBaselineMethod,
             rep.prefetch_auto);
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    const KernelRow& r = rep.rows[i];
    fmt::print("{}{{\"dtype\": \"{}\", \"time_over_first_dtype\": {:.3f}, \"selection\": \"{}\", \"target\": \"{}\", \"prefetch\": \"{}\", \"context\": {}, \"q_len\": {}, \"window\": {}, \"shared_prefix\": {}, "
               "\"mode\": \"{}\", \"chunk_tokens\": {}, \"kernel_us\": {:.2f}, \"kv_bytes\": {:.0f}, \"flops\": {:.0f}, "
               "\"kv_gb_per_s\": {:.3f}, \"baseline_gb_per_s\": {:.3f}, \"fraction_of_baseline\": {:.4f}, "
               "\"fma_peak_gflops\": {:.2f}, \"compute_unit\": \"{}\", \"roofline_us\": {:.2f}, \"fraction_of_roofline\": {:.4f}, "
               "\"bound\": \"{}\", \"time_over_q_len_1\": {:.3f}, \"naive_us\": {:.2f}, \"speedup_over_naive\": {:.3f}, "
               "\"unshared_us\": {:.2f}, \"speedup_over_unshared\": {:.3f}{}}}",
               i ? ", " : "", dtype_name(r.dtype), rep.time_over_first_dtype(r), r.selection, r.target, r.prefetch, r.context, r.q_len, r.window, r.shared_prefix, r.mode, r.chunk_tokens,
               r.kernel_s * 1e6, r.kv_bytes, r.flops, r.bandwidth() / 1e9, r.baseline / 1e9,
               r.bandwidth() / r.baseline, r.compute_peak / 1e9, r.compute, rep.roofline_seconds(r) * 1e6,
               rep.fraction_of_roofline(r), rep.bound(r), rep.time_over_one_row(r), r.naive_s * 1e6,
               r.naive_s > 0 ? r.naive_s / r.kernel_s : 0.0, r.unshared_s * 1e6,
               r.unshared_s > 0 ? r.unshared_s / r.kernel_s : 0.0, phases_json(rep, r));
  }
  fmt::print("]}}\n");
}

void append_summary(const KernelReport& rep, std::FILE* out, bool header) {
  const CacheGeometry& g = rep.geometry;
  if (header) {
    fmt::print(out, "{} on {}; the roofline: the K/V bytes at the read bandwidth or the FLOPs at the compute peak, "
                    "whichever is longer, both measured in the same run\n\n",
               rep.backend, rep.device);
    fmt::print(out, "| target | shape | dtype | q_len | mode | bound | of roof | of read | vs q1 | vs first dtype |\n"
                    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  }
  // The heads as the row block sees them: a GQA group, or latent attention's
  // one KV head of head_dim K with V its prefix.
  const std::string heads = g.latent() ? fmt::format("latent {}/{}, {} heads", g.head_dim, g.v_dim(), g.num_q_heads)
                                       : fmt::format("GQA {}, head_dim {}", g.group_size(), g.head_dim);
  for (const KernelRow& r : rep.rows) {
    std::string shape = fmt::format("{}, {} x {}, block {}", heads, rep.batch, r.context, g.block_size);
    if (r.window > 0) shape += fmt::format(", window {}", r.window);
    if (r.shared_prefix > 0) shape += fmt::format(", {} shared", r.shared_prefix);
    // The target that ran, and what was asked where it says more: `best`
    // resolves to a target the other rows may name too.
    std::string target = r.target;
    if (r.selection == "best") target += " (best)";
    if (!r.prefetch.empty() && r.prefetch != "auto") target += fmt::format(", prefetch {}", r.prefetch);
    const double vs_first = rep.time_over_first_dtype(r);
    fmt::print(out, "| {} | {} | {} | {} | {} | {} | {:.2f} | {:.2f} | {} | {} |\n", target, shape,
               dtype_name(r.dtype), r.q_len, r.mode, rep.bound(r), rep.fraction_of_roofline(r),
               r.bandwidth() / r.baseline, ratio_cell(rep.time_over_one_row(r), 2),
               vs_first > 0 ? fmt::format("{} ({})", ratio_cell(vs_first, 2), dtype_name(rep.dtypes.front())) : "-");
  }
}

}  // namespace pagoda::bench
