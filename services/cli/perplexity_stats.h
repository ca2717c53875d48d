// The arithmetic of `tandem perplexity` (docs/perplexity.md), in
// llama.cpp's llama-perplexity convention: per-token negative log-likelihood
// from one logits row, PPL = exp(mean NLL) with its error from the variance
// of the per-token NLL, and the --kl-divergence statistics (KLD of the base
// distribution to the current one, same top-1, delta p) with percentiles
// interpolated as llama.cpp does. Pure functions and accumulators, no I/O.
#ifndef TANDEM_SERVICES_CLI_PERPLEXITY_STATS_H_
#define TANDEM_SERVICES_CLI_PERPLEXITY_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tandem::cli {

// One logits row scored against the token that follows.
struct TokenScore {
  double nll = 0;      // -log softmax(logits)[target]
  double p = 0;        // softmax(logits)[target]
  int32_t argmax = 0;  // first index of the largest logit
};
TokenScore ScoreToken(absl::Span<const float> logits, int32_t target);

// log softmax(logits) into out (same size), computed in double.
void LogSoftmax(absl::Span<const float> logits, std::vector<double>* out);

// One entry of a stored top-K distribution.
struct TopEntry {
  int32_t id = 0;
  float logprob = 0;  // log p, <= 0
};
// The k most likely tokens of `logprobs`, by log-prob descending then id
// ascending (k is clamped to the vocab size).
std::vector<TopEntry> TopK(absl::Span<const double> logprobs, int64_t k);

// KL(P || Q) of P known on its top-K tokens and Q given in full (log-probs):
// sum over the K tokens of p (log p - log q), plus the tail bucket
// p_tail (log p_tail - log q_tail), where the tails are 1 - the mass of the
// K tokens under each distribution. This is the KL of both distributions
// coarsened to K + 1 outcomes: exact when K covers the vocab, otherwise a
// lower bound of the full KL (data-processing inequality); 0 when P == Q.
double TopKKld(absl::Span<const TopEntry> base, absl::Span<const double> logprobs);

// Sum / sum of squares of per-token NLL: PPL and its error as llama.cpp
// prints them ("Final estimate: PPL = X +/- err").
class PplAccumulator {
 public:
  void Add(double nll) {
    sum_ += nll;
    sum2_ += nll * nll;
    ++count_;
  }
  int64_t count() const { return count_; }
  double MeanNll() const { return count_ > 0 ? sum_ / count_ : 0; }
  double Ppl() const;  // exp(mean NLL)
  // ppl * sqrt((E[nll^2] - E[nll]^2) / (count - 1)); 0 with fewer than 2
  // tokens or a non-positive variance.
  double PplError() const;

 private:
  double sum_ = 0, sum2_ = 0;
  int64_t count_ = 0;
};

// llama.cpp's percentile of sorted values: linear interpolation between
// values[floor(f (n - 1))] and the next; front / back at f <= 0 / f >= 1.
double Percentile(absl::Span<const double> sorted, double fraction);

struct MeanWithError {
  double mean = 0;
  double error = 0;  // standard error of the mean
};

// What `--kl-divergence` reports (as llama-perplexity --kl-divergence does).
struct KldSummary {
  int64_t count = 0;
  double ppl = 0, ppl_error = 0;            // current run
  double ppl_base = 0, ppl_base_error = 0;  // the base run (from its stored NLL)
  double cor_ln_ppl = 0;                    // correlation of per-token NLL, current vs base
  MeanWithError ln_ppl_ratio;               // mean of nll - nll_base
  MeanWithError kld;                        // mean KLD
  double kld_max = 0, kld_p999 = 0, kld_p99 = 0, kld_p90 = 0, kld_median = 0, kld_p10 = 0,
         kld_p5 = 0, kld_p1 = 0, kld_min = 0;
  MeanWithError delta_p;  // mean p(target) - p_base(target), as a fraction (x100 for %)
  double delta_p_max = 0, delta_p_p999 = 0, delta_p_p99 = 0, delta_p_p95 = 0, delta_p_p90 = 0,
         delta_p_median = 0, delta_p_p10 = 0, delta_p_p5 = 0, delta_p_p1 = 0, delta_p_p001 = 0,
         delta_p_min = 0;
  MeanWithError rms_delta_p;  // sqrt(mean dp^2), error by the delta method
  MeanWithError same_top;     // fraction of tokens whose top-1 matches the base's
};

class KldAccumulator {
 public:
  // One scored token: current NLL / p / argmax, base NLL / top-1, KLD.
  void Add(const TokenScore& current, double base_nll, int32_t base_top1, double kld);
  int64_t count() const { return static_cast<int64_t>(kld_.size()); }
  // Running means (per-chunk progress lines).
  double MeanKld() const;
  double MeanNll() const { return cur_.MeanNll(); }
  double MeanNllBase() const { return base_.MeanNll(); }
  double SameTopFraction() const;
  // Mean ln(PPL / PPL_base) with its error (cheap; per-chunk lines);
  // correlation: optional, the per-token NLL correlation.
  MeanWithError LnPplRatio(double* correlation = nullptr) const;
  KldSummary Summarize() const;  // sorts every value: once, at the end

 private:
  PplAccumulator cur_, base_;
  double sum_nll_nll_base_ = 0;
  int64_t same_top_ = 0;
  std::vector<double> kld_, delta_p_;
};

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_PERPLEXITY_STATS_H_
