// GPTQ's pieces on random data: U from InverseCholeskyUpper satisfies
// U^T U = H^-1; GptqQuantize writes blocks that decode to the values it
// leaves in w, and its output error tr(E H E^T) on correlated inputs is
// below round-to-nearest's for every grid type.
#include "quant/gptq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace tandem::quant {
namespace {

using gguf::TensorType;

// Correlated inputs: x = z A with a random mixing matrix, plus a few loud channels.
std::vector<float> Inputs(int64_t tokens, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> a(cols * cols), z(cols), x(tokens * cols);
  for (float& v : a) v = g(rng) / std::sqrt(float(cols));
  for (int64_t t = 0; t < tokens; ++t) {
    for (float& v : z) v = g(rng);
    for (int64_t j = 0; j < cols; ++j) {
      float s = 0;
      for (int64_t k = 0; k < cols; ++k) s += z[k] * a[k * cols + j];
      x[t * cols + j] = s * (j % 37 == 0 ? 8.f : 1.f);
    }
  }
  return x;
}

double OutputError(const std::vector<float>& w, const std::vector<float>& q,
                   const std::vector<double>& h, int64_t rows, int64_t cols) {
  double total = 0;
  std::vector<double> e(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) e[c] = w[r * cols + c] - q[r * cols + c];
    for (int64_t i = 0; i < cols; ++i) {
      double hi = 0;
      for (int64_t j = 0; j < cols; ++j) hi += h[i * cols + j] * e[j];
      total += e[i] * hi;
    }
  }
  return total;
}

std::vector<float> Gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> w(n);
  for (float& v : w) v = g(rng);
  return w;
}

// w [rows, cols] quantized to `t` by the reference (round to nearest) and back.
std::vector<float> RoundTrip(TensorType t, const std::vector<float>& w, int64_t rows,
                             int64_t cols) {
  const uint64_t row_bytes = *gguf::RowBytes(t, cols);
  std::string bytes(rows * row_bytes, '\0');
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    kernels::QuantizeRow(t, w.data() + r * cols, bytes.data() + r * row_bytes, cols);
    kernels::DequantizeRow(t, bytes.data() + r * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}

TEST(GptqTest, InverseCholeskyUpperInvertsH) {
  const int64_t n = 64;
  const std::vector<float> x = Inputs(256, n, 1);
  const std::vector<double> h = Gram(x.data(), 256, n, nullptr);
  auto u = InverseCholeskyUpper(h, n, /*damp=*/0.0, nullptr);
  ASSERT_TRUE(u.ok()) << u.status();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) ASSERT_EQ((*u)[i * n + j], 0.f);  // upper
  }
  // (U^T U) H = I.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) {
        double hinv_ik = 0;
        for (int64_t m = 0; m <= std::min(i, k); ++m)
          hinv_ik += double((*u)[m * n + i]) * (*u)[m * n + k];
        s += hinv_ik * h[k * n + j];
      }
      // U is stored as f32 and H has channels 64x louder than others.
      ASSERT_NEAR(s, i == j ? 1.0 : 0.0, 1e-2) << i << "," << j;
    }
  }
}

TEST(GptqTest, BeatsRoundToNearestAndDecodesToItsResult) {
  const int64_t rows = 24, cols = 256, tokens = 1024;
  const std::vector<float> x = Inputs(tokens, cols, 2);
  const std::vector<double> h = Gram(x.data(), tokens, cols, nullptr);
  auto u = InverseCholeskyUpper(h, cols, 0.01, nullptr);
  ASSERT_TRUE(u.ok());
  const std::vector<float> w = Gaussian(rows * cols, 3);
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ8_0,
                       TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(static_cast<int>(t));
    const uint64_t row_bytes = *gguf::RowBytes(t, cols);
    const std::vector<float> rtn = RoundTrip(t, w, rows, cols);
    std::vector<float> q = w;
    std::string bytes;
    GptqQuantize(t, *u, q.data(), rows, cols, nullptr, &bytes);
    ASSERT_EQ(bytes.size(), rows * row_bytes);
    std::vector<float> decoded(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::DequantizeRow(t, bytes.data() + r * row_bytes, decoded.data() + r * cols, cols);
    }
    EXPECT_EQ(decoded, q);
    const double e_rtn = OutputError(w, rtn, h, rows, cols);
    const double e_gptq = OutputError(w, q, h, rows, cols);
    std::printf("type %d: output error rtn %.4g gptq %.4g\n", static_cast<int>(t), e_rtn, e_gptq);
    EXPECT_LT(e_gptq, 0.9 * e_rtn);
  }
}

// Act-order: the permutation sorts diag(H) down, PermuteGram permutes both
// axes, and GPTQ in that order with static block scales still writes blocks
// that decode to its result and beats round-to-nearest for every grid type.
TEST(GptqTest, ActOrderBeatsRoundToNearestAndDecodesToItsResult) {
  const int64_t rows = 24, cols = 256, tokens = 1024;
  const std::vector<float> x = Inputs(tokens, cols, 4);
  const std::vector<double> h = Gram(x.data(), tokens, cols, nullptr);
  const std::vector<int64_t> order = ActOrder(h, cols);
  ASSERT_EQ(static_cast<int64_t>(order.size()), cols);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(sorted[i], i);  // a permutation
  for (int64_t i = 1; i < cols; ++i) {
    ASSERT_GE(h[order[i - 1] * cols + order[i - 1]], h[order[i] * cols + order[i]]);
  }
  EXPECT_EQ(order[0] % 37, 0);  // a loud channel leads
  const std::vector<double> hp = PermuteGram(h, order);
  for (int64_t i = 0; i < cols; i += 17) {
    for (int64_t j = 0; j < cols; j += 13) {
      ASSERT_EQ(hp[i * cols + j], h[order[i] * cols + order[j]]);
    }
  }
  auto u = InverseCholeskyUpper(hp, cols, 0.01, nullptr);
  auto u_plain = InverseCholeskyUpper(h, cols, 0.01, nullptr);
  ASSERT_TRUE(u.ok() && u_plain.ok());
  const std::vector<float> w = Gaussian(rows * cols, 5);
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ8_0,
                       TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(static_cast<int>(t));
    const uint64_t row_bytes = *gguf::RowBytes(t, cols);
    const std::vector<float> rtn = RoundTrip(t, w, rows, cols);
    std::vector<float> q = w, plain = w;
    std::string bytes, plain_bytes;
    GptqQuantize(t, *u, q.data(), rows, cols, nullptr, &bytes, order);
    GptqQuantize(t, *u_plain, plain.data(), rows, cols, nullptr, &plain_bytes);
    ASSERT_EQ(bytes.size(), rows * row_bytes);
    std::vector<float> decoded(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::DequantizeRow(t, bytes.data() + r * row_bytes, decoded.data() + r * cols, cols);
    }
    EXPECT_EQ(decoded, q);
    EXPECT_NE(bytes, plain_bytes);  // the order matters
    const double e_rtn = OutputError(w, rtn, h, rows, cols);
    const double e_act = OutputError(w, q, h, rows, cols);
    const double e_plain = OutputError(w, plain, h, rows, cols);
    std::printf("type %d: output error rtn %.4g gptq %.4g gptq act-order %.4g\n",
                static_cast<int>(t), e_rtn, e_plain, e_act);
    EXPECT_LT(e_act, 0.9 * e_rtn);
    EXPECT_LT(e_act, e_plain);  // loud channels first: what act-order is for
  }
}

}  // namespace
}  // namespace tandem::quant
