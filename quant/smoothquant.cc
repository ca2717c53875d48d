#include "quant/smoothquant.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace tandem::quant {

std::vector<float> ColumnAbsMax(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> m(static_cast<size_t>(cols), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m[c] = std::max(m[c], std::fabs(x[r * cols + c]));
  }
  return m;
}

std::vector<float> SmoothScales(const std::vector<float>& act_max,
                                const std::vector<float>& weight_max, float alpha) {
  TANDEM_CHECK(act_max.size() == weight_max.size() && alpha >= 0.f && alpha <= 1.f);
  std::vector<float> s(act_max.size(), 1.f);
  for (size_t c = 0; c < s.size(); ++c) {
    if (!(act_max[c] > 0.f) || !(weight_max[c] > 0.f)) continue;
    const double a = std::max(act_max[c], 1e-5f), w = std::max(weight_max[c], 1e-5f);
    s[c] = static_cast<float>(std::pow(a, alpha) / std::pow(w, 1.0 - alpha));
  }
  return s;
}

}  // namespace tandem::quant
