#include "quant/block_grid.h"

#include <cstring>

#include "common/status.h"
#include "kernels/quant.h"

namespace tandem::quant {
namespace {

using gguf::TensorType;

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return kernels::Fp16ToFp32(h);
}

void SetNibble(uint8_t* byte, int high, int v) {
  *byte = high ? static_cast<uint8_t>((*byte & 0x0F) | (v << 4))
               : static_cast<uint8_t>((*byte & 0xF0) | v);
}

void SetBit(uint8_t* bytes, int bit, int v) {
  uint8_t& b = bytes[bit / 8];
  b = static_cast<uint8_t>((b & ~(1 << (bit % 8))) | (v << (bit % 8)));
}

// The (scale, min) pair j of the 12-byte Q4_K / Q5_K scales.
void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void Fill(float* scale, float* offset, int begin, int n, float s, float o) {
  for (int i = begin; i < begin + n; ++i) scale[i] = s, offset[i] = o;
}

}  // namespace

bool HasGrid(TensorType type) {
  switch (type) {
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ5_0:
    case TensorType::kQ5_1:
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int BlockSize(TensorType type) {
  TANDEM_CHECK(HasGrid(type));
  return static_cast<int>(gguf::GetTypeTraits(type)->block_size);
}

int BlockBytes(TensorType type) {
  TANDEM_CHECK(HasGrid(type));
  return static_cast<int>(gguf::GetTypeTraits(type)->type_size);
}

GridRange RangeOf(TensorType type) {
  switch (type) {
    case TensorType::kQ8_0:
      return {1, 255};  // int8 -127..127 stored as q - 128
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ4_K:
      return {0, 15};
    case TensorType::kQ5_0:
    case TensorType::kQ5_1:
    case TensorType::kQ5_K:
      return {0, 31};
    case TensorType::kQ6_K:
      return {0, 63};
    default:
      TANDEM_CHECK(false);
  }
  return {};
}

void GridOf(TensorType type, const uint8_t* b, float* scale, float* offset) {
  switch (type) {
    case TensorType::kQ8_0: {
      const float d = Half(b);
      return Fill(scale, offset, 0, 32, d, -128 * d);
    }
    case TensorType::kQ4_0: {
      const float d = Half(b);
      return Fill(scale, offset, 0, 32, d, -8 * d);
    }
    case TensorType::kQ5_0: {
      const float d = Half(b);
      return Fill(scale, offset, 0, 32, d, -16 * d);
    }
    case TensorType::kQ4_1:
    case TensorType::kQ5_1:
      return Fill(scale, offset, 0, 32, Half(b), Half(b + 2));
    case TensorType::kQ4_K:
    case TensorType::kQ5_K: {
      const float d = Half(b), dmin = Half(b + 2);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        ScaleMinK4(j, b + 4, &sc, &m);
        Fill(scale, offset, 32 * j, 32, d * static_cast<float>(sc), -dmin * static_cast<float>(m));
      }
      return;
    }
    case TensorType::kQ6_K: {
      const float d = Half(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int j = 0; j < 16; ++j) {
        const float s = d * static_cast<float>(sc[j]);
        Fill(scale, offset, 16 * j, 16, s, -32 * s);
      }
      return;
    }
    default:
      TANDEM_CHECK(false);
  }
}

void SetQ(TensorType type, uint8_t* b, int i, int q) {
  switch (type) {
    case TensorType::kQ8_0:
      b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q - 128));
      return;
    case TensorType::kQ4_0:
      return SetNibble(b + 2 + i % 16, i / 16, q);
    case TensorType::kQ4_1:
      return SetNibble(b + 4 + i % 16, i / 16, q);
    case TensorType::kQ5_0:
      SetBit(b + 2, i, q >> 4);
      return SetNibble(b + 6 + i % 16, i / 16, q & 0x0F);
    case TensorType::kQ5_1:
      SetBit(b + 4, i, q >> 4);
      return SetNibble(b + 8 + i % 16, i / 16, q & 0x0F);
    case TensorType::kQ4_K: {
      const int j = i / 32, l = i % 32;
      return SetNibble(b + 16 + 32 * (j / 2) + l, j % 2, q);
    }
    case TensorType::kQ5_K: {
      const int j = i / 32, l = i % 32;
      uint8_t& h = b[16 + l];
      h = static_cast<uint8_t>((h & ~(1 << j)) | ((q >> 4) << j));
      return SetNibble(b + 48 + 32 * (j / 2) + l, j % 2, q & 0x0F);
    }
    case TensorType::kQ6_K: {
      const int h = i / 128, s = (i / 32) % 4, l = i % 32;
      SetNibble(b + 64 * h + 32 * (s % 2) + l, s / 2, q & 0x0F);
      uint8_t& hb = b[128 + 32 * h + l];
      hb = static_cast<uint8_t>((hb & ~(3 << (2 * s))) | ((q >> 4) << (2 * s)));
      return;
    }
    default:
      TANDEM_CHECK(false);
  }
}

}  // namespace tandem::quant
