#include "engine/spec/rejection_sampler.h"

#include <algorithm>

#include "common/status.h"

namespace tandem::engine::spec {
namespace {

// Inverse CDF in id order over the unnormalized weights w(i), i in [0, n),
// whose sum is `total` > 0. Rounding can leave u * total beyond the summed
// weights; then the last id with positive weight is chosen, never an id of
// weight 0.
template <typename Weight>
int32_t DrawByWeight(int64_t n, double total, double u, Weight w) {
  const double target = u * total;
  double cum = 0.0;
  int32_t last_positive = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double wi = w(i);
    if (wi <= 0.0) continue;
    last_positive = static_cast<int32_t>(i);
    cum += wi;
    if (target < cum) return last_positive;
  }
  TANDEM_CHECK(last_positive >= 0);
  return last_positive;
}

bool InVocab(int32_t id, int64_t vocab_size) { return id >= 0 && id < vocab_size; }

}  // namespace

void ProcessDraftLogits(absl::Span<const float> logits, int64_t vocab_size,
                        const SamplingParams& params, const SamplingContext& context,
                        absl::Span<const int32_t> draft_tokens, std::vector<float>* out) {
  const size_t num_rows = draft_tokens.size() + 1;
  TANDEM_CHECK(vocab_size > 0 && logits.size() == num_rows * static_cast<size_t>(vocab_size));
  out->resize(logits.size());
  std::vector<int32_t> history(context.token_ids.begin(), context.token_ids.end());
  std::vector<float> row_out;
  for (size_t i = 0; i < num_rows; ++i) {
    if (i > 0) history.push_back(draft_tokens[i - 1]);
    const SamplingContext row_context{.token_ids = history,
                                      .num_prompt_tokens = context.num_prompt_tokens,
                                      .eos_token_ids = context.eos_token_ids};
    const absl::Span<const float> row = logits.subspan(i * vocab_size, vocab_size);
    float* dst = out->data() + i * vocab_size;
    if (NeedsProcessing(params, row_context)) {
      ProcessLogits(row, params, row_context, &row_out);
      std::copy(row_out.begin(), row_out.end(), dst);
    } else {
      std::copy(row.begin(), row.end(), dst);
    }
  }
}

void TargetProbs(absl::Span<const float> processed, int64_t vocab_size,
                 const SamplingParams& params, Sampler* sampler, std::vector<double>* probs) {
  TANDEM_CHECK(params.temperature > 0.0 && vocab_size > 0 &&
               processed.size() % static_cast<size_t>(vocab_size) == 0);
  probs->assign(processed.size(), 0.0);
  std::vector<int32_t> ids;
  std::vector<double> p;
  for (size_t row = 0; row * vocab_size < processed.size(); ++row) {
    sampler->Candidates(processed.subspan(row * vocab_size, vocab_size), params, &ids, &p);
    double* dst = probs->data() + row * vocab_size;
    for (size_t j = 0; j < ids.size(); ++j) dst[ids[j]] = p[j];
  }
}

VerifyResult RejectionSample(absl::Span<const double> target_probs, int64_t vocab_size,
                             absl::Span<const int32_t> draft_tokens,
                             absl::Span<const double> draft_probs, uint64_t seed,
                             int64_t first_position) {
  const size_t k = draft_tokens.size();
  TANDEM_CHECK(vocab_size > 0 && target_probs.size() == (k + 1) * vocab_size);
  TANDEM_CHECK(draft_probs.empty() || draft_probs.size() == k * vocab_size);
  const bool one_hot = draft_probs.empty();
  VerifyResult result;
  for (size_t i = 0; i <= k; ++i) {
    const absl::Span<const double> p = target_probs.subspan(i * vocab_size, vocab_size);
    const uint64_t position = static_cast<uint64_t>(first_position) + i;
    const double u_sample = CounterUniform(seed, position);
    if (i == k) {  // bonus: every draft accepted
      double total = 0.0;
      for (double x : p) total += x;
      result.token_ids.push_back(
          DrawByWeight(vocab_size, total, u_sample, [&](int64_t j) { return p[j]; }));
      break;
    }
    const int32_t d = draft_tokens[i];
    const absl::Span<const double> q =
        one_hot ? absl::Span<const double>() : draft_probs.subspan(i * vocab_size, vocab_size);
    auto q_at = [&](int64_t j) { return one_hot ? (j == d ? 1.0 : 0.0) : q[j]; };
    if (InVocab(d, vocab_size)) {
      // Accept iff u < p(d) / q(d), written without the division so that
      // p(d) == 0 never accepts and q(d) == 0 < p(d) always does.
      const double u_accept = CounterUniform(seed ^ kAcceptSalt, position);
      if (u_accept * q_at(d) < p[d]) {
        result.token_ids.push_back(d);
        ++result.num_accepted;
        continue;
      }
    }
    auto residual = [&](int64_t j) {
      const double r = p[j] - q_at(j);
      return r > 0.0 ? r : 0.0;
    };
    double total = 0.0;
    for (int64_t j = 0; j < vocab_size; ++j) total += residual(j);
    if (total > 0.0) {
      result.token_ids.push_back(DrawByWeight(vocab_size, total, u_sample, residual));
    } else {
      // p <= q everywhere, so p == q up to rounding and a rejection was a
      // rounding artifact: sample from p itself.
      double p_total = 0.0;
      for (double x : p) p_total += x;
      result.token_ids.push_back(
          DrawByWeight(vocab_size, p_total, u_sample, [&](int64_t j) { return p[j]; }));
    }
    break;
  }
  return result;
}

VerifyResult GreedyVerify(absl::Span<const float> processed_logits, int64_t vocab_size,
                          absl::Span<const int32_t> draft_tokens) {
  const size_t k = draft_tokens.size();
  TANDEM_CHECK(vocab_size > 0 && processed_logits.size() == (k + 1) * vocab_size);
  VerifyResult result;
  for (size_t i = 0; i <= k; ++i) {
    const int32_t best = Argmax(processed_logits.subspan(i * vocab_size, vocab_size));
    result.token_ids.push_back(best);
    if (i == k || draft_tokens[i] != best) break;
    ++result.num_accepted;
  }
  return result;
}

}  // namespace tandem::engine::spec
