// Host emulation of the CUDA GemvInt8 (kernels/cuda/int8_dot.h) for the
// tests: a GGUF Q4_0 / Q4_1 / Q8_0 row as RepackPlanar lays it out, and one
// (row, token) result with the blocks summed either in increasing order (the
// CPU QGemm's order) or in the kernel's (lane l sums blocks l, l + 32, ...,
// then the butterfly of WarpSum), which the device must match bit for bit.
#ifndef TANDEM_TESTS_CUDA_INT8_EMULATION_H_
#define TANDEM_TESTS_CUDA_INT8_EMULATION_H_

#include <cstdint>
#include <cstring>

#include "common/gguf/types.h"
#include "kernels/cuda/int8_dot.h"

namespace tandem::kernels::cuda::testing {

enum class SumOrder { kSequential, kWarp };

inline uint32_t Word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t Half(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Block b of a GGUF row as RepackPlanar lays it out: the quant words (Q4:
// weight 8k + j in nibble j of word k; Q8_0: the 32 bytes) and the scale
// word (f16 d, or d | m << 16 for Q4_1).
inline void PlanarBlock(gguf::TensorType type, const uint8_t* row, int64_t b, uint32_t* wq,
                        uint32_t* scale) {
  if (type == gguf::TensorType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    *scale = Half(blk);
    for (int k = 0; k < 8; ++k) wq[k] = Word(blk + 2 + 4 * k);
    return;
  }
  const bool min = type == gguf::TensorType::kQ4_1;
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
float RowDot(gguf::TensorType type, const uint8_t* row, int64_t cols, const float* x,
             SumOrder order) {
  const int64_t nblk = cols / 32;
  auto step = [&](int64_t b, float acc) {
    uint32_t wq[8], scale;
    PlanarBlock(type, row, b, wq, &scale);
    i8::ActBlock a;
    i8::QuantizeBlock<kType>(x + 32 * b, &a);
    return i8::BlockStep<kType>(i8::BlockDot<kType>(wq, a.q1, a.q2), scale, a.e, a.s, acc);
  };
  if (order == SumOrder::kSequential) {
    float acc = 0.f;
    for (int64_t b = 0; b < nblk; ++b) acc = step(b, acc);
    return acc;
  }
  float lanes[32];
  for (int l = 0; l < 32; ++l) {
    lanes[l] = 0.f;
    for (int64_t b = l; b < nblk; b += 32) lanes[l] = step(b, lanes[l]);
  }
  for (int o = 16; o > 0; o >>= 1) {  // WarpSum: lane l adds lane l ^ o
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
    std::memcpy(lanes, next, sizeof(lanes));
  }
  return lanes[0];
}

// One (row, token) of GemvInt8 on a GGUF row (cols % 32 == 0).
inline float HostRowDot(gguf::TensorType type, const uint8_t* row, int64_t cols, const float* x,
                        SumOrder order = SumOrder::kSequential) {
  switch (type) {
    case gguf::TensorType::kQ4_0:
      return RowDot<i8::kQ4_0>(type, row, cols, x, order);
    case gguf::TensorType::kQ4_1:
      return RowDot<i8::kQ4_1>(type, row, cols, x, order);
    default:
      return RowDot<i8::kQ8_0>(type, row, cols, x, order);
  }
}

}  // namespace tandem::kernels::cuda::testing

#endif  // TANDEM_TESTS_CUDA_INT8_EMULATION_H_
