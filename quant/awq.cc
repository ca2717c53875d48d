#include "quant/awq.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/status.h"
#include "kernels/quant.h"
#include "quant/block_grid.h"

namespace tandem::quant {
namespace {

constexpr int kB = 32;

// Round trip of one row through the stored format.
void RoundTrip(gguf::TensorType type, const float* x, float* y, int64_t n, std::string* buf) {
  buf->resize(*gguf::RowBytes(type, n));
  kernels::QuantizeRow(type, x, buf->data(), n);
  kernels::DequantizeRow(type, buf->data(), y, n);
}

// e^T H e over n elements (whole 32-blocks) with their diagonal blocks of
// H from `hblocks` on.
double BlockError(const float* e, const float* hblocks, int64_t n) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kB) {
    const float* h = hblocks + (b / kB) * kB * kB;
    const float* eb = e + b;
    // H e as a sum of H's rows (vectorizes), then e . (H e).
    float he[kB] = {};
    for (int i = 0; i < kB; ++i) {
      const float ei = eb[i];
      for (int j = 0; j < kB; ++j) he[j] += h[i * kB + j] * ei;
    }
    float acc = 0;
    for (int j = 0; j < kB; ++j) acc += eb[j] * he[j];
    total += acc;
  }
  return total;
}

double Sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

}  // namespace

InputStats ComputeInputStats(const float* x, int64_t tokens, int64_t cols, ThreadPool* pool) {
  TANDEM_CHECK(cols % kB == 0);
  InputStats st;
  st.cols = cols;
  st.mean_abs.assign(cols, 0.f);
  st.hblocks.assign(cols * kB, 0.f);
  ThreadPool::Run(pool, cols / kB, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* h = st.hblocks.data() + b * kB * kB;
      for (int64_t t = 0; t < tokens; ++t) {
        const float* xb = x + t * cols + b * kB;
        for (int i = 0; i < kB; ++i) {
          st.mean_abs[b * kB + i] += std::fabs(xb[i]);
          for (int j = 0; j < kB; ++j) h[i * kB + j] += xb[i] * xb[j];
        }
      }
      for (int i = 0; i < kB; ++i) st.mean_abs[b * kB + i] /= std::max<int64_t>(tokens, 1);
    }
  });
  return st;
}

double ProxyError(const InputStats& stats, const AwqLinear& l, ThreadPool* pool) {
  const int64_t n = stats.cols;
  std::vector<double> per_row(l.rows, 0.0);
  ThreadPool::Run(pool, l.rows, [&](int64_t begin, int64_t end) {
    std::vector<float> q(n);
    std::string buf;
    for (int64_t r = begin; r < end; ++r) {
      const float* w = l.w + r * n;
      RoundTrip(l.type, w, q.data(), n, &buf);
      for (int64_t c = 0; c < n; ++c) q[c] = w[c] - q[c];
      per_row[r] = BlockError(q.data(), stats.hblocks.data(), n);
    }
  });
  return Sum(per_row);
}

std::vector<float> SearchScales(const InputStats& stats, const std::vector<AwqLinear>& linears,
                                const AwqOptions& options, ThreadPool* pool, float* best_alpha) {
  const int64_t n = stats.cols;
  std::vector<float> best_s(n, 1.f), s(n);
  double best = -1;
  *best_alpha = 0.f;
  for (int g = 0; g < std::max(1, options.grid); ++g) {
    const float alpha = static_cast<float>(g) / static_cast<float>(std::max(1, options.grid));
    float mx = 0, mn = INFINITY;
    for (int64_t c = 0; c < n; ++c) {
      s[c] = std::pow(std::max(stats.mean_abs[c], 1e-4f), alpha);
      mx = std::max(mx, s[c]);
      mn = std::min(mn, s[c]);
    }
    const float norm = std::sqrt(mx * mn);
    for (float& v : s) v /= norm;
    double loss = 0;
    for (const AwqLinear& l : linears) {
      std::vector<double> per_row(l.rows, 0.0);
      ThreadPool::Run(pool, l.rows, [&](int64_t begin, int64_t end) {
        std::vector<float> ws(n), q(n);
        std::string buf;
        for (int64_t r = begin; r < end; ++r) {
          const float* w = l.w + r * n;
          for (int64_t c = 0; c < n; ++c) ws[c] = w[c] * s[c];
          RoundTrip(l.type, ws.data(), q.data(), n, &buf);
          for (int64_t c = 0; c < n; ++c) q[c] = w[c] - q[c] / s[c];
          per_row[r] = BlockError(q.data(), stats.hblocks.data(), n);
        }
      });
      loss += Sum(per_row);
    }
    if (best < 0 || loss < best) {
      best = loss;
      best_s = s;
      *best_alpha = alpha;
    }
  }
  return best_s;
}

void SearchClip(const InputStats& stats, const std::vector<float>& s, const AwqLinear& l,
                const AwqOptions& options, ThreadPool* pool) {
  if (options.clip_grid <= 1) return;
  const int64_t n = stats.cols;
  // The input of the scaled linear is x / s: H_ij / (s_i s_j).
  std::vector<float> h = stats.hblocks;
  if (!s.empty()) {
    for (int64_t b = 0; b < n / kB; ++b) {
      for (int i = 0; i < kB; ++i) {
        for (int j = 0; j < kB; ++j) h[(b * kB + i) * kB + j] /= s[b * kB + i] * s[b * kB + j];
      }
    }
  }
  const int64_t unit = BlockSize(l.type);
  ThreadPool::Run(pool, l.rows, [&](int64_t begin, int64_t end) {
    std::vector<float> clipped(unit), q(unit), best_w(unit), e(unit);
    std::string buf;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t u = 0; u < n; u += unit) {
        float* w = l.w + r * n + u;
        float amax = 0;
        for (int64_t i = 0; i < unit; ++i) amax = std::max(amax, std::fabs(w[i]));
        double best = -1;
        for (int k = 0; k < options.clip_grid; ++k) {
          const float ratio = 1.f - static_cast<float>(options.max_shrink) * k / options.clip_grid;
          const float lim = amax * ratio;
          for (int64_t i = 0; i < unit; ++i) clipped[i] = std::clamp(w[i], -lim, lim);
          RoundTrip(l.type, clipped.data(), q.data(), unit, &buf);
          // The error against the unclipped weights: clipping is part of it.
          for (int64_t i = 0; i < unit; ++i) e[i] = w[i] - q[i];
          const double err = BlockError(e.data(), h.data() + (u / kB) * kB * kB, unit);
          if (best < 0 || err < best) {
            best = err;
            best_w = clipped;
          }
        }
        std::copy(best_w.begin(), best_w.end(), w);
      }
    }
  });
}

}  // namespace tandem::quant
