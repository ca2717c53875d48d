// Quantized kernels (kernels/qgemm.h): every ISA path bit-identical to the
// scalar reference on awkward sizes, the reference close to the exact f32
// MatMul, and results independent of batch size, composition and threads.
#include "kernels/qgemm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/quant.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct QuantMatrix {
  std::string bytes;
  WeightView view;
};

bool IsKType(TensorType t) {
  return t == TensorType::kQ4_K || t == TensorType::kQ5_K || t == TensorType::kQ6_K;
}

// K-quant rows of random bytes (every quant, 6-bit scale / min and int8
// scale pattern occurs) with sane f16 super-block scales.
void RandomKRow(TensorType type, int64_t cols, uint8_t* dst, std::mt19937* rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const int bytes = type == TensorType::kQ4_K ? 144 : type == TensorType::kQ5_K ? 176 : 210;
  for (int64_t sb = 0; sb < cols / 256; ++sb) {
    uint8_t* b = dst + sb * bytes;
    for (int i = 0; i < bytes; ++i) b[i] = uint8_t(byte(*rng));
    const uint16_t d = Fp32ToFp16(scale(*rng)), dmin = Fp32ToFp16(scale(*rng));
    if (type == TensorType::kQ6_K) {
      std::memcpy(b + 208, &d, 2);
    } else {
      std::memcpy(b, &d, 2);
      std::memcpy(b + 2, &dmin, 2);
    }
  }
}

QuantMatrix MakeMatrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  QuantMatrix m;
  const int64_t row_bytes = static_cast<int64_t>(*gguf::RowBytes(type, cols));
  m.bytes.resize(rows * row_bytes);
  if (IsKType(type)) {
    std::mt19937 rng(seed);
    for (int64_t r = 0; r < rows; ++r) {
      RandomKRow(type, cols, reinterpret_cast<uint8_t*>(m.bytes.data()) + r * row_bytes, &rng);
    }
    m.view = WeightView{type, m.bytes.data(), rows, cols, row_bytes};
    return m;
  }
  const std::vector<float> v = Random(rows * cols, seed);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(type, v.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
  }
  m.view = WeightView{type, m.bytes.data(), rows, cols, row_bytes};
  return m;
}

std::vector<std::string> Isas() {
  std::vector<std::string> out;
  for (const char* isa : {"amx", "avx512vnni", "avx2", "scalar"}) {
    if (SetQGemmIsaForTesting(isa)) out.push_back(isa);
  }
  static bool printed = false;
  if (!printed) {
    printed = true;
    std::printf("ISA paths on this machine:");
    for (const std::string& isa : out) std::printf(" %s", isa.c_str());
    std::printf("\n");
  }
  return out;
}

class IsaGuard {
 public:
  IsaGuard() : saved_(QGemmIsa()) {}
  ~IsaGuard() { SetQGemmIsaForTesting(saved_); }

 private:
  std::string saved_;
};

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class QGemmTest : public ::testing::TestWithParam<TensorType> {};

// Column counts a type permits: several blocks, and for the K types several
// 256-column super-blocks (576 = SmolLM2's hidden size, not a multiple of
// 256, only for the legacy types).
std::vector<int64_t> ColsFor(TensorType t) {
  if (IsKType(t)) return {256, 512, 768};
  return {32, 96, 576};
}

// Both activation precisions on every check.
constexpr int kLevels[] = {1, 2};

TEST_P(QGemmTest, EveryIsaMatchesScalarReferenceBitForBit) {
  IsaGuard guard;
  ThreadPool pool(3);
  for (int64_t rows : {1, 15, 16, 17, 45, 100}) {
    for (int64_t cols : ColsFor(GetParam())) {
      const QuantMatrix m = MakeMatrix(GetParam(), rows, cols, uint32_t(rows * 7 + cols));
      const PackedWeight p = PackedWeight::Pack(m.view, &pool);
      for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 16, 17, 37, 64}) {
        for (int levels : kLevels) {
          const std::vector<float> x = Random(n * cols, uint32_t(n + rows), 3.f);
          QuantizedActs ref_acts, acts;
          ref::QuantizeActs(x.data(), n, cols, &ref_acts, levels);
          std::vector<float> want(n * rows), base = Random(n * rows, 5);
          ref::QGemm(p, ref_acts, want.data(), rows, false);
          std::vector<float> want_acc = base;
          ref::QGemm(p, ref_acts, want_acc.data(), rows, true);
          for (const std::string& isa : Isas()) {
            ASSERT_TRUE(SetQGemmIsaForTesting(isa));
            QuantizeActs(x.data(), n, cols, &acts, levels);
            ASSERT_EQ(acts.qs, ref_acts.qs) << isa;
            ASSERT_EQ(acts.qs2, ref_acts.qs2) << isa;
            ASSERT_EQ(acts.sd, ref_acts.sd) << isa;
            ASSERT_EQ(acts.s_lo, ref_acts.s_lo) << isa;
            std::vector<float> got(n * rows, -1.f), got_acc = base;
            QGemm(p, acts, got.data(), rows, false, &pool);
            QGemm(p, acts, got_acc.data(), rows, true, &pool);
            ASSERT_TRUE(BitEqual(got, want))
                << isa << " rows " << rows << " cols " << cols << " n " << n;
            ASSERT_TRUE(BitEqual(got_acc, want_acc)) << isa << " accumulate";
          }
        }
      }
    }
  }
}

TEST_P(QGemmTest, CloseToExactF32MatMul) {
  for (int levels : kLevels) {
    const int64_t rows = 37, cols = 256, n = 5;
    const QuantMatrix m = MakeMatrix(GetParam(), rows, cols, 11);
    const PackedWeight p = PackedWeight::Pack(m.view, nullptr);
    const std::vector<float> x = Random(n * cols, 12);
    std::vector<float> want(n * rows), got(n * rows);
    ref::MatMul(m.view, x.data(), n, want.data());
    QuantizedActs acts;
    QuantizeActs(x.data(), n, cols, &acts, levels);
    QGemm(p, acts, got.data(), rows, false, nullptr);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n * rows; ++i) {
      err += (got[i] - want[i]) * double(got[i] - want[i]);
      norm += want[i] * double(want[i]);
    }
    // int8 activations: relative error of a dot about 1/127 / sqrt(block);
    // two levels: about 1/127 of that.
    EXPECT_LT(std::sqrt(err / norm), levels == 1 ? 0.01 : 2e-4) << levels;
  }
}

TEST_P(QGemmTest, BatchInvariantAndThreadInvariant) {
  const int64_t rows = 70, cols = IsKType(GetParam()) ? 512 : 192;
  const QuantMatrix m = MakeMatrix(GetParam(), rows, cols, 3);
  const PackedWeight p = PackedWeight::Pack(m.view, nullptr);
  const std::vector<float> x = Random(37 * cols, 4);
  ThreadPool one(1), two(2);
  QuantizedActs all, single;
  QuantizeActs(x.data(), 37, cols, &all, kDefaultActLevels);
  std::vector<float> batched(37 * rows), batched2(37 * rows);
  QGemm(p, all, batched.data(), rows, false, &one);
  QGemm(p, all, batched2.data(), rows, false, &two);
  EXPECT_TRUE(BitEqual(batched, batched2));
  for (int64_t t : {0, 7, 36}) {
    QuantizeActs(x.data() + t * cols, 1, cols, &single, kDefaultActLevels);
    std::vector<float> alone(rows);
    QGemm(p, single, alone.data(), rows, false, &two);
    EXPECT_EQ(std::memcmp(alone.data(), batched.data() + t * rows, rows * 4), 0) << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QGemmTest,
                         ::testing::Values(TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                                           TensorType::kQ5_1, TensorType::kQ8_0, TensorType::kQ4_K,
                                           TensorType::kQ5_K, TensorType::kQ6_K));

// Weight (r, c) as the packed chunk describes it: D * q + M (kF32), or
// D_lo / D_hi * (q - 32) (kF32Halves), in f32 as DequantizeRow rounds it.
float PackedWeightAt(const PackedWeight& p, int64_t r, int64_t c) {
  const uint8_t* chunk = p.chunk(r / kGroupRows, c / kQBlock);
  const int rr = int(r % kGroupRows), k = int(c % kQBlock);
  const int q = PackedQuantAt(chunk, p.bits(), rr, k);
  const float s0 = PackedScaleAt(p, r / kGroupRows, c / kQBlock, 0, rr);
  const float s1 = PackedScaleAt(p, r / kGroupRows, c / kQBlock, 1, rr);
  if (p.scale_format() == ScaleFormat::kF32Halves) return (k < 16 ? s0 : s1) * float(q - 32);
  return s0 * float(q) + s1;
}

// The K-type repack is exact: every packed weight equals DequantizeRow's.
TEST(QGemmKQuantTest, PackedWeightsEqualDequantizeRow) {
  for (TensorType type : {TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    const int64_t rows = 19, cols = 512;
    const QuantMatrix m = MakeMatrix(type, rows, cols, 77);
    const PackedWeight p = PackedWeight::Pack(m.view, nullptr);
    ASSERT_EQ(p.scale_format(),
              type == TensorType::kQ6_K ? ScaleFormat::kF32Halves : ScaleFormat::kF32);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, m.view.row(r), row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(PackedWeightAt(p, r, c), row[c]) << int(type) << " r " << r << " c " << c;
      }
    }
  }
}

// The K types' packed size: 32 scale bytes per chunk plus the super-block
// scales once per 8 chunks (kernels/qgemm.h), close to the GGUF sizes.
TEST(QGemmKQuantTest, PackedBitsPerWeight) {
  const struct {
    TensorType type;
    double bits;
  } cases[] = {{TensorType::kQ4_K, 4.75}, {TensorType::kQ5_K, 5.75}, {TensorType::kQ6_K, 6.625}};
  for (const auto& c : cases) {
    const QuantMatrix m = MakeMatrix(c.type, 32, 768, 3);
    const PackedWeight p = PackedWeight::Pack(m.view, nullptr);
    EXPECT_EQ(double(p.bytes()) * 8.0 / (32.0 * 768.0), c.bits) << int(c.type);
    EXPECT_EQ(p.bytes(), PackedWeight::PackedBytes(&m.view, 1));
  }
}

// A stack of two views of one K type equals the two packed apart.
// The legacy types' repack (nibbles, bit planes, bytes) keeps every quant:
// d * (q - offset) is exactly DequantizeRow's weight (f16 d times a small
// integer is exact in f32); with a min, d * q + m rounds once or (fused)
// not at all.
TEST(QGemmLegacyTest, PackedWeightsEqualDequantizeRow) {
  for (TensorType type : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                          TensorType::kQ5_1, TensorType::kQ8_0}) {
    const int64_t rows = 21, cols = 96;
    const QuantMatrix m = MakeMatrix(type, rows, cols, 5);
    const PackedWeight p = PackedWeight::Pack(m.view, nullptr);
    const int want_bits = type == TensorType::kQ8_0                                ? 8
                          : type == TensorType::kQ5_0 || type == TensorType::kQ5_1 ? 5
                                                                                   : 4;
    ASSERT_EQ(p.bits(), want_bits);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, m.view.row(r), row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t* chunk = p.chunk(r / kGroupRows, c / kQBlock);
        const int rr = int(r % kGroupRows);
        const int q = PackedQuantAt(chunk, p.bits(), rr, int(c % kQBlock));
        ASSERT_GE(q, 0);
        ASSERT_LT(q, 1 << p.bits());
        uint16_t hd;
        std::memcpy(&hd, chunk + p.bits() * 64 + 2 * rr, 2);
        const float d = Fp16ToFp32(hd);
        if (p.has_min()) {  // m[16] follows d[16] only in types with a min
          uint16_t hm;
          std::memcpy(&hm, chunk + p.bits() * 64 + 32 + 2 * rr, 2);
          const float mn = Fp16ToFp32(hm);
          ASSERT_TRUE(row[c] == d * float(q) + mn || row[c] == std::fma(d, float(q), mn))
              << int(type) << " r " << r << " c " << c;
        } else {
          ASSERT_EQ(d * float(q - p.offset()), row[c]) << int(type) << " r " << r << " c " << c;
        }
      }
    }
  }
}

TEST(QGemmKQuantTest, StackedQ6KEqualsSeparate) {
  const QuantMatrix a = MakeMatrix(TensorType::kQ6_K, 20, 256, 1);
  const QuantMatrix b = MakeMatrix(TensorType::kQ6_K, 9, 256, 2);
  const WeightView views[2] = {a.view, b.view};
  const PackedWeight ab = PackedWeight::Pack(views, 2, nullptr);
  const PackedWeight pb = PackedWeight::Pack(b.view, nullptr);
  const std::vector<float> x = Random(3 * 256, 9);
  QuantizedActs acts;
  QuantizeActs(x.data(), 3, 256, &acts, kDefaultActLevels);
  std::vector<float> y(3 * 29), yb(3 * 9);
  QGemm(ab, acts, y.data(), 29, false, nullptr);
  QGemm(pb, acts, yb.data(), 9, false, nullptr);
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(std::memcmp(y.data() + t * 29 + 20, yb.data() + t * 9, 36), 0);
}

TEST(QGemmStackTest, StackedViewsEqualSeparate) {
  const QuantMatrix a = MakeMatrix(TensorType::kQ4_1, 20, 64, 1);
  const QuantMatrix b = MakeMatrix(TensorType::kQ4_1, 9, 64, 2);
  const WeightView views[2] = {a.view, b.view};
  const PackedWeight ab = PackedWeight::Pack(views, 2, nullptr);
  const PackedWeight pa = PackedWeight::Pack(a.view, nullptr),
                     pb = PackedWeight::Pack(b.view, nullptr);
  ASSERT_EQ(ab.rows(), 29);
  const std::vector<float> x = Random(3 * 64, 9);
  QuantizedActs acts;
  QuantizeActs(x.data(), 3, 64, &acts);
  std::vector<float> y(3 * 29), ya(3 * 20), yb(3 * 9);
  QGemm(ab, acts, y.data(), 29, false, nullptr);
  QGemm(pa, acts, ya.data(), 20, false, nullptr);
  QGemm(pb, acts, yb.data(), 9, false, nullptr);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(std::memcmp(y.data() + t * 29, ya.data() + t * 20, 20 * 4), 0);
    EXPECT_EQ(std::memcmp(y.data() + t * 29 + 20, yb.data() + t * 9, 9 * 4), 0);
  }
}

// Activation quantization alone, on rows of 1..50 blocks (AVX-512 reduces 16
// blocks at a time), with all-zero blocks (dx = 0) and both scale modes:
// every ISA path gives the reference's quants, scales and sums.
TEST(QuantizeActsTest, EveryIsaMatchesReferenceOnAnyRowLength) {
  IsaGuard guard;
  for (int64_t cols : {32, 480, 512, 544, 576, 1536, 1600}) {
    const int64_t n = 3;
    std::vector<float> x = Random(n * cols, uint32_t(cols), 4.f);
    std::fill(x.begin() + cols, x.begin() + cols + 32, 0.f);  // token 1, block 0
    if (cols > 512) std::fill(x.begin() + 2 * cols + 480, x.begin() + 2 * cols + 512, 0.f);
    for (int levels : kLevels) {
      for (ActScale scale : {ActScale::kPerBlock, ActScale::kPerToken}) {
        QuantizedActs want, got;
        ref::QuantizeActs(x.data(), n, cols, &want, levels, scale);
        for (const std::string& isa : Isas()) {
          ASSERT_TRUE(SetQGemmIsaForTesting(isa));
          QuantizeActs(x.data(), n, cols, &got, levels, nullptr, scale);
          const std::string where = isa + " cols " + std::to_string(cols) + " levels " +
                                    std::to_string(levels) + " per-token " +
                                    std::to_string(scale == ActScale::kPerToken);
          ASSERT_EQ(got.qs, want.qs) << where;
          ASSERT_EQ(got.qs2, want.qs2) << where;
          ASSERT_EQ(got.d, want.d) << where;
          ASSERT_EQ(got.s, want.s) << where;
          ASSERT_EQ(got.s_lo, want.s_lo) << where;
          ASSERT_EQ(got.sd, want.sd) << where;
        }
      }
    }
  }
}

// The fused SwiGLU + quantization gives the same bytes on every SIMD path
// (AVX2 runs the AVX-512 exp step for step), including large |gate| where
// exp's argument is clamped.
TEST(QuantizeActsTest, SiluMulQuantizeSameOnEverySimdPath) {
  IsaGuard guard;
  for (int64_t ffn : {32, 96, 1536}) {
    const int64_t n = 4;
    std::vector<float> gu = Random(n * 2 * ffn, uint32_t(ffn), 8.f);
    gu[3] = 95.f;  // clamped at 88 inside exp
    gu[5] = -120.f;
    gu[ffn + 7] = 0.f;
    for (int levels : kLevels) {
      QuantizedActs want, got;
      bool first = true;
      for (const std::string& isa : Isas()) {
        if (isa == "scalar") continue;  // std::exp: a different (reference) exp
        ASSERT_TRUE(SetQGemmIsaForTesting(isa));
        SiluMulQuantize(gu.data(), n, ffn, first ? &want : &got, levels);
        if (first) {
          first = false;
          continue;
        }
        ASSERT_EQ(got.qs, want.qs) << isa << " ffn " << ffn;
        ASSERT_EQ(got.qs2, want.qs2) << isa << " ffn " << ffn;
        ASSERT_EQ(got.d, want.d) << isa << " ffn " << ffn;
        ASSERT_EQ(got.s, want.s) << isa << " ffn " << ffn;
      }
    }
  }
}

// ActScale::kPerToken: every block of a token has dx = max|x_t| / 127, the
// quants are round(x / dx) on that one grid, and every ISA path (and the
// fused RmsNorm op) gives the same bytes as the scalar reference.
TEST(PerTokenActsTest, OneScalePerTokenOnEveryIsa) {
  IsaGuard guard;
  const int64_t n = 11, cols = 96;
  std::vector<float> x = Random(n * cols, 4, 2.f);
  x[3 * cols + 40] = 50.f;  // an outlier channel in token 3
  for (int levels : kLevels) {
    QuantizedActs want;
    ref::QuantizeActs(x.data(), n, cols, &want, levels, ActScale::kPerToken);
    for (int64_t t = 0; t < n; ++t) {
      float amax = 0.f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[t * cols + c]));
      const float d = levels == 1 ? amax / 127.f : amax / 127.f * (1.f / 256.f);
      for (int64_t b = 0; b < cols / kQBlock; ++b) {
        EXPECT_EQ(want.d[want.Index(t, b)], d) << t << " " << b;
        if (levels == 1) {
          for (int i = 0; i < kQBlock; ++i) {
            EXPECT_EQ(
                want.q(t, b)[i],
                static_cast<int8_t>(std::nearbyint(x[t * cols + b * kQBlock + i] * (1.f / d))));
          }
        }
      }
    }
    for (const std::string& isa : Isas()) {
      ASSERT_TRUE(SetQGemmIsaForTesting(isa));
      QuantizedActs got;
      QuantizeActs(x.data(), n, cols, &got, levels, nullptr, ActScale::kPerToken);
      EXPECT_EQ(got.qs, want.qs) << isa;
      EXPECT_EQ(got.qs2, want.qs2) << isa;
      EXPECT_TRUE(BitEqual(got.d, want.d)) << isa;
      EXPECT_TRUE(BitEqual(got.sd, want.sd)) << isa;
      EXPECT_EQ(got.s, want.s) << isa;
    }
  }
  // The outlier coarsens token 3's whole row on the per-token grid, only its
  // block on the per-block grid.
  QuantizedActs block, token;
  ref::QuantizeActs(x.data(), n, cols, &block, 1);
  ref::QuantizeActs(x.data(), n, cols, &token, 1, ActScale::kPerToken);
  EXPECT_LT(block.d[block.Index(3, 0)], token.d[token.Index(3, 0)] / 4);
  EXPECT_EQ(block.d[block.Index(3, 1)], token.d[token.Index(3, 1)]);
}

// The fused RMSNorm + quantize with per-token scales equals RMSNorm then
// QuantizeActs with them.
TEST(PerTokenActsTest, FusedRmsNormMatchesUnfused) {
  const int64_t n = 5, dim = 96;
  const std::vector<float> x = Random(n * dim, 5, 4.f), w = Random(dim, 6);
  std::vector<float> normed(n * dim);
  RmsNorm(x.data(), w.data(), n, dim, 1e-5f, normed.data());
  QuantizedActs fused, unfused;
  RmsNormQuantize(x.data(), w.data(), n, dim, 1e-5f, &fused, 1, nullptr, ActScale::kPerToken);
  QuantizeActs(normed.data(), n, dim, &unfused, 1, nullptr, ActScale::kPerToken);
  EXPECT_EQ(fused.qs, unfused.qs);
  EXPECT_TRUE(BitEqual(fused.d, unfused.d));
}

TEST(FusedOpsTest, RmsNormAndSiluQuantizeMatchUnfused) {
  const int64_t n = 5, dim = 96;
  const std::vector<float> x = Random(n * dim, 1, 4.f), w = Random(dim, 2);
  std::vector<float> normed(n * dim);
  RmsNorm(x.data(), w.data(), n, dim, 1e-5f, normed.data());
  QuantizedActs fused, unfused;
  RmsNormQuantize(x.data(), w.data(), n, dim, 1e-5f, &fused);
  QuantizeActs(normed.data(), n, dim, &unfused);
  EXPECT_EQ(fused.qs, unfused.qs);
  const std::vector<float> gu = Random(n * 2 * dim, 3, 6.f);
  std::vector<float> h(n * dim);
  for (int64_t t = 0; t < n; ++t) {
    ref::SiluMul(gu.data() + t * 2 * dim, gu.data() + t * 2 * dim + dim, dim, h.data() + t * dim);
  }
  SiluMulQuantize(gu.data(), n, dim, &fused);
  QuantizeActs(h.data(), n, dim, &unfused);
  int diffs = 0;  // the SIMD exp may move a value across a rounding edge
  for (int64_t i = 0; i < n * dim; ++i) {
    EXPECT_LE(std::abs(fused.qs[i] - unfused.qs[i]), 1);
    diffs += fused.qs[i] != unfused.qs[i];
  }
  EXPECT_LE(diffs, 3);
}

}  // namespace
}  // namespace tandem::kernels

namespace tandem::kernels {
namespace {

// The GQA-grouped AVX-512 attention (head_dim 64) vs the reference, and its
// batch invariance, on SmolLM2's head shape (9 query heads over 3 KV heads).
TEST(GroupedAttentionTest, MatchesReferenceAndIsBatchInvariant) {
  const PagedKvLayout layout{12, 16, 3, 64};
  const int64_t heads = 9, width = heads * 64, kv_width = 3 * 64;
  const std::vector<float> k = Random(12 * 16 * kv_width, 1), v = Random(k.size(), 2);
  const std::vector<int32_t> query_start = {0, 1, 38}, positions = [] {
    std::vector<int32_t> p = {100};
    for (int i = 0; i < 37; ++i) p.push_back(i);
    return p;
  }();
  const std::vector<int32_t> context_lens = {101, 37};
  const std::vector<int32_t> tables = {3, 11, 0, 5, 7, 1, 9,  //
                                       2, 4,  6, 8, 0, 0, 0};
  PagedAttentionArgs args{
      layout,        heads, 0.125f, 2, query_start.data(), positions.data(), context_lens.data(),
      tables.data(), 7};
  const std::vector<float> q = Random(38 * width, 3, 2.f);
  std::vector<float> got(38 * width), want(38 * width);
  ThreadPool pool(2);
  PagedAttention(args, q.data(), k.data(), v.data(), got.data(), &pool);
  ref::PagedAttention(args, q.data(), k.data(), v.data(), want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << i;
  // Sequence 1 alone gives bit-identical rows.
  const std::vector<int32_t> qs1 = {0, 37};
  PagedAttentionArgs alone = args;
  alone.num_seqs = 1;
  alone.query_start = qs1.data();
  alone.positions = positions.data() + 1;
  alone.context_lens = context_lens.data() + 1;
  alone.block_tables = tables.data() + 7;
  std::vector<float> single(37 * width);
  PagedAttention(alone, q.data() + width, k.data(), v.data(), single.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(single.data(), got.data() + width, single.size() * sizeof(float)));
}

}  // namespace
}  // namespace tandem::kernels

namespace tandem::kernels {
namespace {

TEST(RopeQKTest, BitIdenticalToTwoRopes) {
  const int64_t n = 5, heads = 9, kv_heads = 3, hd = 64;
  const std::vector<int32_t> pos = {0, 3, 17, 100, 511};
  for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kNeox}) {
    const RopeParams p{style, 64, 100000.f, 1.f, nullptr};
    std::vector<float> q = Random(n * heads * hd, 1), k = Random(n * kv_heads * hd, 2);
    std::vector<float> q2 = q, k2 = k;
    RopeQK(q.data(), k.data(), pos.data(), n, heads, kv_heads, hd, p);
    Rope(q2.data(), pos.data(), n, heads, hd, p);
    Rope(k2.data(), pos.data(), n, kv_heads, hd, p);
    EXPECT_TRUE(BitEqual(q, q2));
    EXPECT_TRUE(BitEqual(k, k2));
  }
}

// The angles computed once (per forward) and reused: the same bits as RopeQK,
// for both styles, a partial rot_dim, freq factors and scaling, on every SIMD
// variant this CPU runs.
TEST(RopeQKTest, PrecomputedAnglesAreBitIdentical) {
  const int64_t n = 7, heads = 6, kv_heads = 2, hd = 80;
  const std::vector<int32_t> pos = {0, 1, 2, 63, 64, 4095, 131071};
  std::vector<float> factors(24);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.f + 0.37f * float(i);
  const std::string was = SimdKernelsVariant();
  for (const std::string variant : {"base", "avx2", "avx512"}) {
    if (!SetSimdKernelsVariantForTesting(variant)) continue;
    for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kNeox}) {
      for (const float* ff : {static_cast<const float*>(nullptr), std::as_const(factors).data()}) {
        const RopeParams p{style, 48, 500000.f, 0.25f, ff};
        std::vector<float> cs(n * p.rot_dim);
        RopeAngles(pos.data(), n, p, cs.data());
        std::vector<float> q = Random(n * heads * hd, 3), k = Random(n * kv_heads * hd, 4);
        std::vector<float> q2 = q, k2 = k, q3 = q, k3 = k;
        RopeQKAngles(q.data(), k.data(), cs.data(), n, heads, kv_heads, hd, p);
        RopeQK(q2.data(), k2.data(), pos.data(), n, heads, kv_heads, hd, p);
        ref::RopeQK(q3.data(), k3.data(), pos.data(), n, heads, kv_heads, hd, p);
        EXPECT_TRUE(BitEqual(q, q2)) << variant;
        EXPECT_TRUE(BitEqual(k, k2)) << variant;
        EXPECT_TRUE(BitEqual(q, q3)) << variant;
        EXPECT_TRUE(BitEqual(k, k3)) << variant;
        // A slice of the table serves a slice of the tokens (per-thread ranges).
        std::vector<float> q4 = Random(n * heads * hd, 3), k4 = Random(n * kv_heads * hd, 4);
        RopeQKAngles(q4.data() + 3 * heads * hd, k4.data() + 3 * kv_heads * hd,
                     cs.data() + 3 * p.rot_dim, n - 3, heads, kv_heads, hd, p);
        EXPECT_EQ(0, std::memcmp(q4.data() + 3 * heads * hd, q.data() + 3 * heads * hd,
                                 (n - 3) * heads * hd * sizeof(float)))
            << variant;
      }
    }
  }
  EXPECT_TRUE(SetSimdKernelsVariantForTesting(was));
}

}  // namespace
}  // namespace tandem::kernels
