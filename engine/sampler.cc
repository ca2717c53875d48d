#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tandem::engine {
namespace {

// SplitMix64 finalizer: a bijective mix of 64 bits.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Descending logit, ascending id on ties: a total order, so selections and
// sorts do not depend on the algorithm.
struct ByLogit {
  absl::Span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Sorted, de-duplicated copy of the ids in [0, vocab_size).
std::vector<int32_t> DistinctIds(absl::Span<const int32_t> ids, int64_t vocab_size) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool MinTokensActive(const SamplingParams& params, const SamplingContext& context) {
  return context.num_output_tokens() < params.stop.min_tokens &&
         (!params.stop.stop_token_ids.empty() ||
          (!params.stop.ignore_eos && !context.eos_token_ids.empty()));
}

absl::Span<const int32_t> OutputIds(const SamplingContext& context) {
  const size_t num_prompt =
      std::min(context.token_ids.size(),
               static_cast<size_t>(std::max<int64_t>(0, context.num_prompt_tokens)));
  return context.token_ids.subspan(num_prompt);
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

bool NeedsProcessing(const SamplingParams& params, const SamplingContext& context) {
  return (params.repetition_penalty != 1.0 && !context.token_ids.empty()) ||
         ((params.presence_penalty != 0.0 || params.frequency_penalty != 0.0) &&
          !OutputIds(context).empty()) ||
         !params.logit_bias.empty() || MinTokensActive(params, context);
}

void ProcessLogits(absl::Span<const float> logits, const SamplingParams& params,
                   const SamplingContext& context, std::vector<float>* out) {
  out->assign(logits.begin(), logits.end());
  const int64_t vocab_size = static_cast<int64_t>(logits.size());
  std::vector<float>& x = *out;
  // Each distinct token is adjusted once, from its own logit only, so the
  // order of the history does not matter.
  if (params.repetition_penalty != 1.0) {
    std::vector<int32_t> seen = DistinctIds(context.token_ids, vocab_size);
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const double penalty = params.repetition_penalty;
    for (int32_t id : seen) {
      const double l = x[id];
      x[id] = static_cast<float>(l > 0 ? l / penalty : l * penalty);
    }
  }
  if (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0) {
    const std::vector<int32_t> output = DistinctIds(OutputIds(context), vocab_size);
    for (size_t i = 0; i < output.size();) {
      size_t j = i;
      while (j < output.size() && output[j] == output[i]) ++j;
      const double count = static_cast<double>(j - i);
      x[output[i]] = static_cast<float>(
          x[output[i]] - (params.frequency_penalty * count + params.presence_penalty));
      i = j;
    }
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < vocab_size) x[id] += bias;
  }
  if (MinTokensActive(params, context)) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int32_t id : params.stop.stop_token_ids) {
      if (id >= 0 && id < vocab_size) x[id] = kNegInf;
    }
    if (!params.stop.ignore_eos) {
      for (int32_t id : context.eos_token_ids) {
        if (id >= 0 && id < vocab_size) x[id] = kNegInf;
      }
    }
  }
}

namespace {

// A threshold on the unnormalized exps (sum `sum`) that keeps a superset of
// the top-p nucleus: if the tokens with exp >= c * sum hold at least top_p of
// the mass, the nucleus lies among them. The second guess always holds (in
// exact arithmetic the rest has mass < (1 - top_p) / 2); else 0 (keep all).
double NucleusCut(const std::vector<double>& exps, double sum, double top_p) {
  const int64_t n = static_cast<int64_t>(exps.size());
  for (double c : {1e-4, 0.5 * (1.0 - top_p) / n}) {
    double mass = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (exps[i] >= c * sum) mass += exps[i];
    }
    if (mass / sum >= top_p + 1e-9) return c * sum;
  }
  return 0.0;
}

}  // namespace

void Sampler::TruncateSorted(const SamplingParams& params) {
  // probs_ is sorted descending. min-p: drop tokens below min_p * p(max).
  size_t keep = probs_.size();
  while (keep > 1 && probs_[keep - 1] == 0.0) --keep;  // masked (-inf) tokens
  if (params.min_p > 0.0) {
    const double threshold = params.min_p * probs_[0];
    size_t k = 1;
    while (k < keep && probs_[k] >= threshold) ++k;
    keep = k;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params.top_p < 1.0) {
    double cum = 0.0;
    size_t k = 0;
    while (k < keep) {
      cum += probs_[k++];
      if (cum >= params.top_p) break;
    }
    keep = k;
  }
  ids_.resize(keep);
  probs_.resize(keep);
  double kept = 0.0;
  for (double p : probs_) kept += p;
  for (double& p : probs_) p /= kept;
}

void Sampler::BuildCandidates(absl::Span<const float> logits, const SamplingParams& params,
                              bool sorted) {
  const int32_t n = static_cast<int32_t>(logits.size());
  const ByLogit by_logit{logits};
  const double inv_t = 1.0 / params.temperature;
  if (params.top_k > 0 && params.top_k < n) {
    // Partial selection: O(V) to find the k best, then sort only those.
    const int32_t k = static_cast<int32_t>(params.top_k);
    ids_.resize(n);
    std::iota(ids_.begin(), ids_.end(), 0);
    std::nth_element(ids_.begin(), ids_.begin() + k, ids_.end(), by_logit);
    ids_.resize(k);
    std::sort(ids_.begin(), ids_.end(), by_logit);
    const double max_logit = logits[ids_[0]];
    probs_.resize(k);
    double sum = 0.0;
    for (int32_t i = 0; i < k; ++i)
      sum += probs_[i] = std::exp((logits[ids_[i]] - max_logit) * inv_t);
    for (double& p : probs_) p /= sum;
  } else {
    // exps_ in id order; the largest is exactly 1.
    const double max_logit = logits[Argmax(logits)];
    exps_.resize(n);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) sum += exps_[i] = std::exp((logits[i] - max_logit) * inv_t);
    // A threshold `cut` on exps_ that keeps a superset of the final support,
    // so only that superset is sorted.
    double cut = 0.0;
    if (params.min_p > 0.0) cut = params.min_p * (1.0 - 1e-6);  // exact test below
    if (params.top_p < 1.0) {
      cut = std::max(cut, NucleusCut(exps_, sum, params.top_p));
    }
    ids_.clear();
    for (int32_t i = 0; i < n; ++i) {
      if (exps_[i] > 0.0 && exps_[i] >= cut) ids_.push_back(i);
    }
    if (sorted || params.min_p > 0.0 || params.top_p < 1.0)
      std::sort(ids_.begin(), ids_.end(), by_logit);
    probs_.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) probs_[i] = exps_[ids_[i]] / sum;
    if (params.min_p == 0.0 && params.top_p == 1.0) return;  // already normalized
  }
  TruncateSorted(params);
}

void Sampler::Candidates(absl::Span<const float> logits, const SamplingParams& params,
                         std::vector<int32_t>* ids, std::vector<double>* probs) {
  BuildCandidates(logits, params, /*sorted=*/true);
  *ids = ids_;
  *probs = probs_;
}

void Sampler::FillLogprobs(absl::Span<const float> logits, int num_top, SampleResult* result) {
  const double max_logit = logits[Argmax(logits)];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(l - max_logit);
  const double log_z = max_logit + std::log(sum);
  result->logprob = static_cast<float>(logits[result->token_id] - log_z);
  const int32_t m = std::min<int32_t>(num_top, static_cast<int32_t>(logits.size()));
  result->top_logprobs.clear();
  if (m == 0) return;
  ids_.resize(logits.size());
  std::iota(ids_.begin(), ids_.end(), 0);
  std::partial_sort(ids_.begin(), ids_.begin() + m, ids_.end(), ByLogit{logits});
  for (int32_t i = 0; i < m; ++i) {
    result->top_logprobs.push_back({ids_[i], static_cast<float>(logits[ids_[i]] - log_z)});
  }
}

SampleResult Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params,
                             int64_t position, const SamplingContext& context) {
  absl::Span<const float> x = logits;
  if (NeedsProcessing(params, context)) {
    ProcessLogits(logits, params, context, &processed_);
    x = processed_;
  }
  SampleResult result;
  if (params.temperature == 0.0) {
    result.token_id = Argmax(x);
  } else {
    BuildCandidates(x, params, /*sorted=*/false);
    const double u = CounterUniform(params.seed, static_cast<uint64_t>(position));
    double cum = 0.0;
    result.token_id = ids_.back();  // u within rounding of 1.0
    for (size_t i = 0; i < ids_.size(); ++i) {
      cum += probs_[i];
      if (u < cum) {
        result.token_id = ids_[i];
        break;
      }
    }
  }
  if (params.num_logprobs.has_value()) FillLogprobs(x, *params.num_logprobs, &result);
  return result;
}

int32_t Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params,
                        int64_t position) {
  return Sample(logits, params, position, SamplingContext{}).token_id;
}

}  // namespace tandem::engine
