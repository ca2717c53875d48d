// Per-ISA entry points behind kernels/qgemm.h (internal). Each ISA lives in
// its own translation unit compiled with that ISA's target flags
// (kernels/CMakeLists.txt), so the default and -DTANDEM_NATIVE=OFF builds
// both carry every path; qgemm.cc picks one at run time from CPUID.
#ifndef TANDEM_KERNELS_CPU_QGEMM_IMPL_H_
#define TANDEM_KERNELS_CPU_QGEMM_IMPL_H_

#include <cmath>
#include <cstdint>

#include "kernels/cpu/variant.h"
#include "kernels/qgemm.h"

namespace tandem::kernels::cpu {

// Where one token's quantized row goes: pointers at its block 0; block b is
// at q + b * kActTile * 32 and d / sd / s / s_lo [b * kActTile] (the
// QuantizedActs tile layout). q2 == nullptr: one level. row_amax >= 0:
// every block uses it as its max|x| (ActScale::kPerToken); < 0: per block.
struct ActRow {
  int8_t* q;
  float* d;
  float* sd;
  int32_t* s;
  int8_t* q2;
  int32_t* s_lo;
  float row_amax = -1.f;
};

TANDEM_KERNELS_ABI_BEGIN  // per-ISA symbols (kernels/cpu/variant.h)

// max|x_i| over n floats (exact in any order), the per-token amax.
inline float RowAbsMax(const float* x, int64_t n) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  return amax;
}

inline ActRow RowOf(QuantizedActs* a, int64_t t) {
  const int64_t i = a->Index(t, 0);
  const bool two = a->levels == 2;
  return {a->qs.data() + i * kQBlock,
          a->d.data() + i,
          a->sd.data() + i,
          a->s.data() + i,
          two ? a->qs2.data() + i * kQBlock : nullptr,
          a->s_lo.data() + i,
          -1.f};
}

// RowOf with the per-token amax of x (one row of a->cols floats) when
// `per_token`.
inline ActRow RowOf(QuantizedActs* a, int64_t t, const float* x, bool per_token) {
  ActRow row = RowOf(a, t);
  if (per_token) row.row_amax = RowAbsMax(x, a->cols);
  return row;
}

// Stores block slot k of `o` from the level sums (kernels/qgemm.h): one
// level (sum, lo of q), or with `two` the second level's too, combined as
// 256 * level 1 + level 2 on the grid e = dx / 256.
inline void StoreActBlock(const ActRow& o, int64_t k, float dx, int32_t sum, int32_t lo, bool two,
                          int32_t sum2, int32_t lo2) {
  float d = dx;
  if (two) {
    sum = sum * 256 + sum2;
    lo = lo * 256 + lo2;
    d = dx * (1.f / 256.f);
  }
  o.d[k] = d;
  o.s[k] = sum;
  o.s_lo[k] = lo;
  o.sd[k] = d * float(sum);
}

TANDEM_KERNELS_ABI_END

struct QGemmImpl {
  const char* name;
  // Row groups [g0, g1) for all tokens of `acts` (see QGemm).
  void (*gemm)(const PackedWeight& w, const QuantizedActs& acts, int64_t g0, int64_t g1, float* y,
               int64_t ldy, bool accumulate);
  // One row of `cols` floats -> per 32-block quants, scales and sums.
  void (*quantize_row)(const float* x, int64_t cols, const ActRow& out);
  // out[i] = silu(gate[i]) * up[i] for n floats.
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
};

// Null when the TU was built without the ISA (non-x86 hosts).
const QGemmImpl* Avx512VnniImpl();
// AMX-INT8 GEMM for >= 8 tokens (VNNI below, VNNI's quantize / SiLU); null
// also when the OS does not grant the tile state.
const QGemmImpl* Avx512AmxImpl();
const QGemmImpl* Avx2Impl();
const QGemmImpl* ScalarImpl();

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_CPU_QGEMM_IMPL_H_
