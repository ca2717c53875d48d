#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/quant.h"
#include "quant/block_grid.h"

namespace tandem::quant {

std::vector<double> Gram(const float* x, int64_t tokens, int64_t cols, ThreadPool* pool) {
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  ThreadPool::Run(pool, cols, [&](int64_t begin, int64_t end) {
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * cols;
      for (int64_t i = begin; i < end; ++i) {
        const double xi = xt[i];
        if (xi == 0.0) continue;
        double* hi = h.data() + i * cols;
        for (int64_t j = 0; j < cols; ++j) hi[j] += xi * xt[j];
      }
    }
  });
  return h;
}

namespace {

// sum a[k] * b[k] over [begin, end) with four partial sums (the chains of a
// single sum would make the Cholesky latency bound).
double Dot(const double* a, const double* b, int64_t begin, int64_t end) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = begin;
  for (; k + 4 <= end; k += 4) {
    s0 += a[k] * b[k];
    s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2];
    s3 += a[k + 3] * b[k + 3];
  }
  for (; k < end; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

// V upper triangular with H = V V^T (a Cholesky factorization in reverse
// index order); false when H is not positive definite.
bool ReverseCholesky(const std::vector<double>& h, int64_t n, std::vector<double>* v,
                     ThreadPool* pool) {
  v->assign(static_cast<size_t>(n * n), 0.0);
  double* V = v->data();
  for (int64_t j = n - 1; j >= 0; --j) {
    const double* vj = V + j * n;
    const double d = h[j * n + j] - Dot(vj, vj, j + 1, n);
    if (!(d > 0.0)) return false;
    const double djj = std::sqrt(d);
    V[j * n + j] = djj;
    ThreadPool::Run(
        pool, j,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            V[i * n + j] = (h[i * n + j] - Dot(V + i * n, vj, j + 1, n)) / djj;
          }
        },
        64);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<float>> InverseCholeskyUpper(std::vector<double> h, int64_t n,
                                                        double damp, ThreadPool* pool) {
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (h[i * n + i] == 0.0) h[i * n + i] = 1.0;  // dead input: any positive value
    mean_diag += h[i * n + i];
  }
  mean_diag /= static_cast<double>(n);
  std::vector<double> v;
  double lambda = damp * mean_diag;
  bool ok = false;
  for (int attempt = 0; attempt < 4 && !ok; ++attempt, lambda *= 10) {
    std::vector<double> hd = h;
    for (int64_t i = 0; i < n; ++i) hd[i * n + i] += lambda;
    ok = ReverseCholesky(hd, n, &v, pool);
  }
  if (!ok) return absl::InternalError("gptq: the Hessian is not positive definite");
  // U = V^-1 (upper triangular): H^-1 = V^-T V^-1 = U^T U. Column j of U
  // solves V u = e_j by back substitution; columns are independent.
  std::vector<double> ut(static_cast<size_t>(n * n), 0.0);  // ut[j][i] = U[i][j]
  ThreadPool::Run(
      pool, n,
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          double* u = ut.data() + j * n;
          u[j] = 1.0 / v[j * n + j];
          for (int64_t i = j - 1; i >= 0; --i) {
            const double* vi = v.data() + i * n;
            u[i] = -Dot(vi, u, i + 1, j + 1) / vi[i];
          }
        }
      },
      16);
  std::vector<float> u(static_cast<size_t>(n * n), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i; j < n; ++j) u[i * n + j] = static_cast<float>(ut[j * n + i]);
  }
  return u;
}

std::vector<int64_t> ActOrder(const std::vector<double>& h, int64_t cols) {
  std::vector<int64_t> order(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return h[a * cols + a] > h[b * cols + b]; });
  return order;
}

std::vector<double> PermuteGram(const std::vector<double>& h, const std::vector<int64_t>& perm) {
  const int64_t n = static_cast<int64_t>(perm.size());
  std::vector<double> out(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    const double* hi = h.data() + perm[i] * n;
    for (int64_t j = 0; j < n; ++j) out[i * n + j] = hi[perm[j]];
  }
  return out;
}

void GptqQuantize(gguf::TensorType type, const std::vector<float>& u, float* w, int64_t rows,
                  int64_t cols, ThreadPool* pool, std::string* out,
                  const std::vector<int64_t>& order) {
  TANDEM_CHECK(HasGrid(type));
  const int bs = BlockSize(type), bb = BlockBytes(type);
  TANDEM_CHECK(cols % bs == 0);
  const bool act_order = !order.empty();
  TANDEM_CHECK(!act_order || static_cast<int64_t>(order.size()) == cols);
  const int64_t row_bytes = cols / bs * bb;
  out->assign(static_cast<size_t>(rows * row_bytes), '\0');
  const GridRange range = RangeOf(type);
  ThreadPool::Run(pool, rows, [&](int64_t begin, int64_t end) {
    // With act-order x is a copy of the row in step order (the feedback
    // runs over contiguous memory) and the grid is every column's, fixed
    // first (static scales); without, x is the row and the grid the current
    // block's (dynamic scales).
    std::vector<float> scale(act_order ? cols : bs), offset(act_order ? cols : bs);
    std::vector<float> permuted(act_order ? cols : 0);
    for (int64_t r = begin; r < end; ++r) {
      float* wr = w + r * cols;
      auto* row_out = reinterpret_cast<uint8_t*>(out->data() + r * row_bytes);
      float* x = wr;
      if (act_order) {
        for (int64_t b = 0; b < cols / bs; ++b) {
          kernels::QuantizeRow(type, wr + b * bs, row_out + b * bb, bs);
          GridOf(type, row_out + b * bb, scale.data() + b * bs, offset.data() + b * bs);
        }
        for (int64_t i = 0; i < cols; ++i) permuted[i] = wr[order[i]];
        x = permuted.data();
      }
      for (int64_t i = 0; i < cols; ++i) {
        // Step i quantizes column c of the row, x[i].
        const int64_t c = act_order ? order[i] : i;
        const int in_block = static_cast<int>(c % bs);
        uint8_t* block = row_out + (c / bs) * bb;
        if (!act_order && in_block == 0) {
          kernels::QuantizeRow(type, wr + c, block, bs);
          GridOf(type, block, scale.data(), offset.data());
        }
        const int64_t g = act_order ? c : in_block;  // the column's grid entry
        const float s = scale[g], o = offset[g];
        // A zero scale decodes every integer to the offset: keep the
        // reference quantizer's integer, feed back the error all the same.
        float qv = o;
        if (s != 0.0f) {
          const float t = std::nearbyintf((x[i] - o) / s);
          const int q =
              static_cast<int>(std::fmin(std::fmax(t, float(range.qmin)), float(range.qmax)));
          SetQ(type, block, in_block, q);
          qv = s * static_cast<float>(q) + o;
        }
        const float err = (x[i] - qv) / u[i * cols + i];
        x[i] = qv;
        const float* ui = u.data() + i * cols;
        for (int64_t j = i + 1; j < cols; ++j) x[j] -= err * ui[j];
      }
      // The stored values are what the model will see.
      kernels::DequantizeRow(type, row_out, wr, cols);
    }
  });
}

}  // namespace tandem::quant
