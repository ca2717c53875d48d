// Dispatched element-wise ops. RmsNorm runs the reference's double
// arithmetic in its fixed lane order on AVX-512 (bit-identical to it);
// Softmax reuses the reference; Rope / RopeQK
// compute the angles once per token instead of once per head (and array),
// RopeQKAngles takes them from RopeAngles (once per forward, for all layers).
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/variant.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
TANDEM_KERNELS_VARIANT_BEGIN

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
#if TANDEM_KERNELS_AVX512
  // ref::RmsNorm's operations and order, 8 doubles at a time.
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    float* yt = y + t * dim;
    __m512d acc = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(xt + i));
      acc = _mm512_fmadd_pd(v, v, acc);  // the square is exact: one rounding, as + v * v
    }
    const __mmask8 tail = static_cast<__mmask8>((1u << (dim - i)) - 1u);
    if (tail != 0) {
      const __m512d v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(tail, xt + i));
      acc = _mm512_mask3_fmadd_pd(v, v, acc, tail);
    }
    const __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd(acc, 1));
    const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    const double ss = _mm_cvtsd_f64(q) + _mm_cvtsd_f64(_mm_unpackhi_pd(q, q));
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    const __m512d iv = _mm512_set1_pd(inv);
    i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m256 p = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xt + i)), iv));
      _mm256_storeu_ps(yt + i, _mm256_mul_ps(p, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yt[i] = float(xt[i] * inv) * weight[i];
  }
#else
  ref::RmsNorm(x, weight, n, dim, eps, y);
#endif
}

namespace {

// Rotates `num_heads` heads of one token by the (cos, sin) pairs in cs.
void RotateHeads(float* x, int64_t num_heads, int64_t head_dim, const float* cs,
                 const RopeParams& p) {
  const int64_t half = p.rot_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = p.style == RopeStyle::kAdjacentPairs ? 2 * i : i;
      const int64_t i1 = p.style == RopeStyle::kAdjacentPairs ? 2 * i + 1 : i + half;
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float x0 = v[i0], x1 = v[i1];
      // Explicit fused multiply-adds: the rounding does not depend on
      // how the compiler contracts a * b - c * d in this translation unit,
      // so the reference and every variant stay bit-identical.
      v[i0] = std::fma(x0, c, -(x1 * s));
      v[i1] = std::fma(x0, s, x1 * c);
    }
  }
}

// Applies rope to up to two arrays (k may be null) with the same angles cs
// ([n, rot_dim], RopeAngles).
void RopeImpl(float* q, int64_t q_heads, float* k, int64_t k_heads, const float* cs, int64_t n,
              int64_t head_dim, const RopeParams& p) {
  for (int64_t t = 0; t < n; ++t) {
    const float* ct = cs + t * p.rot_dim;
    RotateHeads(q + t * q_heads * head_dim, q_heads, head_dim, ct, p);
    if (k != nullptr) RotateHeads(k + t * k_heads * head_dim, k_heads, head_dim, ct, p);
  }
}

}  // namespace

void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,
          const RopeParams& p) {
  std::vector<float> cs(n * p.rot_dim);
  RopeAngles(positions, n, p, cs.data());
  RopeImpl(x, num_heads, nullptr, 0, cs.data(), n, head_dim, p);
}

void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,
            int64_t num_kv_heads, int64_t head_dim, const RopeParams& p) {
  std::vector<float> cs(n * p.rot_dim);
  RopeAngles(positions, n, p, cs.data());
  RopeImpl(q, num_heads, k, num_kv_heads, cs.data(), n, head_dim, p);
}

void RopeQKAngles(float* q, float* k, const float* cs, int64_t n, int64_t num_heads,
                  int64_t num_kv_heads, int64_t head_dim, const RopeParams& p) {
  RopeImpl(q, num_heads, k, num_kv_heads, cs, n, head_dim, p);
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  ref::SiluMul(gate, up, n, out);
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Softmax(float* x, int64_t n, int64_t dim) { ref::Softmax(x, n, dim); }

TANDEM_KERNELS_VARIANT_END

#if TANDEM_KERNELS_VARIANT_PRIMARY
// Scalar double math, the same expression as ref::Rope, so every variant's
// rotation uses the reference's angles (defined once: it is not per ISA).
void RopeAngles(const int32_t* positions, int64_t n, const RopeParams& p, float* cs) {
  const int64_t half = p.rot_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
  }
  for (int64_t t = 0; t < n; ++t) {
    float* ct = cs + t * p.rot_dim;
    for (int64_t i = 0; i < half; ++i) {
      double theta = double(positions[t]) * p.freq_scale * inv_freq[i];
      if (p.freq_factors != nullptr) theta /= p.freq_factors[i];
      ct[2 * i] = static_cast<float>(std::cos(theta));
      ct[2 * i + 1] = static_cast<float>(std::sin(theta));
    }
  }
}
#endif
}  // namespace tandem::kernels
