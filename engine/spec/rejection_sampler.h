// Verification of draft tokens against the target model (speculative
// decoding), following Leviathan et al. 2023 / Chen et al. 2023: the general
// rejection sampler for drafts with a distribution q (a draft model). The
// engine's n-gram path does not need it: for one-hot drafts ModelRunner
// verifies by sample-and-compare, which is this rule exactly and keeps the
// output token-for-token identical to plain decoding (docs/speculative.md).
// ModelRunner uses it for drafts sampled from a draft model
// (engine/spec/draft_proposer.h, sampled requests).
//
// Inputs for one sequence with k draft tokens d[0, k):
//   * The target model's logits at k + 1 positions: row i scores the token
//     after (context, d[0, i)); row k is the "bonus" position after all
//     drafts.
//   * Draft token i occupies sequence position first_position + i
//     (first_position = context.token_ids.size()); the bonus token occupies
//     first_position + k.
//
// Random mode (temperature > 0), RejectionSample():
//   for i in 0..k-1: accept d[i] with probability min(1, p_i(d_i) / q_i(d_i));
//     on rejection emit a token drawn from norm(max(0, p_i - q_i)) and stop.
//   if all k were accepted, emit a bonus token drawn from p_k.
// Every emitted token is then distributed exactly as the plain sampler's
// draw from p at that position, whatever q is. p must be the *processed*
// distribution the plain sampler draws from (penalties, logit_bias,
// min_tokens, temperature, top-k, min-p, top-p): ProcessDraftLogits() then
// TargetProbs() produce it. q_i is the draft model's distribution, or for a
// deterministic drafter (n-gram) one-hot at d_i (pass no draft_probs).
// Random numbers: at position t the accept test uses
// CounterUniform(seed ^ kAcceptSalt, t) and the sampled (correction or
// bonus) token uses CounterUniform(seed, t) by inverse CDF in id order. Each
// position's numbers are consumed at most once over a sequence's life (a
// step stops at the first rejection and the next step starts after it), and
// they depend only on (seed, position): never on batch composition, and a
// replay from the same prefix draws the same. Token-for-token the output is
// *not* the same as the non-speculative sampler's (that one orders its
// inverse CDF differently and draws no accept numbers); it has the same
// distribution.
//
// Greedy mode (temperature == 0), GreedyVerify(): accept d[i] while it
// equals Argmax(processed logits row i) (engine::Argmax: lowest id wins
// ties, exactly as the plain greedy sampler), emit the argmax at the first
// mismatch, or the argmax of row k if all matched. Token-identical to
// non-speculative greedy decoding.
//
// Draft ids outside [0, V) are never accepted (treated as p = 0).
//
// Thread safety: free functions, no shared state. Cost: O((k + 1) * V) per
// call, plus the Sampler's candidate sort in TargetProbs().
#ifndef TANDEM_ENGINE_SPEC_REJECTION_SAMPLER_H_
#define TANDEM_ENGINE_SPEC_REJECTION_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace tandem::engine::spec {

// XORed into the request seed for the accept tests' random numbers.
inline constexpr uint64_t kAcceptSalt = 0x6a09e667f3bcc909ULL;

struct VerifyResult {
  // The accepted draft tokens followed by exactly one more: the correction
  // token (first rejection) or the bonus token (all accepted).
  // size() == num_accepted + 1.
  std::vector<int32_t> token_ids;
  int num_accepted = 0;
};

// Stage 1 of the sampler (ProcessLogits) for each of the k + 1 rows: row i
// is processed with history context.token_ids + draft_tokens[0, i), i.e. as
// if the earlier drafts had been accepted, which is what the plain sampler
// would see at that position. logits, *out: [(k + 1) * vocab_size], row
// major. REQUIRES: logits.size() == (draft_tokens.size() + 1) * vocab_size.
void ProcessDraftLogits(absl::Span<const float> logits, int64_t vocab_size,
                        const SamplingParams& params, const SamplingContext& context,
                        absl::Span<const int32_t> draft_tokens, std::vector<float>* out);

// The dense distribution [num_rows * vocab_size] the non-greedy sampler draws
// from for each row of already-processed logits (temperature, top-k, min-p,
// top-p applied; zero outside the kept candidates). REQUIRES:
// params.temperature > 0, processed.size() a multiple of vocab_size.
void TargetProbs(absl::Span<const float> processed, int64_t vocab_size,
                 const SamplingParams& params, Sampler* sampler, std::vector<double>* probs);

// Random mode. target_probs: [(k + 1) * vocab_size], each row a distribution.
// draft_probs: empty for one-hot drafts, else [k * vocab_size].
VerifyResult RejectionSample(absl::Span<const double> target_probs, int64_t vocab_size,
                             absl::Span<const int32_t> draft_tokens,
                             absl::Span<const double> draft_probs, uint64_t seed,
                             int64_t first_position);

// Greedy mode. processed_logits: [(k + 1) * vocab_size] from
// ProcessDraftLogits.
VerifyResult GreedyVerify(absl::Span<const float> processed_logits, int64_t vocab_size,
                          absl::Span<const int32_t> draft_tokens);

}  // namespace tandem::engine::spec

#endif  // TANDEM_ENGINE_SPEC_REJECTION_SAMPLER_H_
