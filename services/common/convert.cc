#include "services/common/convert.h"

#include <string>
#include <utility>

#include "common/status.h"

namespace tandem::services {

absl::StatusOr<engine::SamplingParams> FromProto(const tandem::v1::WorkerSamplingParams& proto,
                                                 int64_t vocab_size) {
  engine::SamplingParams p;
  p.temperature = proto.temperature();
  p.top_k = proto.top_k();
  p.top_p = proto.top_p() == 0.0 ? 1.0 : proto.top_p();
  p.min_p = proto.min_p();
  p.repetition_penalty = proto.repetition_penalty() == 0.0 ? 1.0 : proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  p.seed = proto.seed();
  for (const auto& [id, bias] : proto.logit_bias()) p.logit_bias[id] = bias;
  if (proto.top_logprobs() >= 0) p.num_logprobs = proto.top_logprobs();
  if (proto.max_tokens() > 0) p.stop.max_tokens = proto.max_tokens();
  p.stop.min_tokens = proto.min_tokens();
  p.stop.ignore_eos = proto.ignore_eos();
  p.stop.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.stop.stop_strings.assign(proto.stop().begin(), proto.stop().end());
  if (proto.has_num_speculative_tokens()) {
    p.num_speculative_tokens = proto.num_speculative_tokens();
  }
  TANDEM_RETURN_IF_ERROR(p.Validate(vocab_size));
  return p;
}

void ToProto(const engine::SamplingParams& p, tandem::v1::WorkerSamplingParams* proto) {
  proto->set_temperature(p.temperature);
  proto->set_top_k(static_cast<int32_t>(p.top_k));
  proto->set_top_p(p.top_p);
  proto->set_min_p(p.min_p);
  proto->set_repetition_penalty(p.repetition_penalty);
  proto->set_presence_penalty(p.presence_penalty);
  proto->set_frequency_penalty(p.frequency_penalty);
  proto->set_seed(p.seed);
  proto->mutable_logit_bias()->clear();
  for (const auto& [id, bias] : p.logit_bias) (*proto->mutable_logit_bias())[id] = bias;
  proto->set_top_logprobs(p.num_logprobs.has_value() ? *p.num_logprobs : -1);
  proto->set_max_tokens(p.stop.max_tokens.has_value() ? static_cast<int32_t>(*p.stop.max_tokens)
                                                      : 0);
  proto->set_min_tokens(static_cast<int32_t>(p.stop.min_tokens));
  proto->set_ignore_eos(p.stop.ignore_eos);
  proto->clear_stop_token_ids();
  for (int32_t id : p.stop.stop_token_ids) proto->add_stop_token_ids(id);
  proto->clear_stop();
  for (const std::string& s : p.stop.stop_strings) proto->add_stop(s);
  if (p.num_speculative_tokens.has_value()) {
    proto->set_num_speculative_tokens(static_cast<int32_t>(*p.num_speculative_tokens));
  } else {
    proto->clear_num_speculative_tokens();
  }
}

tandem::v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kEos:
      return tandem::v1::FINISH_REASON_EOS;
    case engine::FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kCancelled:
      return tandem::v1::FINISH_REASON_CANCELLED;
    case engine::FinishReason::kError:
      break;
  }
  return tandem::v1::FINISH_REASON_UNSPECIFIED;
}

std::string FinishReasonName(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_EOS:
      return "eos";
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case tandem::v1::FINISH_REASON_DEADLINE:
      return "deadline";
    default:
      return "unspecified";
  }
}

engine::FinishReason FromProto(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_EOS:
      return engine::FinishReason::kEos;
    case tandem::v1::FINISH_REASON_STOP:
      return engine::FinishReason::kStop;
    case tandem::v1::FINISH_REASON_LENGTH:
      return engine::FinishReason::kLength;
    case tandem::v1::FINISH_REASON_CANCELLED:
    case tandem::v1::FINISH_REASON_DEADLINE:
      return engine::FinishReason::kCancelled;
    default:
      break;
  }
  return engine::FinishReason::kError;
}

void ToProto(const engine::SampleResult& result, tandem::v1::PositionLogprobs* proto) {
  proto->mutable_sampled()->set_token_id(result.token_id);
  proto->mutable_sampled()->set_logprob(result.logprob);
  proto->clear_top();
  for (const engine::TokenLogprob& t : result.top_logprobs) {
    tandem::v1::TokenLogprob* out = proto->add_top();
    out->set_token_id(t.id);
    out->set_logprob(t.logprob);
  }
}

engine::SampleResult FromProto(const tandem::v1::PositionLogprobs& proto) {
  engine::SampleResult r;
  r.token_id = proto.sampled().token_id();
  r.logprob = proto.sampled().logprob();
  for (const tandem::v1::TokenLogprob& t : proto.top())
    r.top_logprobs.push_back({t.token_id(), t.logprob()});
  return r;
}

}  // namespace tandem::services
