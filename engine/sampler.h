// Token sampling from logits.
//
// Greedy when temperature == 0; otherwise softmax(logits / temperature)
// restricted by top-k, top-p (nucleus) and min-p, sampled by inverse CDF with
// a uniform number from a counter-based generator keyed by (seed, position):
// the draw for a given position never depends on what was drawn before, so a
// request replayed from the same prefix (after preemption or migration) draws
// the same numbers. Reductions run in a fixed order, so the result depends
// only on the logits and the parameters.
//
// Thread safety: Sampler is stateless apart from scratch buffers; use one per
// thread.
#ifndef TANDEM_ENGINE_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tandem::engine {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  double min_p = 0.0;        // 0 = off
  uint64_t seed = 0;

  // InvalidArgument naming the field when out of range.
  absl::Status Validate() const;
};

// Uniform double in [0, 1) determined by (seed, counter) alone.
double CounterUniform(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  // Returns the sampled token id. `position` is the position the token will
  // occupy in the sequence (the RNG counter). logits: [vocab_size].
  int32_t Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t position);

  // The candidates (ids, probabilities summing to 1) that Sample() draws from
  // for non-greedy params, sorted by descending probability. Exposed for tests.
  void Candidates(absl::Span<const float> logits, const SamplingParams& params,
                  std::vector<int32_t>* ids, std::vector<double>* probs);

 private:
  std::vector<int32_t> ids_;
  std::vector<double> probs_;
};

// Index of the largest value; the lowest index wins ties.
int32_t Argmax(absl::Span<const float> logits);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SAMPLER_H_
