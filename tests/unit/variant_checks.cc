#include "unit/variant_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>

#include <fmt/format.h>

#include "reference/decode_table.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

constexpr int32_t kSplit = 512;
// Sequences of every length class: empty, one token, the longest draft, a
// block edge and past it, mid-chunk, and past a chunk edge mid-block.
constexpr int32_t kLengths[] = {0, 1, 5, 16, 17, 600, 1100};

CacheGeometry geometry(const VariantCase& c) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 2 * c.gqa;
  g.head_dim = 64;
  g.block_size = c.block_size;
  g.dtype = c.cache;
  int32_t blocks = 32;
  for (int32_t len : kLengths) blocks += (len + c.block_size) / c.block_size * 3;  // forks and truncations
  g.num_blocks = blocks;
  return g;
}

FixtureOptions options(const std::string& backend, const CacheGeometry& g, int32_t threads, uint64_t seed) {
  FixtureOptions o;
  o.geometry = g;
  o.threads = threads;
  o.seed = seed;
  o.backend = backend;
  return o;
}

std::vector<float> random_sinks(std::mt19937_64& rng, int32_t heads) {
  std::uniform_real_distribution<float> u(-2.f, 4.f);
  std::vector<float> s(static_cast<size_t>(heads));
  for (float& x : s) x = u(rng);
  return s;
}

// One query row of `q` as Queries of its own.
CacheFixture::Queries row_of(const CacheFixture::Queries& q, int32_t row, int32_t row_elems) {
  CacheFixture::Queries one;
  one.dtype = q.dtype;
  const size_t first = static_cast<size_t>(row) * row_elems;
  const size_t elem = dtype_size(q.dtype);
  one.values.assign(q.values.begin() + first, q.values.begin() + first + row_elems);
  one.bytes.assign(q.bytes.begin() + first * elem, q.bytes.begin() + (first + row_elems) * elem);
  return one;
}

}  // namespace

std::string to_string(const VariantCase& c) {
  return fmt::format("bs{}_gqa{}_kv{}", c.block_size, c.gqa, dtype_name(c.cache));
}
void PrintTo(const VariantCase& c, std::ostream* os) { *os << to_string(c); }

std::vector<VariantCase> variant_table() {
  std::vector<VariantCase> cases;
  for (int32_t bs : {1, 16})
    for (int32_t gqa : {1, 4})
      for (DType cache : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2})
        cases.push_back({bs, gqa, cache});
  return cases;
}

void expect_variants_match_reference(const std::string& backend, const VariantCase& c, SplitMode mode) {
  const CacheGeometry g = geometry(c);
  CacheFixture f(options(backend, g, 2, 77));
  std::vector<SequenceId> all;
  for (int32_t len : kLengths) all.push_back(f.add_sequence(0, len));
  const float scale = 1.f / 8.f;
  const std::vector<int32_t> q_lens =
      mode == SplitMode::kDeterministic ? std::vector<int32_t>{1, 2, 5, 16} : std::vector<int32_t>{3, 16};
  for (int32_t q_len : q_lens) {
    for (int32_t window : {0, 1, 17, 600}) {
      for (float cap : {0.f, 30.f}) {
        for (bool sinks : {false, true}) {
          SCOPED_TRACE(fmt::format("q_len {} window {} soft_cap {} sinks {}", q_len, window, cap, sinks));
          CacheFixture::Variant v;
          v.window = window;
          v.soft_cap = cap;
          if (sinks) v.sinks = random_sinks(f.rng(), g.num_q_heads);
          std::vector<SequenceId> ids;
          for (size_t i = 0; i < std::size(kLengths); ++i) {
            if (kLengths[i] >= q_len || (q_len == 1 && kLengths[i] == 0)) {
              ids.push_back(all[i]);
              v.q_lengths.push_back(q_len);
            }
          }
          const auto q = f.random_queries(static_cast<int32_t>(ids.size()) * q_len, DType::kFloat32);
          const auto got = f.decode(0, ids, q, scale, mode, kSplit, v);
          const Arithmetic arithmetic = arithmetic_of(backend, g);
          const auto want = f.reference(0, ids, as_multiplied(q, arithmetic), scale, v);
          expect_matches_reference(got.out, got.lse, want, DType::kFloat32, arithmetic);
        }
      }
    }
  }
}

void expect_empty_sequence_gives_zero_and_the_sink(const std::string& backend) {
  const CacheGeometry g = geometry({16, 4, DType::kFloat16});
  CacheFixture f(options(backend, g, 1, 5));
  const SequenceId empty = f.add_sequence(0, 0);
  CacheFixture::Variant v;
  v.sinks = random_sinks(f.rng(), g.num_q_heads);
  const auto q = f.random_queries(1, DType::kFloat32);
  const auto got = f.decode(0, {empty}, q, 0.125f, SplitMode::kDeterministic, kSplit, v);
  for (float x : got.out) ASSERT_EQ(x, 0.f);
  for (int32_t h = 0; h < g.num_q_heads; ++h) EXPECT_NEAR(got.lse[static_cast<size_t>(h)], v.sinks[h], 1e-6f);
  EXPECT_EQ(got.splits[0], 0) << "no chunk is launched for no key";
}

void expect_chunks_outside_the_window_not_launched(const std::string& backend) {
  const CacheGeometry g = geometry({16, 4, DType::kFloat16});
  CacheFixture f(options(backend, g, 1, 6));
  const SequenceId s = f.add_sequence(0, 1100);  // chunks [0, 512), [512, 1024), [1024, 1100)
  const auto q = f.random_queries(1, DType::kFloat32);
  CacheFixture::Variant v;
  v.window = 100;  // keys 1000..1099: the last two chunks
  EXPECT_EQ(f.decode(0, {s}, q, 0.125f, SplitMode::kDeterministic, kSplit, v).splits[0], 2);
  v.window = 50;  // keys 1050..1099: the last chunk
  EXPECT_EQ(f.decode(0, {s}, q, 0.125f, SplitMode::kDeterministic, kSplit, v).splits[0], 1);
  v.window = 0;
  EXPECT_EQ(f.decode(0, {s}, q, 0.125f, SplitMode::kDeterministic, kSplit, v).splits[0], 3);
}

void expect_draft_rows_have_single_step_bits(const std::string& backend, int32_t threads, const VariantCase& c) {
  const CacheGeometry g = geometry(c);
  CacheFixture f(options(backend, g, threads, 91));
  const SequenceId other = f.add_sequence(0, 700);
  const SequenceId s = f.add_sequence(0, 1100);
  const int32_t n = 5;
  const int32_t row_elems = g.num_q_heads * g.head_dim;
  const size_t row_bytes = static_cast<size_t>(row_elems) * 4;
  for (int32_t window : {0, 100, 600}) {
    for (float cap : {0.f, 30.f}) {
      for (bool sinks : {false, true}) {
        SCOPED_TRACE(fmt::format("{} threads {} window {} soft_cap {} sinks {}", to_string(c), threads, window, cap,
                                 sinks));
        CacheFixture::Variant v;
        v.window = window;
        v.soft_cap = cap;
        if (sinks) v.sinks = random_sinks(f.rng(), g.num_q_heads);
        v.q_lengths = {3, n};
        const auto q = f.random_queries(3 + n, DType::kFloat32);
        const auto multi = f.decode(0, {other, s}, q, 0.125f, SplitMode::kDeterministic, kSplit, v);
        for (int32_t i = 0; i < n; ++i) {
          auto step = f.cache().fork(s);
          ASSERT_TRUE(step.ok());
          ASSERT_TRUE(f.cache().truncate(*step, 1100 - n + i + 1).ok());
          CacheFixture::Variant single = v;
          single.q_lengths.clear();
          const auto one = f.decode(0, {*step}, row_of(q, 3 + i, row_elems), 0.125f, SplitMode::kDeterministic,
                                    kSplit, single);
          ASSERT_TRUE(f.cache().free(*step).ok());
          EXPECT_EQ(0, std::memcmp(one.out_bytes.data(), multi.out_bytes.data() + (3 + i) * row_bytes, row_bytes))
              << "row " << i << " differs from its single-step decode";
          EXPECT_EQ(0, std::memcmp(one.lse.data(), multi.lse.data() + (3 + i) * g.num_q_heads,
                                   static_cast<size_t>(g.num_q_heads) * sizeof(float)))
              << "lse of row " << i;
        }
      }
    }
  }
}

}  // namespace pagoda::testing
