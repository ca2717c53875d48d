// Q4_K / Q5_K / Q6_K reference quantizers: byte-identical to ggml's
// quantize_row_q{4,5,6}_K_ref on the golden inputs written by
// tools/make_kquant_golden.py, and round trips whose error is that of the
// format (random rows of awkward content).
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/types.h"
#include "tests/util/test_paths.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

uint32_t ReadU32(const std::string& s, size_t* pos) {
  uint32_t v;
  std::memcpy(&v, s.data() + *pos, 4);
  *pos += 4;
  return v;
}

TEST(QuantizeKQuantTest, MatchesGgmlGolden) {
  std::ifstream in(testing::TestDataPath("kquant_golden.bin"), std::ios::binary);
  ASSERT_TRUE(in) << "missing tests/data/kquant_golden.bin";
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(data.substr(0, 4), "KQG1");
  size_t pos = 4;
  const uint32_t count = ReadU32(data, &pos);
  ASSERT_GE(count, 3u);
  for (uint32_t c = 0; c < count; ++c) {
    const auto type = static_cast<TensorType>(ReadU32(data, &pos));
    const uint32_t n = ReadU32(data, &pos);
    std::vector<float> x(n);
    std::memcpy(x.data(), data.data() + pos, 4 * n);
    pos += 4 * n;
    const uint32_t num_bytes = ReadU32(data, &pos);
    const std::string want = data.substr(pos, num_bytes);
    pos += num_bytes;
    ASSERT_TRUE(IsQuantizable(type));
    std::string got(num_bytes, '\0');
    QuantizeRow(type, x.data(), got.data(), n);
    EXPECT_EQ(got, want) << "case " << c << " type " << static_cast<int>(type) << " n " << n;
  }
  EXPECT_EQ(pos, data.size());
}

// Relative RMS error of a round trip; each type must stay under the bound of
// its bit width (measured: Q4_K ~0.07, Q5_K ~0.035, Q6_K ~0.018 on
// Gaussian rows) and below the next-coarser format's error.
double RoundTripError(TensorType type, const std::vector<float>& x) {
  std::string q(*gguf::RowBytes(type, x.size()), '\0');
  QuantizeRow(type, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  DequantizeRow(type, q.data(), y.data(), static_cast<int64_t>(x.size()));
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * double(x[i] - y[i]);
    den += double(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

TEST(QuantizeKQuantTest, RoundTripErrorOrdersByBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(256 * 24);
  for (float& v : x) v = g(rng);
  for (int i = 0; i < 20; ++i) x[rng() % x.size()] *= 12.f;  // outliers
  const double e4 = RoundTripError(TensorType::kQ4_K, x);
  const double e5 = RoundTripError(TensorType::kQ5_K, x);
  const double e6 = RoundTripError(TensorType::kQ6_K, x);
  const double e40 = RoundTripError(TensorType::kQ4_0, x);
  EXPECT_LT(e4, 0.12);
  EXPECT_LT(e5, e4 * 0.6);
  EXPECT_LT(e6, e5 * 0.7);
  EXPECT_LT(e4, e40);  // the K-quant search beats Q4_0's absmax rounding
}

TEST(QuantizeKQuantTest, ZeroAndConstantRowsAreExactOrClose) {
  for (TensorType t : {TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    std::vector<float> zero(256, 0.f);
    std::string q(*gguf::RowBytes(t, 256), '\x55');
    QuantizeRow(t, zero.data(), q.data(), 256);
    std::vector<float> y(256, 1.f);
    DequantizeRow(t, q.data(), y.data(), 256);
    for (float v : y) ASSERT_EQ(v, 0.f);
    std::vector<float> c(256, 0.3f);
    EXPECT_LT(RoundTripError(t, c), 0.01);
  }
}

}  // namespace
}  // namespace tandem::kernels
