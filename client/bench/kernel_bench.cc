#include "kernel_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_targets.h"
#include "kernel_report.h"
#include "naive_decode.h"
#include "pagoda/backend.h"
#include "pagoda/host_convert.h"
#include "pagoda/key_ranges.h"
#include "pagoda/status.h"

namespace pagoda::bench {
namespace {

struct KernelOptions {
  std::string backend = "cpu";
  int32_t batch = 8;
  std::vector<int32_t> contexts = {4096};
  std::vector<int32_t> q_lens = {1};    // query rows per sequence
  std::vector<int32_t> windows = {0};   // sliding windows, 0: none
  int32_t q_heads = 32;
  int32_t kv_heads = 8;
  int32_t head_dim = 128;
  int32_t v_head_dim = 0;  // 0: head_dim; less: latent attention (V the prefix of K's rows)
  int32_t block_size = 16;
  std::vector<std::string> dtypes = {"fp16"};  // cache dtypes, each on its own backend; rows compare with the first
  std::vector<std::string> modes = {"deterministic", "fast"};
  std::vector<std::string> targets = {"best"};
  std::vector<std::string> prefetch = {"auto"};  // CPU prefetch levels to run (select_prefetch_level)
  int32_t split_tokens = 512;
  int32_t shared_prefix = 0;  // > 0: every sequence a fork sharing its first tokens with sequence 0
  int32_t threads = 2;
  int32_t iters = 20;
  int32_t rounds = 5;
  bool naive = true;
  bool json = false;
  bool phases = false;  // CPU: time each row's kernel phases too (launches of their own)
  std::string summary;  // a file to append the rows to as a Markdown table ("": none)
};

// Deterministic pseudo-random values in [-1, 1): cheap enough to fill gigabytes.
float value_at(uint64_t i) {
  i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  i ^= i >> 31;
  return static_cast<float>(i >> 40) / static_cast<float>(1 << 23) - 1.f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Fills sequence b's blocks [b * blocks_per_seq, ...) token by token through
// the backend's own append path, and the naive path's contiguous copy.
Status fill_cache(BackendStream& stream, const CacheGeometry& g, const KernelOptions& o, int32_t max_context,
                  int32_t blocks_per_seq, NaiveCache* naive) {
  const int64_t row = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
  constexpr int32_t kTokensPerWrite = 256;
  std::vector<float> k(kTokensPerWrite * row), v(kTokensPerWrite * row);
  std::vector<int64_t> slots(kTokensPerWrite);
  for (int32_t b = 0; b < o.batch; ++b) {
    for (int32_t t0 = 0; t0 < max_context; t0 += kTokensPerWrite) {
      const int32_t n = std::min(kTokensPerWrite, max_context - t0);
      for (int32_t t = 0; t < n; ++t) {
        const int32_t pos = t0 + t;
        slots[t] = flat_slot(b * blocks_per_seq + pos / g.block_size, pos % g.block_size, g.block_size);
        for (int64_t e = 0; e < row; ++e) {
          const uint64_t id = ((static_cast<uint64_t>(b) * max_context + pos) * row + e) * 2;
          k[t * row + e] = value_at(id);
          v[t * row + e] = value_at(id + 1);
        }
      }
      // Latent attention stores K alone; V is read from its rows.
      const KvWrite w{0, n, slots.data(), k.data(), g.latent() ? nullptr : v.data(), DType::kFloat32};
      PAGODA_RETURN_IF_ERROR(stream.write_kv(std::span<const KvWrite>(&w, 1)));
      if (naive != nullptr) naive->store(b, t0, n, k.data(), v.data());
    }
  }
  return Status::Ok();
}

// One launch of one cache: the stream it runs on and its outputs (each
// cache's own counts; the output buffers may be shared).
struct Job {
  BackendStream* stream;
  const DecodeLaunch* launch;
  DecodeOutputs* d;
};

// Launches timed in rounds: each round takes every job in turn, a baseline
// read and a few launches, so that all of them and their baselines see the
// same moments of a shared machine (a cache timed after another one's rounds
// had met a different neighbour: an fp8 row came out at 0.49x and 0.94x
// fp16's in two runs; four query rows timed after one query row's rounds,
// 1.47x and 1.64x its time in two runs a minute apart); medians over rounds.
struct Timed {
  double kernel_s = 0;
  double baseline = 0;
};

// Warm-up: every job twice, then in turn until kWarmupSeconds have passed. A
// guest's scheduler may keep a new pool worker on its caller's CPU for the
// first tens of milliseconds: on a 2-vCPU AMD Zen 3 guest, launches of about
// 0.5 ms on 2 threads took twice that for their first 15-45 ms (in some of
// them the worker ran no task), which two launches of warm-up left in the
// medians of one process in three.
constexpr double kWarmupSeconds = 0.1;

StatusOr<std::vector<Timed>> time_launches(std::span<const Job> jobs, const KernelOptions& o) {
  const auto warm_from = std::chrono::steady_clock::now();
  for (int32_t pass = 0;
       pass < 2 || std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_from).count() < kWarmupSeconds;
       ++pass) {
    for (const Job& j : jobs) PAGODA_RETURN_IF_ERROR(j.stream->decode(*j.launch, *j.d));
  }
  std::vector<std::vector<double>> times(jobs.size()), baselines(jobs.size());
  const int32_t per_round = std::max(1, o.iters / o.rounds);
  for (int32_t round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      StatusOr<double> baseline = j.stream->measure_memory_bandwidth(j.d->kv_bytes_read);
      if (!baseline.ok()) return baseline.status();
      baselines[i].push_back(*baseline);
      std::vector<double> round_times;
      for (int32_t n = 0; n < per_round; ++n) {
        PAGODA_RETURN_IF_ERROR(j.stream->decode(*j.launch, *j.d));
        round_times.push_back(j.d->attention_seconds);
      }
      times[i].push_back(median(round_times));
    }
  }
  std::vector<Timed> timed(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) timed[i] = {median(times[i]), median(baselines[i])};
  return timed;
}

// One launch's time in each kernel phase (CPU), from `launches` launches of
// job j with the phase clock on, after its timed rounds: the clock's reads
// stay out of the times the table reports.
StatusOr<cpu::KernelPhaseTimes> time_phases(const Job& j, int32_t launches) {
  cpu::time_kernel_phases(true);
  for (int32_t n = 0; n < launches; ++n) {
    if (Status s = j.stream->decode(*j.launch, *j.d); !s.ok()) {
      cpu::time_kernel_phases(false);
      return s;
    }
  }
  cpu::KernelPhaseTimes t = cpu::kernel_phase_times();
  cpu::time_kernel_phases(false);
  for (double& s : t.seconds) s /= launches;
  t.tasks /= launches;
  return t;
}

// 2 FLOPs per multiply-add of q.k (head_dim wide) and of p.v (v_head_dim
// wide) per key and query head, over the keys every row attends.
double launch_flops(const CacheGeometry& g, int32_t batch, int32_t context, int32_t q_len, int32_t window) {
  int64_t keys = 0;
  for (int32_t i = 0; i < q_len; ++i) {
    const KeySpan k = row_keys(context, q_len, i, window);
    keys += k.end - k.begin;
  }
  return 2.0 * (g.head_dim + g.v_dim()) * g.num_q_heads * static_cast<double>(keys) * batch;
}

// One cache dtype: its backend and stream, the cache filled, and the naive
// path's copy of the same values (null with --no-naive).
struct DtypeCache {
  DType dtype;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<BackendStream> stream;
  std::unique_ptr<NaiveCache> naive;
};

// 0, or an exit status (the message printed).
int open_cache(const KernelOptions& o, DType dtype, int32_t max_context, int32_t blocks_per_seq, DtypeCache* c) {
  BackendOptions bo;
  bo.kind = o.backend;
  bo.cpu_threads = o.threads;
  bo.max_batch = o.batch;
  bo.geometry = {1, o.q_heads, o.kv_heads, o.head_dim, o.block_size, o.batch * blocks_per_seq, dtype,
                 o.v_head_dim != 0 ? o.v_head_dim : o.head_dim};
  auto made = make_backend(bo);
  if (!made.ok()) {
    fmt::print(stderr, "pagoda-bench kernel: {}\n", made.status().message());
    return 2;
  }
  auto opened = (*made)->open_stream();
  if (!opened.ok()) {
    fmt::print(stderr, "pagoda-bench kernel: {}\n", opened.status().message());
    return 1;
  }
  c->dtype = dtype;
  c->backend = std::move(*made);
  c->stream = std::move(*opened);
  const CacheGeometry& g = c->backend->geometry();
  if (o.naive) c->naive = std::make_unique<NaiveCache>(g, o.batch, max_context);
  if (Status s = fill_cache(*c->stream, g, o, max_context, blocks_per_seq, c->naive.get()); !s.ok()) {
    fmt::print(stderr, "pagoda-bench kernel: append: {}\n", s.message());
    return 1;
  }
  return 0;
}

int run(const KernelOptions& o) {
  std::vector<DType> dtypes;
  for (const std::string& name : o.dtypes) {
    const auto dtype = parse_dtype(name);
    if (!dtype) {
      fmt::print(stderr, "pagoda-bench kernel: --dtype: expected fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2, received '{}'\n",
                 name);
      return 2;
    }
    if (std::find(dtypes.begin(), dtypes.end(), *dtype) != dtypes.end()) {
      fmt::print(stderr, "pagoda-bench kernel: --dtype: expected each dtype once, received '{}' twice\n", name);
      return 2;
    }
    dtypes.push_back(*dtype);
  }
  const bool cpu = o.backend == "cpu";
  if (!cpu && (o.targets.size() != 1 || o.targets[0] != "best")) {
    fmt::print(stderr, "pagoda-bench kernel: --target: expected best with --backend cuda, received a CPU target\n");
    return 2;
  }
  if (!cpu && (o.prefetch.size() != 1 || o.prefetch[0] != "auto")) {
    fmt::print(stderr, "pagoda-bench kernel: --prefetch: expected auto with --backend cuda, received a CPU level\n");
    return 2;
  }
  // The summary file is opened before the run, so that a path that cannot be
  // written fails at once rather than after minutes of launches.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> summary(nullptr, &std::fclose);
  bool summary_header = false;
  if (!o.summary.empty()) {
    summary.reset(std::fopen(o.summary.c_str(), "a"));
    if (!summary) {
      fmt::print(stderr, "pagoda-bench kernel: --summary: expected a file that can be appended to, received '{}' ({})\n",
                 o.summary, std::strerror(errno));
      return 2;
    }
    summary_header = std::fseek(summary.get(), 0, SEEK_END) == 0 && std::ftell(summary.get()) == 0;
  }
  const int32_t max_context = *std::max_element(o.contexts.begin(), o.contexts.end());
  const int32_t min_context = *std::min_element(o.contexts.begin(), o.contexts.end());
  if (o.shared_prefix > min_context) {
    fmt::print(stderr, "pagoda-bench kernel: --shared-prefix: expected at most the shortest --context ({}), received {}\n",
               min_context, o.shared_prefix);
    return 2;
  }
  const int32_t blocks_per_seq = (max_context + o.block_size - 1) / o.block_size;
  // Every dtype's cache at once, filled with the same values rounded to it,
  // so that their launches can take turns in each round.
  std::vector<DtypeCache> caches(dtypes.size());
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (const int rc = open_cache(o, dtypes[i], max_context, blocks_per_seq, &caches[i]); rc != 0) return rc;
  }
  const CacheGeometry& g = caches.front().backend->geometry();  // the dtypes differ in nothing else

  std::vector<int32_t> indptr(o.batch + 1), ids(static_cast<size_t>(o.batch) * blocks_per_seq);
  for (int32_t b = 0; b <= o.batch; ++b) indptr[b] = b * blocks_per_seq;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  // Forks: the first shared_prefix tokens of every sequence in sequence 0's
  // blocks, as ForkSequence leaves them; the unshared tables above are their twins.
  const int32_t shared_blocks = o.shared_prefix / o.block_size;
  std::vector<int32_t> fork_ids = ids;
  for (int32_t b = 1; b < o.batch; ++b) {
    for (int32_t j = 0; j < shared_blocks; ++j) fork_ids[static_cast<size_t>(b) * blocks_per_seq + j] = j;
  }
  const int32_t max_q_len = *std::max_element(o.q_lens.begin(), o.q_lens.end());
  const size_t max_rows = static_cast<size_t>(o.batch) * max_q_len;
  std::vector<float> q(max_rows * g.num_q_heads * g.head_dim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = value_at(i + (1ull << 60));
  std::vector<float> out(max_rows * g.num_q_heads * g.v_dim()), lse(max_rows * g.num_q_heads);
  std::vector<int32_t> splits(o.batch);
  const float scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));

  KernelReport report;
  report.backend = caches.front().backend->name();
  report.device = caches.front().backend->device_name();
  report.geometry = g;
  report.dtypes = dtypes;
  report.batch = o.batch;
  report.split_tokens = o.split_tokens;
  report.threads = cpu ? caches.front().backend->num_workers() : 0;
  if (cpu) {
    (void)cpu::select_prefetch_level("auto");
    report.prefetch_auto = cpu::prefetch_level_name() + "; " + cpu::prefetch_distance_name();
  }
  // Every (context, q_len, window, mode) row of one target and prefetch
  // selection, from each cache's `bases` (which name them and the compute roof).
  // A context's rows share their rounds (time_launches), so that "vs q1",
  // "vs twins" and the dtypes' and the modes' pairs compare launches timed at
  // the same moments of a shared machine.
  const auto time_rows = [&](const std::vector<KernelRow>& bases) -> bool {
    for (int32_t context : o.contexts) {
      std::vector<int32_t> lengths(o.batch, context);
      std::vector<double> naive_s(caches.size(), 0.0);  // the naive path: one row per sequence, no window
      for (size_t c = 0; c < caches.size() && cpu; ++c) {
        if (!caches[c].naive) continue;
        std::vector<double> times;
        for (int32_t i = 0; i < std::max(3, o.iters / 5); ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          caches[c].naive->decode(q.data(), context, scale, out.data(), o.threads);
          times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        naive_s[c] = median(times);
      }
      // The context's launches in row order: q_len, then window, then mode;
      // with --shared-prefix each one twice, its unshared twins then its forks.
      struct Variant {
        int32_t q_len;
        int32_t window;
        const std::string* mode;
        bool forks;
      };
      std::vector<Variant> variants;
      for (int32_t q_len : o.q_lens) {
        if (q_len > context) continue;
        for (int32_t window : o.windows) {
          for (const std::string& mode : o.modes) {
            variants.push_back({q_len, window, &mode, false});
            if (o.shared_prefix > 0) variants.push_back({q_len, window, &mode, true});
          }
        }
      }
      std::vector<std::vector<int32_t>> q_indptrs(variants.size(), std::vector<int32_t>(o.batch + 1));
      std::vector<DecodeLaunch> launches(variants.size());
      for (size_t v = 0; v < variants.size(); ++v) {
        const Variant& var = variants[v];
        for (int32_t b = 0; b <= o.batch; ++b) q_indptrs[v][b] = b * var.q_len;
        DecodeLaunch& launch = launches[v];
        launch.tables = {o.batch, indptr.data(), var.forks ? fork_ids.data() : ids.data(), lengths.data()};
        launch.q = q.data();
        launch.scale = scale;
        launch.mode = *var.mode == "fast" ? SplitMode::kFast : SplitMode::kDeterministic;
        launch.split_tokens = o.split_tokens;
        launch.q_indptr = var.q_len > 1 ? q_indptrs[v].data() : nullptr;
        launch.sliding_window = var.window;
      }
      // Job v * caches + c: launch v on cache c.
      std::vector<DecodeOutputs> outputs(variants.size() * caches.size(),
                                         DecodeOutputs{out.data(), lse.data(), splits.data()});
      std::vector<Job> jobs;
      for (size_t v = 0; v < variants.size(); ++v) {
        for (size_t c = 0; c < caches.size(); ++c) {
          jobs.push_back({caches[c].stream.get(), &launches[v], &outputs[v * caches.size() + c]});
        }
      }
      StatusOr<std::vector<Timed>> timed = time_launches(jobs, o);
      if (!timed.ok()) {
        fmt::print(stderr, "pagoda-bench kernel: {}\n", timed.status().message());
        return false;
      }
      std::vector<cpu::KernelPhaseTimes> phases(jobs.size());
      const bool timing_phases = o.phases && cpu;
      for (size_t j = 0; j < jobs.size() && timing_phases; ++j) {
        StatusOr<cpu::KernelPhaseTimes> t = time_phases(jobs[j], std::max(2, o.iters / o.rounds));
        if (!t.ok()) {
          fmt::print(stderr, "pagoda-bench kernel: {}\n", t.status().message());
          return false;
        }
        phases[j] = *t;
      }
      for (size_t v = 0; v < variants.size(); ++v) {
        const Variant& var = variants[v];
        for (size_t c = 0; c < caches.size(); ++c) {
          const size_t j = v * caches.size() + c;
          KernelRow r = bases[c];
          r.context = context;
          r.q_len = var.q_len;
          r.window = var.window;
          r.mode = *var.mode;
          r.flops = launch_flops(g, o.batch, context, var.q_len, var.window);
          r.shared_prefix = var.forks ? shared_blocks * o.block_size : 0;
          r.kernel_s = (*timed)[j].kernel_s;
          r.unshared_s = var.forks ? (*timed)[j - caches.size()].kernel_s : 0;  // the twins' job, one variant back
          r.baseline = (*timed)[j].baseline;
          r.kv_bytes = static_cast<double>(outputs[j].kv_bytes_read);
          r.chunk_tokens = outputs[j].chunk_tokens;
          r.naive_s = var.q_len == 1 && var.window == 0 && !var.forks ? naive_s[c] : 0;
          r.phases_timed = timing_phases;
          r.phases = phases[j];
          report.rows.push_back(r);
        }
      }
    }
    return true;
  };
  for (const std::string& target : o.targets) {
    if (cpu) {
      if (Status s = cpu::select_simd_target(target); !s.ok()) {
        fmt::print(stderr, "pagoda-bench kernel: {}\n", s.message());
        return 2;
      }
    }
    std::vector<KernelRow> bases(caches.size());
    for (size_t c = 0; c < caches.size(); ++c) {
      const CacheGeometry& cg = caches[c].backend->geometry();
      const cpu::MatrixUnit unit = cpu ? cpu::matrix_unit_for(cg) : cpu::MatrixUnit::kNone;
      KernelRow& base = bases[c];
      base.dtype = caches[c].dtype;
      base.selection = target;
      base.target = cpu ? cpu::kernel_target_name(cg) : "cuda";
      // The compute roof on the same threads and unit (the matrix unit's where
      // one serves the cache), next to the rows it bounds.
      base.compute_peak = cpu ? cpu::measure_compute_peak(cg, report.threads) : 0.0;
      base.compute = unit == cpu::MatrixUnit::kAmx          ? "amx"
                     : unit == cpu::MatrixUnit::kAvx512Bf16 ? "bf16dot"
                                                            : "fma";
    }
    const size_t target_rows = report.rows.size();
    for (const std::string& prefetch : o.prefetch) {
      if (cpu) {
        if (Status s = cpu::select_prefetch_level(prefetch); !s.ok()) {
          fmt::print(stderr, "pagoda-bench kernel: {}\n", s.message());
          return 2;
        }
        for (KernelRow& base : bases) base.prefetch = prefetch;
      }
      if (!time_rows(bases)) return 1;
    }
    if (cpu) {
      // The peak is the hardware's, and a neighbour on a shared host only
      // lowers a measurement of it (one measured at two thirds of the next
      // run's turned an fp16 row's bound from memory to fma): the higher of
      // one taken before the target's rows and one after stands for them all.
      for (size_t c = 0; c < caches.size(); ++c) {
        const double after = cpu::measure_compute_peak(caches[c].backend->geometry(), report.threads);
        for (size_t i = target_rows; i < report.rows.size(); ++i) {
          KernelRow& r = report.rows[i];
          if (r.dtype == caches[c].dtype) r.compute_peak = std::max(r.compute_peak, after);
        }
      }
    }
  }
  if (cpu) {
    (void)cpu::select_simd_target("best");
    (void)cpu::select_prefetch_level("auto");
  }
  // Each dtype's rows together, in the order the dtypes were given.
  std::stable_sort(report.rows.begin(), report.rows.end(), [&](const KernelRow& a, const KernelRow& b) {
    return std::find(dtypes.begin(), dtypes.end(), a.dtype) < std::find(dtypes.begin(), dtypes.end(), b.dtype);
  });
  if (o.json) {
    print_json(report);
  } else {
    print_table(report);
  }
  if (summary) append_summary(report, summary.get(), summary_header);
  return 0;
}

}  // namespace

void add_kernel_command(CLI::App& app) {
  auto o = std::make_shared<KernelOptions>();
  CLI::App* sub = app.add_subcommand("kernel", "Time the backend's decode in process on a named shape");
  sub->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--batch", o->batch, "sequences per launch")->check(CLI::Range(1, 4096));
  sub->add_option("--context", o->contexts, "tokens per sequence (comma-separated list)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--q-len", o->q_lens, "query rows per sequence, its last tokens (comma-separated list)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  sub->add_option("--window", o->windows, "sliding windows, 0 = none (comma-separated list)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--q-heads", o->q_heads, "query heads");
  sub->add_option("--kv-heads", o->kv_heads, "KV heads");
  sub->add_option("--head-dim", o->head_dim, "q and K head dimension (64, 128, 256, 576)");
  sub->add_option("--v-head-dim", o->v_head_dim,
                  "V and output head dimension (0 = --head-dim); less than --head-dim is latent attention, V the "
                  "prefix of K's rows (576 with 512: MLA)");
  sub->add_option("--block-size", o->block_size, "tokens per block");
  sub->add_option("--dtype", o->dtypes,
                  "cache dtypes, each timed on its own cache (comma-separated: fp32, fp16, bf16, fp8_e4m3, "
                  "fp8_e5m2); the later ones' rows give their time over the first's")
      ->delimiter(',');
  sub->add_option("--mode", o->modes, "deterministic, fast (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"deterministic", "fast"}));
  sub->add_option("--target", o->targets,
                  std::string("CPU SIMD targets to run, in order (comma-separated): best (all the CPU has: ") +
                      cpu::kBestTargetRule +
                      "), amx (AMX for every bf16 and fp8 cache, failing without it), avx512bf16 (AVX512-BF16 dot "
                      "products for every bf16 and fp8 cache, failing without them), avx3 (AVX-512 FMAs only), avx2")
      ->delimiter(',')
      ->check(CLI::IsMember({"best", "amx", "avx512bf16", "avx3", "avx2"}));
  sub->add_option("--prefetch", o->prefetch,
                  "CPU prefetch levels to run each target with, in order (comma-separated): auto (the levels "
                  "measured faster on this CPU family), l1, l2")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "l1", "l2"}));
  sub->add_option("--split-tokens", o->split_tokens, "split-KV chunk length in deterministic mode");
  sub->add_option("--shared-prefix", o->shared_prefix,
                  "tokens every sequence shares with the first (a batch of forks of one parent), timed against the "
                  "same batch with unshared twins; 0: none")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--threads", o->threads, "CPU backend threads (0 = all cores)");
  sub->add_option("--iters", o->iters, "timed launches per row, spread over the rounds")->check(CLI::Range(1, 100000));
  sub->add_option("--rounds", o->rounds, "rounds per row, each a baseline read then iters/rounds launches; "
                                         "medians over rounds are reported")
      ->check(CLI::Range(1, 1000));
  sub->add_flag("!--no-naive", o->naive, "skip the naive scores-materialised path");
  sub->add_flag("--json", o->json, "print one JSON object instead of the table");
  sub->add_option("--summary", o->summary,
                  "append one Markdown table row per launch to this file (the table's header first when the file is "
                  "new): target, shape, dtype, bound, fractions of the roofline and of the read, time over one query "
                  "row's and over the first dtype's");
  sub->add_flag("--phases", o->phases,
                "CPU: also time each row's kernel phases (scores, softmax, P.V, merge, the rest) on the kernel's own "
                "clock, in launches after the timed ones, and how near the peak q.k's and P.V's phases run");
  sub->callback([o] {
    const int rc = run(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace pagoda::bench
