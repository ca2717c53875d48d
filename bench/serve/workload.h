// `tandem bench` workloads: synthetic prompts of a given length distribution
// (token ids from the model's vocabulary, or words for a text-only backend),
// a JSONL / text file of prompts, and a shared-prefix workload (K system
// prompts of L tokens, each followed by a distinct question) that exercises
// the prefix cache.
#ifndef TANDEM_BENCH_SERVE_WORKLOAD_H_
#define TANDEM_BENCH_SERVE_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

struct BenchRequest {
  // Exactly one of the two is used: token ids when the backend takes them.
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  int64_t max_tokens = 0;
  int64_t expected_prompt_tokens = 0;  // 0 = unknown (text from a file)
  bool ignore_eos = true;
  uint64_t seed = 0;
};

struct WorkloadOptions {
  int64_t num_requests = 0;
  int64_t input_len = 64;
  int64_t output_len = 32;
  double range_ratio = 0;  // lengths uniform in [len (1 - r), len (1 + r)]
  int64_t shared_prefix_len = 0;
  int64_t num_prefixes = 1;
  std::string dataset;  // JSONL / text file; empty = synthetic
  bool ignore_eos = true;
  uint64_t seed = 0;
  // Token ids prompts when vocab_size > 0, else words.
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // 0 = unchecked
};

// `num_requests` requests (a dataset is cycled when shorter). Errors name the
// flag or the file and line.
absl::StatusOr<std::vector<BenchRequest>> BuildWorkload(const WorkloadOptions& options);

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_SERVE_WORKLOAD_H_
