// Token sampling from logits.
//
// One step, in this fixed order (each stage is skipped when off):
//   1. Logit processing (ProcessLogits): repetition penalty over prompt +
//      output tokens, then presence / frequency penalties over output tokens,
//      then logit_bias, then min_tokens masking (EOS and stop_token_ids set
//      to -inf while fewer than min_tokens output tokens exist).
//   2. Greedy (temperature == 0): argmax of the processed logits, lowest id
//      on ties.
//   3. Otherwise softmax(processed / temperature) restricted by top-k, then
//      min-p, then top-p (nucleus), renormalized, and sampled by inverse CDF
//      with a uniform number from a counter-based generator keyed by
//      (seed, position): the draw for a position never depends on what was
//      drawn before, so a request replayed from the same prefix (after
//      preemption or migration) draws the same numbers.
// Every reduction runs in a fixed order (id order, or the total order
// "descending logit, ascending id"), so the result depends only on (logits,
// params, token history, position), never on batch composition.
//
// Cost: O(V) for the common cases. top-k uses partial selection (nth_element)
// and sorts only the k survivors; min-p / top-p alone first select a superset
// of the survivors by a probability threshold and sort only that.
//
// Thread safety: Sampler is stateless apart from scratch buffers; use one per
// thread.
#ifndef TANDEM_ENGINE_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/sampling_params.h"

namespace tandem::engine {

// Uniform double in [0, 1) determined by (seed, counter) alone.
double CounterUniform(uint64_t seed, uint64_t counter);

// What the sampler needs to know about the sequence. Spans are borrowed for
// the duration of the call.
struct SamplingContext {
  // Prompt followed by the output tokens generated so far.
  absl::Span<const int32_t> token_ids = {};
  // token_ids[0, num_prompt_tokens) is the prompt. REQUIRES: <= size.
  int64_t num_prompt_tokens = 0;
  // The model's end-of-generation ids (masked by min_tokens unless
  // ignore_eos).
  absl::Span<const int32_t> eos_token_ids = {};

  int64_t num_output_tokens() const {
    return static_cast<int64_t>(token_ids.size()) - num_prompt_tokens;
  }
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token_id = 0;
  // Logprobs refer to log_softmax of the *processed* logits (after
  // penalties, logit_bias and min_tokens masking) at temperature 1, before
  // top-k / top-p / min-p truncation: the model's distribution as the
  // request's penalties and bias reshaped it, independent of temperature and
  // truncation (so a greedy and a sampled request report the same numbers).
  // vLLM reports the raw model logprobs by default; we do not. Masked tokens
  // have -inf. Filled only when params.num_logprobs is set.
  float logprob = 0.0f;
  // The num_logprobs most likely tokens under that distribution, descending,
  // lowest id first on ties. May include token_id.
  std::vector<TokenLogprob> top_logprobs;
};

// Stage 1 above: writes the processed logits to *out (resized to
// logits.size()). Token ids in the history outside [0, V) are ignored.
void ProcessLogits(absl::Span<const float> logits, const SamplingParams& params,
                   const SamplingContext& context, std::vector<float>* out);

// True when ProcessLogits would change something for this (params, context).
bool NeedsProcessing(const SamplingParams& params, const SamplingContext& context);

class Sampler {
 public:
  // The full sampler. `position` is the position the token will occupy in
  // the sequence (the RNG counter), normally context.token_ids.size().
  // logits: [vocab_size]. REQUIRES: params.Validate(vocab_size).ok(), and at
  // least one finite logit after processing.
  SampleResult Sample(absl::Span<const float> logits, const SamplingParams& params,
                      int64_t position, const SamplingContext& context);

  // Without history: no penalties or min_tokens masking (logit_bias still
  // applies). Kept for callers that need only the token id.
  int32_t Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t position);

  // The candidates (ids, probabilities summing to 1) that Sample() draws from
  // for non-greedy params, given already-processed logits, sorted by
  // descending probability (lowest id first on ties). Exposed for tests.
  void Candidates(absl::Span<const float> logits, const SamplingParams& params,
                  std::vector<int32_t>* ids, std::vector<double>* probs);

  // Fills result->logprob (of result->token_id) and top_logprobs from
  // already-processed logits, as Sample() does (speculative verification).
  void Logprobs(absl::Span<const float> processed, int num_top, SampleResult* result) {
    FillLogprobs(processed, num_top, result);
  }

 private:
  // Fills ids_ / probs_; when `sorted` is false the order may be id order
  // (pure temperature sampling, which needs no sort).
  void BuildCandidates(absl::Span<const float> logits, const SamplingParams& params, bool sorted);
  // ids_ / probs_ sorted by probability: min-p, then top-p, renormalized.
  void TruncateSorted(const SamplingParams& params);
  void FillLogprobs(absl::Span<const float> logits, int num_top, SampleResult* result);

  std::vector<float> processed_;
  std::vector<int32_t> ids_;
  std::vector<double> probs_;
  std::vector<double> exps_;
};

// Index of the largest value; the lowest index wins ties.
int32_t Argmax(absl::Span<const float> logits);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SAMPLER_H_
