// Dispatched element-wise ops. RmsNorm and Softmax reuse the references
// (cheap, and their double accumulation is order-fixed); Rope / RopeQK
// compute the angles once per token instead of once per head (and array).
#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::kernels {

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  ref::RmsNorm(x, weight, n, dim, eps, y);
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
      v[i0] = x0 * c - x1 * s;
      v[i1] = x0 * s + x1 * c;
    }
  }
}

// Applies rope to up to two arrays (k may be null) sharing positions.
void RopeImpl(float* q, int64_t q_heads, float* k, int64_t k_heads, const int32_t* positions,
              int64_t n, int64_t head_dim, const RopeParams& p) {
  const int64_t half = p.rot_dim / 2;
  std::vector<float> cs(2 * half);
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Same expression as ref::Rope so both give identical angles.
      double theta = double(positions[t]) * p.freq_scale * inv_freq[i];
      if (p.freq_factors != nullptr) theta /= p.freq_factors[i];
      cs[2 * i] = static_cast<float>(std::cos(theta));
      cs[2 * i + 1] = static_cast<float>(std::sin(theta));
    }
    RotateHeads(q + t * q_heads * head_dim, q_heads, head_dim, cs.data(), p);
    if (k != nullptr) RotateHeads(k + t * k_heads * head_dim, k_heads, head_dim, cs.data(), p);
  }
}

}  // namespace

void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,
          const RopeParams& p) {
  RopeImpl(x, num_heads, nullptr, 0, positions, n, head_dim, p);
}

void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,
            int64_t num_kv_heads, int64_t head_dim, const RopeParams& p) {
  RopeImpl(q, num_heads, k, num_kv_heads, positions, n, head_dim, p);
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  ref::SiluMul(gate, up, n, out);
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Softmax(float* x, int64_t n, int64_t dim) { ref::Softmax(x, n, dim); }

}  // namespace tandem::kernels
