#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"

namespace tandem::engine {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0) || !std::isfinite(temperature) || temperature > 100.0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be in [0, 100], got %g", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("top_k must be >= 0, got %d", top_k));
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p must be in (0, 1], got %g", top_p));
  }
  if (!(min_p >= 0.0 && min_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("min_p must be in [0, 1], got %g", min_p));
  }
  return absl::OkStatus();
}

namespace {

// SplitMix64 finalizer: a bijective mix of 64 bits.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

double CounterUniform(uint64_t seed, uint64_t counter) {
  // Two rounds keyed by seed so that (seed, counter) pairs do not collide
  // along diagonals.
  uint64_t x = Mix64(Mix64(seed + 0x9e3779b97f4a7c15ULL) ^ (counter * 0xd1b54a32d192ed03ULL));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

void Sampler::Candidates(absl::Span<const float> logits, const SamplingParams& params,
                         std::vector<int32_t>* ids, std::vector<double>* probs) {
  const int32_t n = static_cast<int32_t>(logits.size());
  ids->resize(n);
  std::iota(ids->begin(), ids->end(), 0);
  // Descending logit, ascending id on ties: a total order, so the result does
  // not depend on the sort algorithm.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t keep = n;
  if (params.top_k > 0 && params.top_k < n) {
    keep = static_cast<int32_t>(params.top_k);
    std::partial_sort(ids->begin(), ids->begin() + keep, ids->end(), by_logit);
    ids->resize(keep);
  } else {
    std::sort(ids->begin(), ids->end(), by_logit);
  }
  const double inv_t = 1.0 / params.temperature;
  const double max_logit = logits[(*ids)[0]];
  probs->resize(keep);
  double sum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    double p = std::exp((logits[(*ids)[i]] - max_logit) * inv_t);
    (*probs)[i] = p;
    sum += p;
  }
  for (double& p : *probs) p /= sum;
  // min-p: drop tokens below min_p * p(max). probs are sorted descending.
  if (params.min_p > 0.0) {
    const double threshold = params.min_p * (*probs)[0];
    int32_t k = 1;
    while (k < keep && (*probs)[k] >= threshold) ++k;
    keep = k;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params.top_p < 1.0) {
    double cum = 0.0;
    int32_t k = 0;
    while (k < keep) {
      cum += (*probs)[k++];
      if (cum >= params.top_p) break;
    }
    keep = k;
  }
  ids->resize(keep);
  probs->resize(keep);
  double kept = 0.0;
  for (double p : *probs) kept += p;
  for (double& p : *probs) p /= kept;
}

int32_t Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params,
                        int64_t position) {
  if (params.temperature == 0.0) return Argmax(logits);
  Candidates(logits, params, &ids_, &probs_);
  const double u = CounterUniform(params.seed, static_cast<uint64_t>(position));
  double cum = 0.0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    cum += probs_[i];
    if (u < cum) return ids_[i];
  }
  return ids_.back();  // u within rounding of 1.0
}

}  // namespace tandem::engine
