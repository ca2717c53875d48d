// The arithmetic of the CUDA GemvInt8 (kernels/cuda/int8_dot.h) run on the
// host, so it is checked on every machine, GPU or not: the activation
// quantization, the dp4a operand order of the planar quants and the f32 step
// per block. With a row's blocks summed in increasing order it must equal the
// CPU's QGemm on two-level activations bit for bit (the kernel sums the same
// block terms in another order; cuda_ops_test checks it on a device).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/gguf/types.h"
#include "kernels/cuda/int8_dot.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using gguf::TensorType;
using testing::RandomFloats;

uint32_t Word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t Half(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Block b of a GGUF row as RepackPlanar lays it out: the quant words (Q4:
// weight 8k + j in nibble j of word k; Q8_0: the 32 bytes) and the scale
// word (f16 d, or d | m << 16 for Q4_1).
void PlanarBlock(TensorType type, const uint8_t* row, int64_t b, uint32_t* wq, uint32_t* scale) {
  if (type == TensorType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    *scale = Half(blk);
    for (int k = 0; k < 8; ++k) wq[k] = Word(blk + 2 + 4 * k);
    return;
  }
  const bool min = type == TensorType::kQ4_1;
  const uint8_t* blk = row + b * (min ? 20 : 18);
  *scale = min ? Word(blk) : Half(blk);
  const uint8_t* qs = blk + (min ? 4 : 2);  // byte i: weight i (low), i + 16 (high)
  for (int k = 0; k < 4; ++k) {
    uint32_t w = 0;
    for (int j = 0; j < 8; ++j) {
      const int e = 8 * k + j;
      const uint32_t nib = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
      w |= nib << (4 * j);
    }
    wq[k] = w;
  }
}

template <int kType>
float RowDot(TensorType type, const uint8_t* row, int64_t cols, const float* x) {
  float acc = 0.f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint32_t wq[8], scale;
    PlanarBlock(type, row, b, wq, &scale);
    i8::ActBlock a;
    i8::QuantizeBlock<kType>(x + 32 * b, &a);
    acc = i8::BlockStep<kType>(i8::BlockDot<kType>(wq, a.q1, a.q2), scale, a.e, a.s, acc);
  }
  return acc;
}

float HostRowDot(TensorType type, const uint8_t* row, int64_t cols, const float* x) {
  switch (type) {
    case TensorType::kQ4_0:
      return RowDot<i8::kQ4_0>(type, row, cols, x);
    case TensorType::kQ4_1:
      return RowDot<i8::kQ4_1>(type, row, cols, x);
    default:
      return RowDot<i8::kQ8_0>(type, row, cols, x);
  }
}

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
