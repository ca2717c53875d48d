// Scalar references for the dense ops: plain loops, double accumulators.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace tandem::kernels::ref {

void MatMul(const WeightView& w, const float* x, int64_t n, float* y) {
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(row[c]) * double(xt[c]);
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    DequantizeRow(table.type, table.row(ids[t]), out + t * table.cols, table.cols);
  }
}

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    // Sum of squares in double (each square exact), element i into lane
    // i % 8, lanes added in the tree of an AVX-512 halving reduction: the
    // order kernels::RmsNorm's vector path takes, so both are bit-identical.
    double lane[8] = {};
    for (int64_t i = 0; i < dim; ++i) lane[i % 8] += double(xt[i]) * xt[i];
    const double ss =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] = float(xt[i] * inv) * weight[i];
  }
}

void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,
          const RopeParams& p) {
  const int64_t half = p.rot_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        double theta = double(positions[t]) * p.freq_scale *
                       std::pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
        if (p.freq_factors != nullptr) theta /= p.freq_factors[i];
        const float c = static_cast<float>(std::cos(theta));
        const float s = static_cast<float>(std::sin(theta));
        const int64_t i0 = p.style == RopeStyle::kAdjacentPairs ? 2 * i : i;
        const int64_t i1 = p.style == RopeStyle::kAdjacentPairs ? 2 * i + 1 : i + half;
        const float x0 = v[i0], x1 = v[i1];
        // Fused as in ops.cc (explicit fma: bit-identical whatever the
        // compiler contracts).
        v[i0] = std::fma(x0, c, -(x1 * s));
        v[i1] = std::fma(x0, s, x1 * c);
      }
    }
  }
}

void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,
            int64_t num_kv_heads, int64_t head_dim, const RopeParams& p) {
  ref::Rope(q, positions, n, num_heads, head_dim, p);
  ref::Rope(k, positions, n, num_kv_heads, head_dim, p);
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Softmax(float* x, int64_t n, int64_t dim) {
  for (int64_t t = 0; t < n; ++t) {
    float* v = x + t * dim;
    float mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) mx = std::fmax(mx, v[i]);
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) {
      v[i] = std::exp(v[i] - mx);
      sum += v[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i) v[i] *= inv;
  }
}

}  // namespace tandem::kernels::ref
