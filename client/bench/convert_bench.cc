#include "convert_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "pagoda/cpu_targets.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

namespace pagoda::bench {
namespace {

struct ConvertOptions {
  int64_t elements = 8 * 32 * 128;  // a Decode call's q: batch 8, 32 heads of 128
  int32_t rounds = 31;
  std::vector<std::string> targets = {"best"};
};

// One call of fn, in microseconds.
double time_us(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One row: the bulk path and the element loop over the same input, timed in
// alternation, and whether their outputs are equal byte for byte.
struct Row {
  std::string name;
  std::function<void()> bulk;
  std::function<void()> element;
  std::function<bool()> same;
};

std::vector<Row> make_rows(int64_t n, std::mt19937& rng) {
  // Activations: normal values, so that the conversions see the common case.
  auto f = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  std::normal_distribution<float> normal;
  for (float& x : *f) x = normal(rng);
  auto h16 = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
  auto b16 = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    (*h16)[static_cast<size_t>(i)] = float_to_fp16((*f)[static_cast<size_t>(i)]);
    (*b16)[static_cast<size_t>(i)] = float_to_bf16((*f)[static_cast<size_t>(i)]);
  }
  auto out16a = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
  auto out16b = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
  auto out32a = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  auto out32b = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  auto out8a = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n));
  auto out8b = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n));
  auto found = std::make_shared<std::vector<int64_t>>(2, 0);
  const auto equal16 = [=] { return *out16a == *out16b; };
  const auto equal32 = [=] { return std::memcmp(out32a->data(), out32b->data(), out32a->size() * 4) == 0; };
  const auto equal8 = [=] { return *out8a == *out8b; };
  const auto equal_found = [=] { return (*found)[0] == (*found)[1] && (*found)[0] == n - 1; };

  std::vector<Row> rows;
  const auto narrow = [&](const char* name, DType to, uint16_t (*element)(float)) {
    rows.push_back({name, [=] { convert_from_float(f->data(), out16a->data(), to, n); },
                    [=] {
                      const float* in = f->data();
                      uint16_t* out = out16b->data();
                      for (int64_t i = 0; i < n; ++i) out[i] = element(in[i]);
                    },
                    equal16});
  };
  using Codes = std::shared_ptr<const std::vector<uint16_t>>;
  const auto widen = [&](const char* name, DType from, Codes in, float (*element)(uint16_t)) {
    rows.push_back({name, [=] { convert_to_float(in->data(), from, out32a->data(), n); },
                    [=] {
                      const uint16_t* codes = in->data();
                      float* out = out32b->data();
                      for (int64_t i = 0; i < n; ++i) out[i] = element(codes[i]);
                    },
                    equal32});
  };
  const auto encode = [&](const char* name, DType to) {
    rows.push_back({name, [=] { store_scaled(f->data(), DType::kFloat32, 1.f, out8a->data(), to, n); },
                    [=] {
                      const float* in = f->data();
                      uint8_t* out = out8b->data();
                      for (int64_t i = 0; i < n; ++i) out[i] = float_to_fp8(in[i], to).code;
                    },
                    equal8});
  };
  // The scans read finite data up to an infinity in the last element (the
  // whole tensor read, as for one that passes, and both sides must find it);
  // the element loop tests one word at a time, read by memcpy as wire bytes
  // must be.
  const auto scan = [&]<typename Word>(const char* name, DType dtype, std::shared_ptr<const void> owner,
                                       Word exponent) {
    rows.push_back({name, [=] { (*found)[0] = first_non_finite(owner.get(), dtype, n); },
                    [=] {
                      const auto* bytes = static_cast<const std::byte*>(owner.get());
                      int64_t at = -1;
                      for (int64_t i = 0; i < n; ++i) {
                        Word w;
                        std::memcpy(&w, bytes + i * static_cast<int64_t>(sizeof(Word)), sizeof(Word));
                        if ((w & exponent) == exponent) {
                          at = i;
                          break;
                        }
                      }
                      (*found)[1] = at;
                    },
                    equal_found});
  };
  narrow("fp32 -> fp16", DType::kFloat16, float_to_fp16);
  widen("fp16 -> fp32", DType::kFloat16, h16, fp16_to_float);
  narrow("fp32 -> bf16", DType::kBFloat16, float_to_bf16);
  widen("bf16 -> fp32", DType::kBFloat16, b16, bf16_to_float);
  encode("fp32 -> fp8_e4m3", DType::kFloat8E4M3);
  encode("fp32 -> fp8_e5m2", DType::kFloat8E5M2);
  const auto ending_in_infinity = [](const auto& v, auto infinity) {
    auto copy = std::make_shared<std::remove_cvref_t<decltype(*v)>>(*v);
    copy->back() = infinity;
    return std::shared_ptr<const void>(copy, copy->data());
  };
  scan("scan fp32", DType::kFloat32, ending_in_infinity(f, std::numeric_limits<float>::infinity()),
       uint32_t{0x7f800000u});
  scan("scan fp16", DType::kFloat16, ending_in_infinity(h16, uint16_t{0x7c00u}), uint16_t{0x7c00u});
  scan("scan bf16", DType::kBFloat16, ending_in_infinity(b16, uint16_t{0x7f80u}), uint16_t{0x7f80u});
  // The rows' closures own every buffer through their shared pointers.
  return rows;
}

int run(const ConvertOptions& o) {
  std::mt19937 rng(11);
  std::vector<Row> rows = make_rows(o.elements, rng);
  fmt::print(
      "pagoda-bench convert: {} elements (a Decode's q at batch 8, 32 heads of 128: 32768), median of {} "
      "rounds\n",
      o.elements, o.rounds);
  fmt::print(
      "baseline: the element functions of pagoda/host_convert.h and pagoda/fp8.h, one call per element, on "
      "the same data\n\n");
  fmt::print("{:>8} {:>18} {:>10} {:>12} {:>12}\n", "target", "conversion", "bulk us", "element us", "speed-up");
  int failures = 0;
  for (const std::string& target : o.targets) {
    if (Status s = cpu::select_simd_target(target); !s.ok()) {
      fmt::print(stderr, "target {}: {}\n", target, s.message());
      return 2;
    }
    for (Row& row : rows) {
      std::vector<double> bulk, element;
      // Alternate the two so that a busy neighbour slows both alike.
      for (int32_t r = 0; r < o.rounds; ++r) {
        bulk.push_back(time_us(row.bulk));
        element.push_back(time_us(row.element));
      }
      const double b = median(bulk), e = median(element);
      const bool same = row.same();
      failures += same ? 0 : 1;
      fmt::print("{:>8} {:>18} {:>10.2f} {:>12.2f} {:>11.1f}x{}\n", cpu::simd_target_name(), row.name, b, e, e / b,
                 same ? "" : "  OUTPUTS DIFFER");
    }
  }
  (void)cpu::select_simd_target("best");
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_convert_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ConvertOptions>();
  CLI::App* sub = app.add_subcommand(
      "convert", "Time the host's bulk dtype conversions and non-finite scan against the element functions");
  sub->add_option("--elements", o->elements, "elements per conversion")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 28));
  sub->add_option("--rounds", o->rounds, "alternating timed rounds of each (the median is reported)")
      ->check(CLI::Range(1, 100000));
  sub->add_option("--target", o->targets, "SIMD targets to run, in order (comma-separated): best, avx3, avx2")
      ->delimiter(',')
      ->check(CLI::IsMember({"best", "avx3", "avx2"}));
  sub->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace pagoda::bench
