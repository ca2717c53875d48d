#include "services/router/validate.h"

#include <atomic>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/tokenizer/chat_template.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"

namespace tandem::router {
namespace {

using absl::InvalidArgumentError;

absl::Status CheckRange(const char* field, double v, double lo, double hi, bool lo_open) {
  if (std::isnan(v) || v > hi || v < lo || (lo_open && v == lo)) {
    return InvalidArgumentError(
        absl::StrFormat("%s must be in %c%g, %g], got %g", field, lo_open ? '(' : '[', lo, hi, v));
  }
  return absl::OkStatus();
}

absl::Status CheckTokenId(const std::string& field, int64_t id, int32_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    return InvalidArgumentError(absl::StrFormat("%s: token id %d is outside the vocabulary [0, %d)",
                                                field, id, vocab_size));
  }
  return absl::OkStatus();
}

absl::Status CheckSampling(const tandem::v1::SamplingParams& s, const ModelLimits& limits,
                           engine::SamplingParams* out) {
  out->temperature = s.has_temperature() ? s.temperature() : kDefaultTemperature;
  if (absl::Status st = CheckRange("sampling.temperature", out->temperature, 0, 100, false);
      !st.ok())
    return st;
  if (s.has_top_k()) {
    if (s.top_k() < 0) {
      return InvalidArgumentError(
          absl::StrFormat("sampling.top_k must be >= 0 (0 = off), got %d", s.top_k()));
    }
    out->top_k = s.top_k();
  }
  if (s.has_top_p()) {
    if (absl::Status st = CheckRange("sampling.top_p", s.top_p(), 0, 1, true); !st.ok()) return st;
    out->top_p = s.top_p();
  }
  if (s.has_min_p()) {
    if (absl::Status st = CheckRange("sampling.min_p", s.min_p(), 0, 1, false); !st.ok()) return st;
    out->min_p = s.min_p();
  }
  if (s.has_repetition_penalty()) {
    if (absl::Status st =
            CheckRange("sampling.repetition_penalty", s.repetition_penalty(), 0, 10, true);
        !st.ok())
      return st;
    out->repetition_penalty = s.repetition_penalty();
  }
  if (s.has_presence_penalty()) {
    if (absl::Status st =
            CheckRange("sampling.presence_penalty", s.presence_penalty(), -2, 2, false);
        !st.ok())
      return st;
    out->presence_penalty = s.presence_penalty();
  }
  if (s.has_frequency_penalty()) {
    if (absl::Status st =
            CheckRange("sampling.frequency_penalty", s.frequency_penalty(), -2, 2, false);
        !st.ok())
      return st;
    out->frequency_penalty = s.frequency_penalty();
  }
  if (static_cast<size_t>(s.logit_bias_size()) > kMaxLogitBias) {
    return InvalidArgumentError(absl::StrFormat("sampling.logit_bias has %d entries, at most %d",
                                                s.logit_bias_size(), kMaxLogitBias));
  }
  for (const auto& [id, bias] : s.logit_bias()) {
    if (absl::Status st = CheckTokenId("sampling.logit_bias", id, limits.vocab_size); !st.ok())
      return st;
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgumentError(absl::StrFormat(
          "sampling.logit_bias[%d] must be in [-100, 100], got %g", id, static_cast<double>(bias)));
    }
    out->logit_bias[id] = bias;
  }
  return absl::OkStatus();
}

absl::Status CheckStop(const tandem::v1::StopConditions& s, const ModelLimits& limits,
                       int64_t num_prompt_tokens, engine::StopParams* out) {
  const int64_t room = limits.context_length - num_prompt_tokens;
  int64_t max_tokens = kDefaultMaxTokens;
  if (s.has_max_tokens()) {
    max_tokens = s.max_tokens();
    if (max_tokens < 1 || max_tokens > limits.max_tokens_limit) {
      return InvalidArgumentError(absl::StrFormat("stop.max_tokens must be in [1, %d], got %d",
                                                  limits.max_tokens_limit, max_tokens));
    }
    if (max_tokens > room) {
      return InvalidArgumentError(absl::StrFormat(
          "stop.max_tokens: prompt (%d tokens) + max_tokens %d exceeds the context length %d",
          num_prompt_tokens, max_tokens, limits.context_length));
    }
  } else {
    max_tokens = std::min<int64_t>(max_tokens, room);  // default: what fits
  }
  out->max_tokens = max_tokens;
  if (s.has_min_tokens()) {
    if (s.min_tokens() < 0 || s.min_tokens() > max_tokens) {
      return InvalidArgumentError(absl::StrFormat(
          "stop.min_tokens must be in [0, max_tokens = %d], got %d", max_tokens, s.min_tokens()));
    }
    out->min_tokens = s.min_tokens();
  }
  if (static_cast<size_t>(s.stop_size()) > kMaxStopStrings) {
    return InvalidArgumentError(
        absl::StrFormat("stop.stop has %d strings, at most %d", s.stop_size(), kMaxStopStrings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& str = s.stop(i);
    if (str.empty() || str.size() > kMaxStopStringBytes) {
      return InvalidArgumentError(absl::StrFormat("stop.stop[%d] must be 1..%d bytes, got %d", i,
                                                  kMaxStopStringBytes, str.size()));
    }
    if (!utf8::IsValidUtf8(str)) {
      return InvalidArgumentError(absl::StrFormat("stop.stop[%d] is not valid UTF-8", i));
    }
    out->stop_strings.push_back(str);
  }
  if (static_cast<size_t>(s.stop_token_ids_size()) > kMaxStopTokenIds) {
    return InvalidArgumentError(absl::StrFormat("stop.stop_token_ids has %d ids, at most %d",
                                                s.stop_token_ids_size(), kMaxStopTokenIds));
  }
  for (int32_t id : s.stop_token_ids()) {
    if (absl::Status st = CheckTokenId("stop.stop_token_ids", id, limits.vocab_size); !st.ok())
      return st;
    out->stop_token_ids.push_back(id);
  }
  out->ignore_eos = s.ignore_eos();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodePrompt(const tandem::v1::GenerateRequest& request,
                                                  const ModelLimits& limits,
                                                  const tokenizer::Tokenizer* tokenizer) {
  switch (request.prompt_case()) {
    case tandem::v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return InvalidArgumentError("token_ids.ids is empty");
      if (ids.size() >= limits.context_length) {
        return InvalidArgumentError(
            absl::StrFormat("token_ids: the prompt has %d tokens; the context length is %d",
                            ids.size(), limits.context_length));
      }
      for (int i = 0; i < ids.size(); ++i) {
        if (absl::Status st =
                CheckTokenId(absl::StrFormat("token_ids.ids[%d]", i), ids[i], limits.vocab_size);
            !st.ok())
          return st;
      }
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    case tandem::v1::GenerateRequest::kText: {
      if (request.text().empty()) return InvalidArgumentError("text: the prompt is empty");
      if (request.text().size() > kMaxPromptBytes) {
        return InvalidArgumentError(
            absl::StrFormat("text: %d bytes, at most %d", request.text().size(), kMaxPromptBytes));
      }
      if (!utf8::IsValidUtf8(request.text()))
        return InvalidArgumentError("text is not valid UTF-8");
      if (tokenizer == nullptr) return absl::FailedPreconditionError("no tokenizer loaded");
      return tokenizer->Encode(request.text(), /*add_special=*/true, /*parse_special=*/true);
    }
    case tandem::v1::GenerateRequest::kMessages:
      if (tokenizer == nullptr) return absl::FailedPreconditionError("no tokenizer loaded");
      return EncodeChat(request.messages(), *tokenizer);
    case tandem::v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return InvalidArgumentError("prompt: set one of text, token_ids, messages");
}

}  // namespace

uint64_t DefaultSeed(const std::string& request_id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : request_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string NewRequestId() {
  static std::atomic<uint64_t> counter{0};
  uint64_t x = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
               (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return absl::StrFormat("req-%016x", x);
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const tandem::v1::ChatMessages& messages,
                                                const tokenizer::Tokenizer& tokenizer) {
  if (messages.messages().empty()) return InvalidArgumentError("messages is empty");
  if (static_cast<size_t>(messages.messages_size()) > kMaxChatMessages) {
    return InvalidArgumentError(absl::StrFormat("messages has %d entries, at most %d",
                                                messages.messages_size(), kMaxChatMessages));
  }
  std::vector<tokenizer::ChatMessage> chat;
  size_t total = 0;
  for (int i = 0; i < messages.messages_size(); ++i) {
    const auto& m = messages.messages(i);
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
      return InvalidArgumentError(absl::StrFormat(
          "messages[%d].role must be system, user or assistant, got '%s'", i,
          utf8::IsValidUtf8(m.role()) && m.role().size() <= 32 ? m.role() : "<invalid>"));
    }
    if (!utf8::IsValidUtf8(m.content())) {
      return InvalidArgumentError(absl::StrFormat("messages[%d].content is not valid UTF-8", i));
    }
    total += m.content().size();
    chat.push_back({m.role(), m.content()});
  }
  if (total > kMaxPromptBytes) {
    return InvalidArgumentError(
        absl::StrFormat("messages: %d bytes of content, at most %d", total, kMaxPromptBytes));
  }
  const std::string& tmpl = tokenizer.vocab().chat_template;
  auto format = tokenizer::DetectChatFormat(tmpl);
  if (!format.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "messages: the model's chat template is not supported (%s)", format.status().message()));
  }
  const std::string text = tokenizer::RenderChat(*format, chat, /*add_generation_prompt=*/true,
                                                 tokenizer::ExtractDefaultSystem(tmpl));
  return tokenizer.Encode(text, /*add_special=*/false, /*parse_special=*/true);
}

absl::Status CheckNoUnknownFields(const google::protobuf::Message& message,
                                  const std::string& path) {
  const google::protobuf::Reflection* refl = message.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = refl->GetUnknownFields(message);
  if (!unknown.empty()) {
    return InvalidArgumentError(absl::StrFormat(
        "%s: unknown field number %d (this server speaks %s)", path.empty() ? "request" : path,
        unknown.field(0).number(), message.GetDescriptor()->full_name()));
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  refl->ListFields(message, &fields);
  for (const auto* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE || f->is_map())
      continue;
    const std::string sub = path.empty() ? f->name() : path + "." + f->name();
    if (f->is_repeated()) {
      const int n = refl->FieldSize(message, f);
      for (int i = 0; i < n && i < 1024; ++i) {
        if (absl::Status s = CheckNoUnknownFields(refl->GetRepeatedMessage(message, f, i),
                                                  absl::StrFormat("%s[%d]", sub, i));
            !s.ok())
          return s;
      }
    } else if (absl::Status s = CheckNoUnknownFields(refl->GetMessage(message, f), sub); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedRequest> PrepareRequest(const tandem::v1::GenerateRequest& request,
                                               const ModelLimits& limits,
                                               const tokenizer::Tokenizer* tokenizer) {
  if (absl::Status s = CheckNoUnknownFields(request, ""); !s.ok()) return s;
  PreparedRequest out;
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return InvalidArgumentError(absl::StrFormat("request_id: %d bytes, at most %d",
                                                request.request_id().size(), kMaxRequestIdBytes));
  }
  if (!utf8::IsValidUtf8(request.request_id()))
    return InvalidArgumentError("request_id is not valid UTF-8");
  out.request_id = request.request_id().empty() ? NewRequestId() : request.request_id();
  if (request.cache_salt().size() > kMaxCacheSaltBytes) {
    return InvalidArgumentError(absl::StrFormat("cache_salt: %d bytes, at most %d",
                                                request.cache_salt().size(), kMaxCacheSaltBytes));
  }
  if (!request.cache_salt().empty()) {
    out.cache_key = DefaultSeed(request.cache_salt()) | 1;  // never 0 (= no salt)
  }
  auto ids = EncodePrompt(request, limits, tokenizer);
  if (!ids.ok()) return ids.status();
  if (ids->empty()) return InvalidArgumentError("prompt: encodes to zero tokens");
  if (static_cast<int64_t>(ids->size()) >= limits.context_length) {
    return InvalidArgumentError(
        absl::StrFormat("prompt: %d tokens leave no room in the context length %d", ids->size(),
                        limits.context_length));
  }
  out.prompt_token_ids = std::move(ids).value();
  if (absl::Status s = CheckSampling(request.sampling(), limits, &out.params); !s.ok()) return s;
  out.params.seed =
      request.sampling().has_seed() ? request.sampling().seed() : DefaultSeed(out.request_id);
  if (absl::Status s =
          CheckStop(request.stop(), limits, static_cast<int64_t>(out.prompt_token_ids.size()),
                    &out.params.stop);
      !s.ok())
    return s;
  if (request.speculative().has_num_speculative_tokens()) {
    const int32_t k = request.speculative().num_speculative_tokens();
    if (k < 0 || k > engine::kMaxRequestSpecTokens) {
      return InvalidArgumentError(
          absl::StrFormat("speculative.num_speculative_tokens must be in [0, %d] (0 = off), got %d",
                          engine::kMaxRequestSpecTokens, k));
    }
    out.params.num_speculative_tokens = k;
  }
  const auto& lp = request.logprobs();
  if (lp.has_top_logprobs() && (lp.top_logprobs() < 0 || lp.top_logprobs() > kMaxTopLogprobs)) {
    return InvalidArgumentError(absl::StrFormat("logprobs.top_logprobs must be in [0, %d], got %d",
                                                kMaxTopLogprobs, lp.top_logprobs()));
  }
  out.logprobs = lp.enabled() || lp.has_top_logprobs();
  out.top_logprobs = lp.has_top_logprobs() ? lp.top_logprobs() : 0;
  if (out.logprobs) out.params.num_logprobs = out.top_logprobs;
  // Belt and braces: the engine's own checks, so a bound missed above still
  // comes back as INVALID_ARGUMENT rather than a failure deep in a worker.
  if (absl::Status s = out.params.Validate(limits.vocab_size); !s.ok()) return s;
  return out;
}

}  // namespace tandem::router
