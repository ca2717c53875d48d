// The integer grid of one stored quantization block, for algorithms that
// choose the integers themselves (GPTQ): element i of a block decodes to
// scale[i] * q + offset[i] with q an integer in [qmin, qmax]; SetQ writes q
// into the block's bytes without touching its scales.
//
// Types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32), Q4_K, Q5_K, Q6_K
// (blocks of 256; scales per 32 or 16 elements).
//
// Thread safety: pure functions.
#ifndef TANDEM_QUANT_BLOCK_GRID_H_
#define TANDEM_QUANT_BLOCK_GRID_H_

#include <cstdint>

#include "common/gguf/types.h"

namespace tandem::quant {

struct GridRange {
  int qmin = 0;
  int qmax = 0;
};

bool HasGrid(gguf::TensorType type);
// Elements (32 or 256) and bytes per block: gguf::GetTypeTraits' block_size
// and type_size. REQUIRES: HasGrid(type).
int BlockSize(gguf::TensorType type);
int BlockBytes(gguf::TensorType type);
GridRange RangeOf(gguf::TensorType type);

// scale / offset: BlockSize(type) floats each.
void GridOf(gguf::TensorType type, const uint8_t* block, float* scale, float* offset);

// REQUIRES: 0 <= i < BlockSize(type), q in RangeOf(type).
void SetQ(gguf::TensorType type, uint8_t* block, int i, int q);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_BLOCK_GRID_H_
