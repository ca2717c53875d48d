// Proto <-> engine conversions at the services edge.
//
// Nothing here trusts the proto: FromProto validates (SamplingParams::Validate
// against the vocabulary) and returns InvalidArgument naming the field.
//
// Thread safety: free functions, no state.
#ifndef TANDEM_SERVICES_COMMON_CONVERT_H_
#define TANDEM_SERVICES_COMMON_CONVERT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/request_stream.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::services {

// WorkerSamplingParams -> engine params. Mapping: top_logprobs < 0 -> no
// logprobs; max_tokens <= 0 -> no request limit (the router always sets one);
// temperature 0 = greedy; top_p 0 is read as 1 (off) and repetition_penalty
// 0 as 1 (off), since proto3 cannot tell unset from 0 there and both values
// are otherwise invalid. cache_key is not a sampling param (EngineRequest::
// extra_key). vocab_size < 0 skips the id upper bound.
absl::StatusOr<engine::SamplingParams> FromProto(const tandem::v1::WorkerSamplingParams& proto,
                                                 int64_t vocab_size);
// The inverse (FromProto(ToProto(p)) == p for valid p). Does not touch cache_key.
void ToProto(const engine::SamplingParams& params, tandem::v1::WorkerSamplingParams* proto);

// kEos -> EOS, kStop -> STOP, kLength -> LENGTH, kCancelled -> CANCELLED,
// kError -> UNSPECIFIED (errors travel as a grpc::Status, not a reason).
tandem::v1::FinishReason ToProto(engine::FinishReason reason);
// DEADLINE -> kCancelled (the engine does not know deadlines);
// UNSPECIFIED / unknown -> kError.
engine::FinishReason FromProto(tandem::v1::FinishReason reason);

// "eos", "stop", "length", "cancelled", "deadline" ("unspecified" otherwise):
// the finish_reason label of tandem_request_success_total and the CLI's JSON.
std::string FinishReasonName(tandem::v1::FinishReason reason);

// SampleResult (the sampled token's logprob and the top alternatives).
void ToProto(const engine::SampleResult& result, tandem::v1::PositionLogprobs* proto);
engine::SampleResult FromProto(const tandem::v1::PositionLogprobs& proto);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_CONVERT_H_
