// KL against the SmolLM2 goldens (tests/data/logits_smollm2.json): the
// goldens keep the reference's top-20 logits and its full-vocab logsumexp
// per position, so the KL is computed on the distributions coarse-grained to
// {top-20 ids, "everything else"}:
//   sum_i p_i log(p_i / q_i) + r_p log(r_p / r_q),
// with p from the reference (logit - lse_ref), q from our full softmax, and
// r the remaining mass. Exact on the top-20 and a lower bound of the full KL
// (the tail is where both models put < ~1% of the mass).
#ifndef TANDEM_TESTS_UTIL_GOLDEN_KL_H_
#define TANDEM_TESTS_UTIL_GOLDEN_KL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/util/json_reader.h"

namespace tandem::testing {

inline double LogSumExpOf(const float* x, int64_t n) {
  const float mx = *std::max_element(x, x + n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  return mx + std::log(s);
}

// KL(reference || ours) at position t of golden case `c`; `q` is our logits
// row over the whole vocabulary.
inline double GoldenKl(const Json& c, int64_t t, const float* q, int64_t vocab) {
  const std::vector<int32_t> top = c["top_ids"][t].As<int32_t>();
  const std::vector<double> top_logit = c["top_logits"][t].As<double>();
  const double lp = c["logsumexp"][t].number, lq = LogSumExpOf(q, vocab);
  double kl = 0, mass_p = 0, mass_q = 0;
  for (size_t i = 0; i < top.size(); ++i) {
    const double log_p = top_logit[i] - lp, log_q = q[top[i]] - lq;
    kl += std::exp(log_p) * (log_p - log_q);
    mass_p += std::exp(log_p);
    mass_q += std::exp(log_q);
  }
  const double rp = std::max(1e-12, 1 - mass_p), rq = std::max(1e-12, 1 - mass_q);
  return kl + rp * std::log(rp / rq);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_GOLDEN_KL_H_
