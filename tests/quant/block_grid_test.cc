// The grid GPTQ writes into (quant/block_grid.h) is the one the reference
// dequantizer reads: for every type, integers set with SetQ decode to
// scale * q + offset of GridOf; and the per-tensor type rules (fallbacks,
// the output tensor, the _M mix).
#include "quant/block_grid.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "quant/quant_types.h"

namespace tandem::quant {
namespace {

using gguf::TensorType;

TEST(BlockGridTest, SetQDecodesOnTheGrid) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  for (TensorType t :
       {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
        TensorType::kQ5_1, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(static_cast<int>(t));
    const int n = BlockSize(t);
    std::vector<float> x(n);
    for (float& v : x) v = g(rng);
    std::string block(BlockBytes(t), '\0');
    kernels::QuantizeRow(t, x.data(), block.data(), n);
    std::vector<float> scale(n), offset(n), y(n);
    GridOf(t, reinterpret_cast<const uint8_t*>(block.data()), scale.data(), offset.data());
    // The reference quantizer's own integers are on the grid.
    kernels::DequantizeRow(t, block.data(), y.data(), n);
    const GridRange range = RangeOf(t);
    for (int i = 0; i < n; ++i) {
      const float q = (y[i] - offset[i]) / scale[i];
      ASSERT_NEAR(q, std::nearbyint(q), 1e-3) << i;
    }
    // Integers written by SetQ decode to scale * q + offset.
    std::vector<int> qs(n);
    for (int i = 0; i < n; ++i) {
      qs[i] = range.qmin + static_cast<int>(rng() % (range.qmax - range.qmin + 1));
      SetQ(t, reinterpret_cast<uint8_t*>(block.data()), i, qs[i]);
    }
    kernels::DequantizeRow(t, block.data(), y.data(), n);
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(y[i], scale[i] * qs[i] + offset[i], 1e-5f * (1 + std::fabs(y[i]))) << i;
    }
  }
}

TEST(QuantTypesTest, ParseAndFallbacks) {
  EXPECT_FALSE(ParseTargetType("q3_k").ok());
  EXPECT_FALSE(ParseMethod("fp4").ok());
  EXPECT_EQ(*ParseMethod("SmoothQuant"), Method::kSmoothQuant);
  EXPECT_EQ(MethodName(Method::kSmoothQuant), "smoothquant");
  auto q4k = ParseTargetType("Q4_K");
  ASSERT_TRUE(q4k.ok());
  // SmolLM2: hidden 576 is not a multiple of 256, ffn 1536 is.
  EXPECT_EQ(TensorTargetType(*q4k, "blk.0.attn_q.weight", 2, 576, 30, true, TensorType::kF32),
            TensorType::kQ5_0);
  EXPECT_EQ(TensorTargetType(*q4k, "blk.0.ffn_down.weight", 2, 1536, 30, true, TensorType::kF32),
            TensorType::kQ4_K);
  EXPECT_EQ(TensorTargetType(*q4k, "token_embd.weight", 2, 576, 30, true, TensorType::kF32),
            TensorType::kQ8_0);
  EXPECT_EQ(TensorTargetType(*q4k, "output.weight", 2, 1024, 30, false, TensorType::kF32),
            TensorType::kQ6_K);
  EXPECT_EQ(TensorTargetType(*q4k, "blk.0.attn_norm.weight", 1, 576, 30, true, TensorType::kF32),
            TensorType::kF32);
  auto q6k = ParseTargetType("q6_k");
  EXPECT_EQ(TensorTargetType(*q6k, "blk.0.attn_q.weight", 2, 576, 30, true, TensorType::kF32),
            TensorType::kQ8_0);
  auto q4km = ParseTargetType("q4_k_m");
  ASSERT_TRUE(q4km.ok() && q4km->mix);
  // Layer 0 of 30 is in the first eighth: ffn_down gets Q6_K; so does layer 5 ((5 - 3) % 3 == 2),
  // not layer 4.
  EXPECT_EQ(TensorTargetType(*q4km, "blk.0.ffn_down.weight", 2, 1536, 30, true, TensorType::kF32),
            TensorType::kQ6_K);
  EXPECT_EQ(TensorTargetType(*q4km, "blk.5.ffn_down.weight", 2, 1536, 30, true, TensorType::kF32),
            TensorType::kQ6_K);
  EXPECT_EQ(TensorTargetType(*q4km, "blk.4.ffn_down.weight", 2, 1536, 30, true, TensorType::kF32),
            TensorType::kQ4_K);
  EXPECT_EQ(TensorTargetType(*q4km, "blk.0.attn_v.weight", 2, 576, 30, true, TensorType::kF32),
            TensorType::kQ8_0);
}

}  // namespace
}  // namespace tandem::quant
