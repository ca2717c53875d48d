#include "services/cli/perplexity_stats.h"

#include <algorithm>
#include <cmath>

namespace tandem::cli {
namespace {

// {mean, standard error of the mean} from a sum and a sum of squares.
MeanWithError MeanAndError(double sum, double sum2, int64_t n) {
  MeanWithError out;
  if (n <= 0) return out;
  out.mean = sum / n;
  if (n > 1) {
    const double var = sum2 / n - out.mean * out.mean;
    out.error = var > 0 ? std::sqrt(var / (n - 1)) : 0;
  }
  return out;
}

}  // namespace

void LogSoftmax(absl::Span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  if (logits.empty()) return;
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double log_z = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - log_z;
}

TokenScore ScoreToken(absl::Span<const float> logits, int32_t target) {
  TokenScore s;
  if (logits.empty()) return s;
  float max = logits[0];
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > max) {
      max = logits[i];
      s.argmax = static_cast<int32_t>(i);
    }
  }
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  s.nll = static_cast<double>(max) + std::log(sum) - logits[target];
  s.p = std::exp(-s.nll);
  return s;
}

std::vector<TopEntry> TopK(absl::Span<const double> logprobs, int64_t k) {
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(logprobs.size()));
  std::vector<int32_t> ids(logprobs.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  auto before = [&](int32_t a, int32_t b) {
    return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  std::vector<TopEntry> out(k);
  for (int64_t i = 0; i < k; ++i) {
    out[i] = {ids[i], static_cast<float>(logprobs[ids[i]])};
  }
  return out;
}

double TopKKld(absl::Span<const TopEntry> base, absl::Span<const double> logprobs) {
  double kld = 0, p_mass = 0, q_mass = 0;
  for (const TopEntry& e : base) {
    const double p = std::exp(static_cast<double>(e.logprob));
    const double log_q = logprobs[e.id];
    kld += p * (e.logprob - log_q);
    p_mass += p;
    q_mass += std::exp(log_q);
  }
  const double p_tail = 1.0 - p_mass, q_tail = 1.0 - q_mass;
  // Rounding can leave a tiny or negative tail; below 1e-12 it carries no
  // measurable KL (and log of a non-positive q_tail would be undefined).
  if (p_tail > 1e-12) kld += p_tail * (std::log(p_tail) - std::log(std::max(q_tail, 1e-12)));
  return std::max(kld, 0.0);
}

double PplAccumulator::Ppl() const { return std::exp(MeanNll()); }

double PplAccumulator::PplError() const { return Ppl() * MeanAndError(sum_, sum2_, count_).error; }

double Percentile(absl::Span<const double> sorted, double fraction) {
  if (sorted.empty()) return 0;
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t ip = static_cast<size_t>(p);
  p -= static_cast<double>(ip);
  return (1 - p) * sorted[ip] + p * sorted[std::min(ip + 1, sorted.size() - 1)];
}

void KldAccumulator::Add(const TokenScore& current, double base_nll, int32_t base_top1,
                         double kld) {
  cur_.Add(current.nll);
  base_.Add(base_nll);
  sum_nll_nll_base_ += current.nll * base_nll;
  if (current.argmax == base_top1) ++same_top_;
  kld_.push_back(kld);
  delta_p_.push_back(current.p - std::exp(-base_nll));
}

double KldAccumulator::MeanKld() const {
  if (kld_.empty()) return 0;
  double sum = 0;
  for (double v : kld_) sum += v;
  return sum / static_cast<double>(kld_.size());
}

double KldAccumulator::SameTopFraction() const {
  return kld_.empty() ? 0 : static_cast<double>(same_top_) / static_cast<double>(kld_.size());
}

MeanWithError KldAccumulator::LnPplRatio(double* correlation) const {
  // ln PPL is the mean NLL: its standard error, the covariance of the two
  // means, their correlation and the error of their difference.
  const int64_t n = count();
  const double mean_c = cur_.MeanNll(), mean_b = base_.MeanNll();
  const double se_c = cur_.Ppl() > 0 ? cur_.PplError() / cur_.Ppl() : 0;
  const double se_b = base_.Ppl() > 0 ? base_.PplError() / base_.Ppl() : 0;
  const double cov = n > 1 ? (sum_nll_nll_base_ / n - mean_c * mean_b) / (n - 1) : 0;
  if (correlation != nullptr) *correlation = (se_c > 0 && se_b > 0) ? cov / (se_c * se_b) : 0;
  MeanWithError out;
  out.mean = mean_c - mean_b;
  const double var = se_c * se_c + se_b * se_b - 2 * cov;
  out.error = var > 0 ? std::sqrt(var) : 0;
  return out;
}

KldSummary KldAccumulator::Summarize() const {
  KldSummary s;
  const int64_t n = count();
  s.count = n;
  if (n == 0) return s;
  s.ppl = cur_.Ppl();
  s.ppl_error = cur_.PplError();
  s.ppl_base = base_.Ppl();
  s.ppl_base_error = base_.PplError();

  double cor = 0;
  s.ln_ppl_ratio = LnPplRatio(&cor);
  s.cor_ln_ppl = cor;

  double sum = 0, sum2 = 0;
  for (double v : kld_) {
    sum += v;
    sum2 += v * v;
  }
  s.kld = MeanAndError(sum, sum2, n);
  std::vector<double> sorted = kld_;
  std::sort(sorted.begin(), sorted.end());
  s.kld_max = sorted.back();
  s.kld_p999 = Percentile(sorted, 0.999);
  s.kld_p99 = Percentile(sorted, 0.99);
  s.kld_p90 = Percentile(sorted, 0.90);
  s.kld_median = Percentile(sorted, 0.5);
  s.kld_p10 = Percentile(sorted, 0.10);
  s.kld_p5 = Percentile(sorted, 0.05);
  s.kld_p1 = Percentile(sorted, 0.01);
  s.kld_min = sorted.front();

  sum = sum2 = 0;
  double sum4 = 0;
  for (double v : delta_p_) {
    sum += v;
    sum2 += v * v;
    sum4 += v * v * v * v;
  }
  s.delta_p = MeanAndError(sum, sum2, n);
  const MeanWithError mse = MeanAndError(sum2, sum4, n);
  s.rms_delta_p.mean = std::sqrt(mse.mean);
  s.rms_delta_p.error = s.rms_delta_p.mean > 0 ? 0.5 / s.rms_delta_p.mean * mse.error : 0;
  sorted = delta_p_;
  std::sort(sorted.begin(), sorted.end());
  s.delta_p_max = sorted.back();
  s.delta_p_p999 = Percentile(sorted, 0.999);
  s.delta_p_p99 = Percentile(sorted, 0.99);
  s.delta_p_p95 = Percentile(sorted, 0.95);
  s.delta_p_p90 = Percentile(sorted, 0.90);
  s.delta_p_median = Percentile(sorted, 0.5);
  s.delta_p_p10 = Percentile(sorted, 0.10);
  s.delta_p_p5 = Percentile(sorted, 0.05);
  s.delta_p_p1 = Percentile(sorted, 0.01);
  s.delta_p_p001 = Percentile(sorted, 0.001);
  s.delta_p_min = sorted.front();

  const double same = SameTopFraction();
  s.same_top.mean = same;
  s.same_top.error = n > 1 ? std::sqrt(same * (1 - same) / (n - 1)) : 0;
  return s;
}

}  // namespace tandem::cli
