// The two bf16 matrix units of the CPU kernel (kernels/cpu/amx_tiles.h and
// bf16_dot.h), on the operands bf16_blocks.h packs: scores and P.V against
// double sums of the same bf16 inputs, each within the bound on an fp32 sum of
// exact products. Skipped, with the reason, where the CPU lacks the unit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_dot.h"
#include "pagoda/cpu_targets.h"
#include "pagoda/host_convert.h"
#include "pagoda/vocabulary.h"

namespace pagoda::testing {
namespace {

using cpu::bf16::kPvKeys;
using cpu::bf16::kTileRows;

double bf16_value(uint16_t bits) { return static_cast<double>(bf16_to_float(bits)); }
double rounded(float x) { return bf16_value(float_to_bf16(x)); }
// The classic bound on an fp32 sum of n exact terms: gamma(n) times the sum of |terms|.
double gamma_bound(int n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

struct AmxOps {
  static constexpr const char* kMissing =
      "this CPU or its kernel offers no AMX-BF16 (lscpu flags amx_bf16 and amx_tile, Linux 5.16 or later granting the "
      "tile data)";
  static bool available() { return cpu::amx_available(); }
  static void scores(const uint16_t* qb, int32_t d, const cpu::bf16::KeyRows* keys, int32_t groups, int32_t rows,
                     float scale, float* out, int64_t out_stride) {
    const cpu::amx::TileScope tiles;
    cpu::amx::scores(qb, d, keys, groups, rows, scale, out, out_stride);
  }
  static void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t stride,
                         int32_t /*rows*/) {
    const cpu::amx::TileScope tiles;
    cpu::amx::accumulate(pa, vb, dv, acc, stride);
  }
};

struct DotOps {
  static constexpr const char* kMissing = "this CPU offers no AVX512-BF16 (lscpu flag avx512_bf16)";
  static bool available() { return cpu::avx512_bf16_available(); }
  static void scores(const uint16_t* qb, int32_t d, const cpu::bf16::KeyRows* keys, int32_t groups, int32_t rows,
                     float scale, float* out, int64_t out_stride) {
    cpu::bf16dot::scores(qb, d, keys, groups, rows, scale, out, out_stride);
  }
  static void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t stride,
                         int32_t rows) {
    cpu::bf16dot::accumulate(pa, vb, dv, acc, stride, rows);
  }
};

template <class Ops>
class Bf16Unit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Ops::available()) GTEST_SKIP() << Ops::kMissing;
  }
  std::mt19937 rng_{2024};
};

using Units = ::testing::Types<AmxOps, DotOps>;
class UnitName {
 public:
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, AmxOps> ? "Amx" : "Avx512Bf16";
  }
};
TYPED_TEST_SUITE(Bf16Unit, Units, UnitName);

// 3 and 5 rows (the dot products' keys-in-lanes form, one and two quads of
// rows) and 13 (a whole 16-row block).
TYPED_TEST(Bf16Unit, ScoresAreFp32SumsOfTheRoundedProductsForTheLiveRowsAndKeysOnly) {
  for (const int32_t d : {64, 128, 576}) {
    for (const int32_t rows : {3, 5, 13}) {
      SCOPED_TRACE("d " + std::to_string(d) + ", rows " + std::to_string(rows));
      constexpr float scale = 0.3f;
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<float> q(static_cast<size_t>(rows) * d);
      for (float& x : q) x = normal(this->rng_);
      // Two groups: 16 keys in place with a row stride wider than d, then 7
      // keys beside 9 zero rows.
      const int64_t stride = d + 32;
      std::vector<uint16_t> k0(static_cast<size_t>(16 * stride)), k1(static_cast<size_t>(16 * d), 0);
      for (uint16_t& x : k0) x = float_to_bf16(normal(this->rng_));
      for (int j = 0; j < 7 * d; ++j) k1[static_cast<size_t>(j)] = float_to_bf16(normal(this->rng_));
      const float* q_rows[kTileRows] = {};
      for (int r = 0; r < rows; ++r) q_rows[r] = q.data() + r * d;
      std::vector<uint16_t> qb(static_cast<size_t>(kTileRows) * d);
      cpu::bf16::pack_q(q_rows, d, qb.data());
      const cpu::bf16::KeyRows keys[2] = {{k0.data(), stride * 2, 16}, {k1.data(), d * 2, 7}};
      constexpr int64_t out_stride = 40;
      constexpr float kUntouched = -12345.f;
      std::vector<float> out(static_cast<size_t>(kTileRows) * out_stride, kUntouched);
      TypeParam::scores(qb.data(), d, keys, 2, rows, scale, out.data(), out_stride);
      for (int r = 0; r < kTileRows; ++r) {
        for (int j = 0; j < out_stride; ++j) {
          const float got = out[static_cast<size_t>(r * out_stride + j)];
          if (r >= rows || j >= 16 + 7) {
            ASSERT_EQ(got, kUntouched) << "row " << r << " key " << j << " is not one to write";
            continue;
          }
          const uint16_t* k = j < 16 ? k0.data() + j * stride : k1.data() + (j - 16) * d;
          double want = 0, magnitude = 0;
          for (int e = 0; e < d; ++e) {
            const double term = rounded(q[static_cast<size_t>(r * d + e)]) * bf16_value(k[e]);
            want += term;
            magnitude += std::abs(term);
          }
          ASSERT_NEAR(got, scale * want, gamma_bound(d + 1) * scale * magnitude) << "row " << r << " key " << j;
        }
      }
    }
  }
}

TYPED_TEST(Bf16Unit, PvAddsRoundedWeightsInsideEachRowsRangeAndZerosElsewhere) {
  for (const int32_t dv : {64, 128, 512}) {
    for (const int32_t rows : {4, 11, 16}) {
      SCOPED_TRACE("dv " + std::to_string(dv) + ", rows " + std::to_string(rows));
      std::uniform_real_distribution<float> unit(-1.f, 1.f);
      std::uniform_real_distribution<float> weight(0.f, 1.f);
      // 32 V rows, two of them absent (zero rows).
      std::vector<std::vector<uint16_t>> v(kPvKeys, std::vector<uint16_t>(static_cast<size_t>(dv)));
      const uint16_t* v_rows[kPvKeys];
      for (int j = 0; j < kPvKeys; ++j) {
        for (uint16_t& x : v[static_cast<size_t>(j)]) x = float_to_bf16(unit(this->rng_));
        v_rows[j] = (j == 3 || j == 30) ? nullptr : v[static_cast<size_t>(j)].data();
      }
      std::vector<uint16_t> vb(static_cast<size_t>(kPvKeys) * dv);
      cpu::bf16::pack_v(v_rows, dv, vb.data());
      // Ranges cycle through whole, inner, a single key at the end, and none.
      int32_t begin[kTileRows] = {};
      int32_t end[kTileRows] = {};
      for (int r = 0; r < rows; ++r) {
        const int32_t b[4] = {0, 5, 31, 9};
        const int32_t e[4] = {32, 17, 32, 9};
        begin[r] = b[r % 4];
        end[r] = e[r % 4];
      }
      std::vector<float> p(static_cast<size_t>(rows) * kPvKeys);
      for (float& x : p) x = weight(this->rng_);
      const float* p_rows[kTileRows] = {};
      for (int r = 0; r < rows; ++r) p_rows[r] = p.data() + r * kPvKeys;
      alignas(64) uint16_t pa[kTileRows * kPvKeys];
      cpu::bf16::pack_p(p_rows, begin, end, rows, pa);
      std::vector<float> acc(static_cast<size_t>(kTileRows) * dv);
      for (float& x : acc) x = unit(this->rng_);
      const std::vector<float> before = acc;
      TypeParam::accumulate(pa, vb.data(), dv, acc.data(), dv, rows);
      for (int r = 0; r < kTileRows; ++r) {
        for (int e = 0; e < dv; ++e) {
          const size_t i = static_cast<size_t>(r * dv + e);
          if (r >= rows || begin[r] >= end[r]) {
            ASSERT_EQ(std::memcmp(&acc[i], &before[i], sizeof(float)), 0) << "row " << r << " gained a nonzero";
            continue;
          }
          double want = before[i], magnitude = std::abs(before[i]);
          for (int j = begin[r]; j < end[r]; ++j) {
            if (v_rows[j] == nullptr) continue;
            const double term = rounded(p[static_cast<size_t>(r * kPvKeys + j)]) * bf16_value(v_rows[j][e]);
            want += term;
            magnitude += std::abs(term);
          }
          ASSERT_NEAR(acc[i], want, gamma_bound(kPvKeys + 1) * magnitude) << "row " << r << " element " << e;
        }
      }
    }
  }
}

// `first` starts the sums from zero whatever acc held.
TEST(Bf16DotUnit, FirstWritesTheSumsWithoutReadingTheAccumulator) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  constexpr int32_t dv = 128;
  std::vector<uint16_t> one_row(dv, float_to_bf16(0.5f));
  const uint16_t* v_rows[kPvKeys] = {};
  v_rows[7] = one_row.data();
  std::vector<uint16_t> vb(static_cast<size_t>(kPvKeys) * dv);
  cpu::bf16::pack_v(v_rows, dv, vb.data());
  std::vector<float> p(kPvKeys, 2.f);
  const float* p_rows[kTileRows] = {p.data()};
  const int32_t begin[kTileRows] = {0};
  const int32_t end[kTileRows] = {32};
  alignas(64) uint16_t pa[kTileRows * kPvKeys];
  cpu::bf16::pack_p(p_rows, begin, end, 1, pa);
  std::vector<float> acc(dv, std::nanf(""));
  cpu::bf16dot::accumulate(pa, vb.data(), dv, acc.data(), dv, 1, /*first=*/true);
  for (int e = 0; e < dv; ++e) ASSERT_EQ(acc[static_cast<size_t>(e)], 1.f) << "element " << e;
}

// 32 V rows of dv normal bf16 values, those `absent` says null (zero rows),
// and the same packed by bf16::pack_v.
struct RandomV {
  std::vector<uint16_t> values;
  const uint16_t* rows[kPvKeys];
  std::vector<uint16_t> packed;

  template <class Absent>
  RandomV(std::mt19937& rng, int32_t dv, const Absent& absent)
      : values(static_cast<size_t>(kPvKeys) * dv), packed(static_cast<size_t>(kPvKeys) * dv) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (uint16_t& x : values) x = float_to_bf16(normal(rng));
    for (int j = 0; j < kPvKeys; ++j) rows[j] = absent(j) ? nullptr : values.data() + j * dv;
    cpu::bf16::pack_v(rows, dv, packed.data());
  }
};

// 16 rows' weights over 32 keys, |normal|, row r's keys [begin(r), end(r)).
struct RandomWeights {
  std::vector<float> p;
  const float* rows[kTileRows];
  int32_t begin[kTileRows];
  int32_t end[kTileRows];

  template <class Begin, class End>
  RandomWeights(std::mt19937& rng, const Begin& first, const End& last)
      : p(static_cast<size_t>(kTileRows) * kPvKeys) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& x : p) x = std::abs(normal(rng));
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = p.data() + r * kPvKeys;
      begin[r] = first(r);
      end[r] = last(r);
    }
  }
};

// P.V goes in blocks of four rows where the rows come in fours, else of
// three: each output element is one chain over the pairs in order either way,
// so a row has the same bits alone, in 4, 8, 11 or 16 rows.
TEST(Bf16DotUnit, PvOfARowHasItsBitsWhateverTheRowsBesideIt) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const int32_t dv : {64, 128, 512}) {
    const RandomV v(rng, dv, [](int) { return false; });
    const std::vector<uint16_t>& vb = v.packed;
    const RandomWeights w(rng, [](int r) { return r % 3; }, [](int r) { return kPvKeys - r % 5; });
    std::vector<float> start(static_cast<size_t>(kTileRows) * dv);
    for (float& x : start) x = normal(rng);
    const auto run = [&](int32_t rows) {
      alignas(64) uint16_t pa[kTileRows * kPvKeys];
      cpu::bf16::pack_p(w.rows, w.begin, w.end, rows, pa);
      std::vector<float> acc = start;
      cpu::bf16dot::accumulate(pa, vb.data(), dv, acc.data(), dv, rows);
      return acc;
    };
    const std::vector<float> alone = run(1);
    const std::vector<float> all = run(kTileRows);
    for (const int32_t rows : {4, 8, 11}) {
      SCOPED_TRACE("dv " + std::to_string(dv) + ", rows " + std::to_string(rows));
      const std::vector<float> some = run(rows);
      for (int r = 0; r < rows; ++r) {
        for (int e = 0; e < dv; ++e) {
          const size_t i = static_cast<size_t>(r * dv + e);
          ASSERT_EQ(std::memcmp(&some[i], &all[i], sizeof(float)), 0) << "row " << r << " element " << e;
          if (r == 0) {
            ASSERT_EQ(std::memcmp(&some[i], &alone[i], sizeof(float)), 0) << "element " << e;
          }
        }
      }
    }
  }
}

// Up to 4 rows P.V may read V where it lies (accumulate_in_place): put back in
// element order, its sums have the bits of packed V's, from zero or from a
// running sum, with absent rows and partial ranges.
TEST(Bf16DotUnit, PvFromVInPlaceHasTheBitsOfPackedV) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(53);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const int32_t dv : {64, 128, 512}) {
    const RandomV v(rng, dv, [](int j) { return j == 0 || j == 19; });
    const std::vector<uint16_t>& vb = v.packed;
    const RandomWeights w(rng, [](int r) { return 3 * r; }, [](int r) { return kPvKeys - r; });
    std::vector<float> start(static_cast<size_t>(cpu::bf16dot::kInPlaceRows) * dv);
    for (float& x : start) x = normal(rng);
    for (int32_t rows = 1; rows <= cpu::bf16dot::kInPlaceRows; ++rows) {
      for (const bool first : {true, false}) {
        SCOPED_TRACE("dv " + std::to_string(dv) + ", rows " + std::to_string(rows) + (first ? ", first" : ""));
        alignas(64) uint16_t pa[kTileRows * kPvKeys];
        cpu::bf16::pack_p(w.rows, w.begin, w.end, rows, pa);
        std::vector<float> packed = start;
        cpu::bf16dot::accumulate(pa, vb.data(), dv, packed.data(), dv, rows, first);
        // The running sum in lane order, as the in-place form keeps it.
        std::vector<float> in_place = start;
        // Lane positions in element order: position[e] holds element e.
        std::vector<float> position(static_cast<size_t>(dv));
        for (int i = 0; i < dv; ++i) position[static_cast<size_t>(i)] = static_cast<float>(i);
        cpu::bf16dot::lanes_to_elements(position.data(), dv, 1, dv);
        for (int r = 0; r < rows; ++r) {
          for (int e = 0; e < dv; ++e) {
            const auto at = static_cast<size_t>(position[static_cast<size_t>(e)]);
            in_place[static_cast<size_t>(r * dv) + at] = start[static_cast<size_t>(r * dv + e)];
          }
        }
        cpu::bf16dot::accumulate_in_place(pa, v.rows, dv, in_place.data(), dv, rows, first);
        cpu::bf16dot::lanes_to_elements(in_place.data(), dv, rows, dv);
        for (int r = 0; r < rows; ++r) {
          for (int e = 0; e < dv; ++e) {
            const size_t i = static_cast<size_t>(r * dv + e);
            ASSERT_EQ(std::memcmp(&in_place[i], &packed[i], sizeof(float)), 0) << "row " << r << " element " << e;
          }
        }
      }
    }
  }
}

// 16 rows of normal q packed by pack_q, and two groups of normal bf16 keys
// (16 and 11 scored) `stride` elements apart, with the 16-row block's scores
// (row-major, 32 keys a row) from scores().
struct RandomKeyBlock {
  static constexpr int64_t kOutStride = 32;
  std::vector<float> q;
  const float* rows[kTileRows];
  std::vector<uint16_t> k0, k1;
  cpu::bf16::KeyRows keys[2];
  std::vector<uint16_t> qb;
  std::vector<float> block;

  RandomKeyBlock(std::mt19937& rng, int32_t d, int64_t stride)
      : q(static_cast<size_t>(kTileRows) * d),
        k0(static_cast<size_t>(16 * stride)),
        k1(static_cast<size_t>(16 * stride)),
        qb(static_cast<size_t>(kTileRows) * d),
        block(static_cast<size_t>(kTileRows) * kOutStride, 0.f) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& x : q) x = normal(rng);
    for (uint16_t& x : k0) x = float_to_bf16(normal(rng));
    for (uint16_t& x : k1) x = float_to_bf16(normal(rng));
    keys[0] = {k0.data(), stride * 2, 16};
    keys[1] = {k1.data(), stride * 2, 11};
    for (int r = 0; r < kTileRows; ++r) rows[r] = q.data() + r * d;
    cpu::bf16::pack_q(rows, d, qb.data());
    cpu::bf16dot::scores(qb.data(), d, keys, 2, kTileRows, 0.125f, block.data(), kOutStride);
  }
};

// Up to 8 rows the scores put keys in the lanes too (a quad of rows per key),
// or score keys packed pair by pair (bf16::pack_k, then scores_packed, the
// short group's missing keys packed as zeros); 9 to 16 put only rows in the
// lanes. A row's score is the same chain in every form: the same bits with 1
// to 8 rows as in a block of 16, for both groups, the cache's stride and a
// run-time one.
TEST(Bf16DotUnit, ScoresOfUpTo8RowsHaveTheBitsOfA16RowBlock) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(7);
  for (const int32_t d : {64, 128, 256, 576}) {
    for (const int64_t stride : {int64_t{d}, int64_t{d} + 32}) {
      const RandomKeyBlock b(rng, d, stride);
      constexpr int64_t out_stride = RandomKeyBlock::kOutStride;
      std::vector<uint16_t> kb0(static_cast<size_t>(kTileRows) * d), kb1(static_cast<size_t>(kTileRows) * d);
      cpu::bf16::pack_k(b.k0.data(), stride * 2, 16, d, kb0.data());
      cpu::bf16::pack_k(b.k1.data(), stride * 2, 11, d, kb1.data());
      const cpu::bf16::KeyRows packed[2] = {{kb0.data(), 2 * static_cast<int64_t>(d), 16},
                                            {kb1.data(), 2 * static_cast<int64_t>(d), 11}};
      for (const int32_t rows : {1, 2, 3, 4, 5, 7, 8}) {
        for (const int32_t groups : {1, 2}) {
          const float* few_rows[kTileRows] = {};
          for (int r = 0; r < rows; ++r) few_rows[r] = b.rows[r];
          std::vector<uint16_t> qf(static_cast<size_t>(kTileRows) * d);
          cpu::bf16::pack_q(few_rows, d, qf.data());
          for (const bool pairs : {false, true}) {
            SCOPED_TRACE("d " + std::to_string(d) + ", stride " + std::to_string(stride) + ", rows " +
                         std::to_string(rows) + ", groups " + std::to_string(groups) +
                         (pairs ? ", keys packed pair by pair" : ", keys in place"));
            std::vector<float> few(static_cast<size_t>(kTileRows) * out_stride, 0.f);
            if (pairs) {
              cpu::bf16dot::scores_packed(qf.data(), d, packed, groups, rows, 0.125f, few.data(), out_stride);
            } else {
              cpu::bf16dot::scores(qf.data(), d, b.keys, groups, rows, 0.125f, few.data(), out_stride);
            }
            for (int r = 0; r < rows; ++r) {
              for (int j = 0; j < 16 + (groups == 2 ? 11 : 0); ++j) {
                const size_t i = static_cast<size_t>(r * out_stride + j);
                ASSERT_EQ(std::memcmp(&few[i], &b.block[i], sizeof(float)), 0)
                    << "row " << r << " key " << j << ": " << few[i] << " against " << b.block[i];
              }
            }
          }
        }
      }
    }
  }
}

// Blocks of 9 to 16 rows keep their scores key-major (scores_by_key): the
// scores() of the same block, key by key, for both groups, the keys past a
// short group's n left as they were; two blocks at once (the second q block
// the first's rows in reverse order) each give what one alone does.
TEST(Bf16DotUnit, KeyMajorScoresAreTheBlocksScoresKeyByKey) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(11);
  static constexpr float kUntouched = -7.f;
  const auto expect_block = [](const std::vector<float>& key_major, const std::vector<float>& row_major,
                               const char* which) {
    SCOPED_TRACE(which);
    for (int j = 0; j < 32; ++j) {
      for (int r = 0; r < kTileRows; ++r) {
        const float got = key_major[static_cast<size_t>(j * kTileRows + r)];
        if (j >= 16 + 11) {
          ASSERT_EQ(got, kUntouched) << "key " << j << " is past the second group's 11";
          continue;
        }
        const float want = row_major[static_cast<size_t>(r * RandomKeyBlock::kOutStride + j)];
        ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "row " << r << " key " << j;
      }
    }
  };
  for (const int32_t d : {64, 128, 576}) {
    for (const int64_t stride : {int64_t{d}, int64_t{d} + 32}) {
      SCOPED_TRACE("d " + std::to_string(d) + ", stride " + std::to_string(stride));
      const RandomKeyBlock b(rng, d, stride);
      std::vector<float> key_major(static_cast<size_t>(32) * kTileRows, kUntouched);
      cpu::bf16dot::scores_by_key(b.qb.data(), d, b.keys, 2, 0.125f, key_major.data());
      expect_block(key_major, b.block, "one block");

      const float* reversed[kTileRows];
      for (int r = 0; r < kTileRows; ++r) reversed[r] = b.rows[kTileRows - 1 - r];
      std::vector<uint16_t> qb2(b.qb.size());
      cpu::bf16::pack_q(reversed, d, qb2.data());
      std::vector<float> row_major2(b.block.size(), 0.f);
      cpu::bf16dot::scores(qb2.data(), d, b.keys, 2, kTileRows, 0.125f, row_major2.data(),
                           RandomKeyBlock::kOutStride);
      std::vector<float> first(key_major.size(), kUntouched);
      std::vector<float> second(key_major.size(), kUntouched);
      cpu::bf16dot::scores_by_key(b.qb.data(), d, b.keys, 2, 0.125f, first.data(), {}, qb2.data(), second.data());
      expect_block(first, b.block, "first of two blocks");
      expect_block(second, row_major2, "second of two blocks");
    }
  }
}

// Key-major weights packed pair-major (pack_p_pairs) give P.V the bits of the
// same weights row-major (pack_p), with the pairs outside the written range
// zero whatever the buffer holds there.
TEST(Bf16DotUnit, PvOfPairMajorWeightsHasTheBitsOfRowMajorOnes) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(67);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const int32_t dv : {64, 128, 512}) {
    const RandomV v(rng, dv, [](int j) { return j == 5; });
    // Weights of the pairs [first, end): keys [2 first, 2 end) for every row,
    // as a key-major softmax leaves them (zero outside each row's keys).
    const int32_t first = 2;
    const int32_t end = 13;
    const RandomWeights w(rng, [](int r) { return r % 7 + 4; }, [](int r) { return 26 - r % 4; });
    std::vector<float> key_major(static_cast<size_t>(kPvKeys) * kTileRows, std::nanf(""));
    for (int j = 2 * first; j < 2 * end; ++j) {
      for (int r = 0; r < kTileRows; ++r) {
        const bool attends = j >= w.begin[r] && j < w.end[r];
        key_major[static_cast<size_t>(j * kTileRows + r)] = attends ? w.p[static_cast<size_t>(r * kPvKeys + j)] : 0.f;
      }
    }
    alignas(64) uint16_t by_rows[kTileRows * kPvKeys];
    alignas(64) uint16_t by_pairs[kTileRows * kPvKeys];
    cpu::bf16::pack_p(w.rows, w.begin, w.end, kTileRows, by_rows);
    cpu::bf16::pack_p_pairs(key_major.data(), first, end, by_pairs);
    std::vector<float> start(static_cast<size_t>(kTileRows) * dv);
    for (float& x : start) x = normal(rng);
    for (const int32_t rows : {16, 12, 9}) {
      for (const bool from_zero : {true, false}) {
        SCOPED_TRACE("dv " + std::to_string(dv) + ", rows " + std::to_string(rows) + (from_zero ? ", first" : ""));
        std::vector<float> want = start;
        std::vector<float> got = start;
        cpu::bf16dot::accumulate(by_rows, v.packed.data(), dv, want.data(), dv, rows, from_zero);
        cpu::bf16dot::accumulate(by_pairs, v.packed.data(), dv, got.data(), dv, rows, from_zero,
                                 cpu::bf16::PLayout::kPairMajor);
        for (int r = 0; r < rows; ++r) {
          for (int e = 0; e < dv; ++e) {
            const size_t i = static_cast<size_t>(r * dv + e);
            ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "row " << r << " element " << e;
          }
        }
      }
    }
  }
}

// pack_q's layout, word by word: pair k of row r (q[r][2k] in the low half,
// q[r][2k + 1] in the high, each rounded to nearest bf16) at word 16k + r, a
// missing row's words zero, for every head_dim of the vocabulary.
TEST(Bf16Pack, QIsEachPairOfTheSixteenRowsSideBySide) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (const int32_t d : kHeadDims) {
    std::vector<float> q(static_cast<size_t>(kTileRows) * d);
    for (float& x : q) x = normal(rng);
    const float* rows[kTileRows];
    for (int r = 0; r < kTileRows; ++r) rows[r] = r % 5 == 3 ? nullptr : q.data() + static_cast<size_t>(r) * d;
    std::vector<uint16_t> qb(static_cast<size_t>(kTileRows) * d, 0xFFFF);
    cpu::bf16::pack_q(rows, d, qb.data());
    for (int32_t k = 0; k < d / 2; ++k) {
      for (int r = 0; r < kTileRows; ++r) {
        const size_t word = static_cast<size_t>(k) * kTileRows + r;
        const uint16_t lo = rows[r] ? float_to_bf16(rows[r][2 * k]) : 0;
        const uint16_t hi = rows[r] ? float_to_bf16(rows[r][2 * k + 1]) : 0;
        ASSERT_EQ(qb[2 * word], lo) << "d " << d << ", pair " << k << ", row " << r << ": low half";
        ASSERT_EQ(qb[2 * word + 1], hi) << "d " << d << ", pair " << k << ", row " << r << ": high half";
      }
    }
  }
}

TEST(Bf16DotUnit, PeakIsMeasuredAndPlausible) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << DotOps::kMissing;
  const double one = cpu::measure_bf16_dot_peak(1);
  EXPECT_GT(one, 1e9);
  EXPECT_LT(one, 1e13) << "more means the loop was optimised away";
}

}  // namespace
}  // namespace pagoda::testing
