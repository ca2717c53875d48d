// The arithmetic of the CUDA GemvInt8 (kernels/cuda/int8_dot.h) run on the
// host, so it is checked on every machine, GPU or not: the activation
// quantization, the dp4a operand order of the planar quants and the f32 step
// per block. With a row's blocks summed in increasing order it must equal the
// CPU's QGemm on two-level activations bit for bit (the kernel sums the same
// block terms in another order; cuda_ops_test checks it on a device).
#include <cmath>
#include <cstring>
#include <vector>

#include "common/gguf/types.h"
#include "kernels/cuda/int8_dot.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/int8_emulation.h"

namespace tandem::kernels::cuda {
namespace {

using gguf::TensorType;
using testing::HostRowDot;
using testing::RandomFloats;
using testing::SumOrder;

// Activations with the awkward blocks: all zero, one huge value, values
// that round to +-127 and to a half, tiny (subnormal grid) ones.
std::vector<float> AwkwardActs(int64_t n, int64_t cols, uint32_t seed) {
  std::vector<float> x = RandomFloats(n * cols, seed, 2.f);
  for (int64_t t = 0; t < n; ++t) {
    float* row = x.data() + t * cols;
    for (int i = 0; i < 32; ++i) row[i] = 0.f;
    if (cols >= 64) row[33] = 3e4f;
    if (cols >= 96) {  // dx = 1: every level-1 quant a tie, every level-2 one clamped
      row[64] = 127.f;
      for (int i = 65; i < 96; ++i) row[i] = float(i - 80) + 0.5f;
    }
    if (cols >= 128) {
      for (int i = 96; i < 128; ++i) row[i] = 1e-39f * float(i - 100);
    }
  }
  return x;
}

TEST(CudaInt8MathTest, HostEmulationEqualsCpuQGemmBitForBit) {
  for (TensorType type : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0}) {
    for (int64_t cols : {32, 96, 576, 1536}) {
      const int64_t rows = 37, n = 5;
      const int64_t row_bytes = *gguf::RowBytes(type, cols);
      std::vector<uint8_t> w(rows * row_bytes);
      const std::vector<float> wf = RandomFloats(rows * cols, 11 + cols, 0.5f);
      for (int64_t r = 0; r < rows; ++r) {
        QuantizeRow(type, wf.data() + r * cols, w.data() + r * row_bytes, cols);
      }
      const std::vector<float> x = AwkwardActs(n, cols, 12 + cols);
      const PackedWeight packed =
          PackedWeight::Pack(WeightView{type, w.data(), rows, cols, row_bytes}, nullptr);
      QuantizedActs acts;
      QuantizeActs(x.data(), n, cols, &acts, /*levels=*/2);
      std::vector<float> want(n * rows);
      QGemm(packed, acts, want.data(), rows, /*accumulate=*/false, /*pool=*/nullptr);
      int bad = 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const float got = HostRowDot(type, w.data() + r * row_bytes, cols, x.data() + t * cols);
          const float exp = want[t * rows + r];
          if (std::memcmp(&got, &exp, 4) != 0 && ++bad <= 3) {
            ADD_FAILURE() << "type " << int(type) << " cols " << cols << " token " << t << " row "
                          << r << ": " << got << " vs QGemm " << exp;
          }
        }
      }
      EXPECT_EQ(bad, 0) << "type " << int(type) << " cols " << cols;
    }
  }
}

// The two levels carry about 16 bits: the result is far closer to the exact
// f32 dot product than one int8 level would be.
TEST(CudaInt8MathTest, TwoLevelsTrackTheExactDotProduct) {
  const int64_t cols = 4096;
  const TensorType type = TensorType::kQ4_0;
  const int64_t row_bytes = *gguf::RowBytes(type, cols);
  std::vector<uint8_t> w(row_bytes);
  std::vector<float> wf = RandomFloats(cols, 21, 0.5f), deq(cols);
  QuantizeRow(type, wf.data(), w.data(), cols);
  DequantizeRow(type, w.data(), deq.data(), cols);
  const std::vector<float> x = RandomFloats(cols, 22);
  double exact = 0, mag = 0;
  for (int64_t c = 0; c < cols; ++c) {
    exact += double(deq[c]) * x[c];
    mag += std::fabs(double(deq[c]) * x[c]);
  }
  const float got = HostRowDot(type, w.data(), cols, x.data());
  EXPECT_LT(std::fabs(got - exact), 2e-5 * mag) << got << " vs " << exact;
}

// The kernel's order (what cuda_ops_test expects bit for bit on a device)
// sums the same block terms as QGemm's: equal up to f32 rounding, exactly
// for a single block (the other lanes add zeros).
TEST(CudaInt8MathTest, WarpOrderSumsTheSameTerms) {
  for (TensorType type : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0}) {
    for (int64_t cols : {32, 1024, 14336}) {
      const int64_t row_bytes = *gguf::RowBytes(type, cols);
      std::vector<uint8_t> w(row_bytes);
      const std::vector<float> wf = RandomFloats(cols, 51, 0.5f), x = RandomFloats(cols, 52);
      QuantizeRow(type, wf.data(), w.data(), cols);
      const float seq = HostRowDot(type, w.data(), cols, x.data(), SumOrder::kSequential);
      const float warp = HostRowDot(type, w.data(), cols, x.data(), SumOrder::kWarp);
      if (cols == 32) {
        EXPECT_EQ(seq, warp);  // one block: 0 + term, then sums with zeros
      } else {
        EXPECT_NEAR(warp, seq, 1e-5 * std::sqrt(double(cols)) * (1 + std::fabs(seq)));
      }
    }
  }
}

TEST(CudaInt8MathTest, QuantOrderMatchesTheNibbleMasks) {
  // x[j] = j + 1 in a block whose weights are all 1 except weight j0 = 2: the
  // dot must see weight j0 against x[j0] whatever its nibble.
  for (int j0 = 0; j0 < 32; ++j0) {
    uint32_t wq[4] = {0x11111111u, 0x11111111u, 0x11111111u, 0x11111111u};
    wq[j0 / 8] += 1u << (4 * (j0 % 8));
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = float(j + 1);
    i8::ActBlock a;
    i8::QuantizeBlock<i8::kQ4_0>(x, &a);
    // Dot against level 1 alone: quants of x are rne((j + 1) * 127 / 32).
    const int32_t isum = i8::BlockDot<i8::kQ4_0>(wq, a.q1, a.q1) / 257;
    int32_t want = 0;
    for (int j = 0; j < 32; ++j) {
      const int32_t q = int32_t(std::nearbyint(float(j + 1) * (1.f / (32.f / 127.f))));
      want += (j == j0 ? 2 : 1) * q;
    }
    EXPECT_EQ(isum, want) << "weight " << j0;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
