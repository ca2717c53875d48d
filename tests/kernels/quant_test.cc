// Reference (de)quantization against gguf-py goldens (tests/data/
// dequant_golden.bin, made by tools/golden_dequant.py) and round-trip error
// bounds. Golden comparisons are bit-exact: the kernels reproduce gguf-py's
// float32 arithmetic order with FP contraction off.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/gguf/types.h"
#include "tests/util/test_paths.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

struct Record {
  uint32_t kind;  // 0: bytes -> floats, 1: floats -> bytes
  TensorType type;
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};

std::vector<Record> LoadGolden() {
  std::ifstream in(testing::TestDataPath("dequant_golden.bin"), std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Record> out;
  size_t pos = 0;
  auto u32 = [&] {
    uint32_t v = 0;
    if (pos + 4 <= s.size()) std::memcpy(&v, s.data() + pos, 4);
    pos += 4;
    return v;
  };
  if (s.size() < 12 || s.compare(0, 4, "TDQG") != 0) return out;
  pos = 4;
  if (u32() != 1) return out;
  const uint32_t num = u32();
  for (uint32_t i = 0; i < num && pos < s.size(); ++i) {
    Record r;
    r.kind = u32();
    r.type = static_cast<TensorType>(u32());
    const uint32_t n = u32(), num_bytes = u32();
    if (pos + num_bytes + 4ull * n > s.size()) break;
    r.bytes.assign(s.data() + pos, s.data() + pos + num_bytes);
    pos += num_bytes;
    r.floats.resize(n);
    std::memcpy(r.floats.data(), s.data() + pos, 4ull * n);
    pos += 4ull * n;
    out.push_back(std::move(r));
  }
  return out;
}

std::string Name(TensorType t) { return std::string(gguf::GetTypeTraits(t)->name); }

TEST(QuantGolden, DequantizeMatchesGgufPyBitExactly) {
  const std::vector<Record> golden = LoadGolden();
  ASSERT_EQ(golden.size(), 20u) << "regenerate with tools/golden_dequant.py";
  std::set<TensorType> covered;
  for (const Record& r : golden) {
    if (r.kind != 0) continue;
    covered.insert(r.type);
    ASSERT_EQ(*gguf::RowBytes(r.type, r.floats.size()), r.bytes.size()) << Name(r.type);
    std::vector<float> got(r.floats.size(), -12345.0f);
    DequantizeRow(r.type, r.bytes.data(), got.data(), got.size());
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(r.floats[i]) &&
          ++mismatches <= 5) {
        ADD_FAILURE() << Name(r.type) << " element " << i << ": got " << got[i] << " want "
                      << r.floats[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << Name(r.type);
  }
  // Every type marked dequantizable has a golden.
  for (uint32_t raw = 0; raw < 64; ++raw) {
    absl::StatusOr<gguf::TypeTraits> traits = gguf::GetTypeTraits(raw);
    if (traits.ok() && traits->dequantizable) {
      EXPECT_TRUE(covered.count(static_cast<TensorType>(raw))) << traits->name;
    }
  }
  EXPECT_EQ(covered.size(), 13u);
}

TEST(QuantGolden, QuantizeMatchesGgufPyBitExactly) {
  int checked = 0;
  for (const Record& r : LoadGolden()) {
    if (r.kind != 1) continue;
    ASSERT_TRUE(IsQuantizable(r.type)) << Name(r.type);
    std::vector<uint8_t> got(r.bytes.size(), 0xAB);
    QuantizeRow(r.type, r.floats.data(), got.data(), r.floats.size());
    EXPECT_EQ(got, r.bytes) << Name(r.type);
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

// Quantize -> dequantize stays within the format's step size.
TEST(QuantRoundTrip, ErrorBounds) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (TensorType t : {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                       TensorType::kQ5_1, TensorType::kF16, TensorType::kBF16, TensorType::kF32}) {
    const int64_t n = 32 * 64;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * std::pow(10.0f, (i / 32) % 5 - 2);
    std::vector<uint8_t> q(*gguf::RowBytes(t, n));
    std::vector<float> y(n);
    QuantizeRow(t, x.data(), q.data(), n);
    DequantizeRow(t, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      const float fp16_err = amax * 0x1p-10f;  // rounding of the f16 scale / min
      for (int j = 0; j < 32; ++j) {
        const int64_t i = b * 32 + j;
        const float err = std::fabs(x[i] - y[i]);
        float bound = 0;
        switch (t) {
          case TensorType::kQ8_0:
            bound = 0.5f * amax / 127 + fp16_err;
            break;
          case TensorType::kQ4_0:
            bound = amax / 8 + fp16_err;
            break;  // clipped extreme: 1 step
          case TensorType::kQ5_0:
            bound = amax / 16 + fp16_err;
            break;
          case TensorType::kQ4_1:
            bound = 0.5f * (hi - lo) / 15 + 2 * fp16_err;
            break;
          case TensorType::kQ5_1:
            bound = 0.5f * (hi - lo) / 31 + 2 * fp16_err;
            break;
          case TensorType::kF16:  // half subnormals below 2^-14 have a fixed 2^-24 step
            bound = std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f);
            break;
          case TensorType::kBF16:
            bound = std::fabs(x[i]) * 0x1p-8f;
            break;
          default:
            bound = 0;
            break;
        }
        ASSERT_LE(err, bound * 1.0001f) << Name(t) << " element " << i << " x=" << x[i];
      }
    }
  }
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0);
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(f))));
    } else {
      ASSERT_EQ(Fp32ToFp16(f), h) << std::hex << h;
    }
  }
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), 0x1p-24f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65519.996f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // tie with odd mantissa -> inf
  EXPECT_EQ(Fp32ToFp16(-1e9f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(0x1p-25f), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(Fp32ToFp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(1.5f * 0x1p-24f), 0x0002);  // tie -> even
  EXPECT_EQ(Fp32ToFp16(2.5f * 0x1p-24f), 0x0002);
  EXPECT_EQ(Fp32ToFp16(1.0f + 0x1p-11f), 0x3C00);  // tie -> even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(0x1p-14f, 0.0f)), 0x0400);  // rounds up to normal
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  const uint16_t nan = Fp32ToFp16(std::nanf(""));
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x3FF, 0);
#if defined(__FLT16_MAX__)
  // Against the compiler's own conversion over a spread of f32 bit patterns.
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 65521) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(Fp32ToFp16(f), want) << std::hexfloat << f;
  }
#endif
}

TEST(Bf16, Conversions) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::bit_cast<float>(0x7F800001u)))));
}

TEST(QuantDeath, UnsupportedTypeChecks) {
  std::vector<uint8_t> src(512);
  std::vector<float> dst(256);
  EXPECT_DEATH(DequantizeRow(TensorType::kQ8_1, src.data(), dst.data(), 32), "TANDEM_CHECK");
  EXPECT_DEATH(DequantizeRow(TensorType::kQ4_0, src.data(), dst.data(), 31), "TANDEM_CHECK");
  EXPECT_DEATH(QuantizeRow(TensorType::kQ3_K, dst.data(), src.data(), 256), "TANDEM_CHECK");
  EXPECT_DEATH(QuantizeRow(TensorType::kQ4_K, dst.data(), src.data(), 255), "TANDEM_CHECK");
  EXPECT_FALSE(gguf::GetTypeTraits(TensorType::kQ8_1)->dequantizable);
  EXPECT_FALSE(gguf::GetTypeTraits(TensorType::kIQ4_NL)->dequantizable);
}

}  // namespace
}  // namespace tandem::kernels
