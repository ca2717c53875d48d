#include "services/http/openai_protocol.h"

#include <cmath>
#include <limits>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "common/status.h"
#include "common/utf8.h"
#include "services/router/generation_service.h"

namespace tandem::http {
namespace {

using json = tandem::json::Json;
constexpr char kParamPayload[] = "tandem.http/param";

absl::Status Invalid(const std::string& param, const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(absl::StrFormat("%s: %s", param, message));
  s.SetPayload(kParamPayload, absl::Cord(param));
  return s;
}

absl::StatusOr<double> Number(const json& v, const std::string& name) {
  if (!v.is_number()) return Invalid(name, "must be a number");
  return v.get<double>();
}

absl::StatusOr<int64_t> Integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return Invalid(name, absl::StrFormat("must be <= %d", hi));
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>())) {
    // 7.0, or an integer literal beyond 64 bits (which the parser reads as a
    // double): a whole number, so out of range rather than not an integer.
    if (std::fabs(v.get<double>()) >= 9e15) {
      return Invalid(name, absl::StrFormat("must be in [%d, %d]", lo, hi));
    }
    x = static_cast<int64_t>(v.get<double>());
  } else {
    return Invalid(name, "must be an integer");
  }
  if (x < lo || x > hi) return Invalid(name, absl::StrFormat("must be in [%d, %d]", lo, hi));
  return x;
}

absl::StatusOr<std::string> String(const json& v, const std::string& name) {
  if (!v.is_string()) return Invalid(name, "must be a string");
  return v.get<std::string>();
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Chat content: a string, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> Content(const json& v, const std::string& name) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return std::string();
  if (!v.is_array()) return Invalid(name, "must be a string or an array of text parts");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = absl::StrFormat("%s[%d]", name, i);
    const json& p = v[i];
    if (!p.is_object() || !p.contains("type") || p["type"] != "text" || !p.contains("text") ||
        !p["text"].is_string()) {
      return Invalid(part, "only {\"type\": \"text\", \"text\": string} parts are supported");
    }
    out += p["text"].get<std::string>();
  }
  return out;
}

absl::Status ParseMessages(const json& v, tandem::v1::GenerateRequest* r) {
  if (!v.is_array() || v.empty()) return Invalid("messages", "must be a non-empty array");
  auto* msgs = r->mutable_messages();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string name = absl::StrFormat("messages[%d]", i);
    const json& m = v[i];
    if (!m.is_object()) return Invalid(name, "must be an object");
    auto* out = msgs->add_messages();
    for (const auto& [key, val] : m.items()) {
      if (key == "role") {
        auto s = String(val, name + ".role");
        if (!s.ok()) return s.status();
        out->set_role(*s);
      } else if (key == "content") {
        auto s = Content(val, name + ".content");
        if (!s.ok()) return s.status();
        out->set_content(*s);
      } else if (key == "name") {
        if (!val.is_string()) return Invalid(name + ".name", "must be a string");
      } else {
        return Invalid(name + "." + key, "unsupported field");
      }
    }
    if (!m.contains("role")) return Invalid(name + ".role", "is required");
  }
  return absl::OkStatus();
}

absl::Status ParsePrompt(const json& v, tandem::v1::GenerateRequest* r) {
  if (v.is_string()) {
    r->set_text(v.get<std::string>());
    return absl::OkStatus();
  }
  if (v.is_array() && v.size() == 1 && (v[0].is_string() || v[0].is_array())) {
    return ParsePrompt(v[0], r);  // a batch of one
  }
  if (!v.is_array() || v.empty()) {
    return Invalid("prompt", "must be a string or a non-empty array of token ids");
  }
  auto* ids = r->mutable_token_ids()->mutable_ids();
  for (size_t i = 0; i < v.size(); ++i) {
    auto id = Integer(v[i], absl::StrFormat("prompt[%d]", i), std::numeric_limits<int32_t>::min(),
                      kInt32Max);
    if (!id.ok()) {
      return Invalid("prompt", "must be a string or an array of token ids (one prompt per call)");
    }
    ids->Add(static_cast<int32_t>(*id));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& v, tandem::v1::GenerateRequest* r) {
  if (v.is_null()) return absl::OkStatus();
  if (v.is_string()) {
    r->mutable_stop()->add_stop(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return Invalid("stop", "must be a string or an array of strings");
  for (const json& s : v) {
    if (!s.is_string()) return Invalid("stop", "must be a string or an array of strings");
    r->mutable_stop()->add_stop(s.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseLogitBias(const json& v, tandem::v1::GenerateRequest* r) {
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_object()) return Invalid("logit_bias", "must be an object of token id -> bias");
  auto* bias = r->mutable_sampling()->mutable_logit_bias();
  for (const auto& [key, val] : v.items()) {
    int64_t id = 0;
    if (key.empty() || key.size() > 10 ||
        key.find_first_not_of("0123456789") != std::string::npos ||
        (id = std::stoll(key)) > kInt32Max) {
      return Invalid("logit_bias", absl::StrFormat("key '%s' is not a token id",
                                                   router::SanitizeUtf8(key.substr(0, 32))));
    }
    auto b = Number(val, "logit_bias");
    if (!b.ok()) return b.status();
    if (!(std::fabs(*b) <= 100)) return Invalid("logit_bias", "biases must be in [-100, 100]");
    (*bias)[static_cast<int32_t>(id)] = static_cast<float>(*b);
  }
  return absl::OkStatus();
}

// The sampling fields (temperature ... logit_bias); false in `known` when
// `key` is not one of them (so for ParseStopField and ParseOutputField).
absl::Status ParseSamplingField(Endpoint, const std::string& key, const json& v, OpenAiRequest* out,
                                bool* known) {
  tandem::v1::GenerateRequest* r = &out->request;
  auto* sampling = r->mutable_sampling();
  auto number = [&](auto setter) -> absl::Status {
    auto x = Number(v, key);
    if (!x.ok()) return x.status();
    setter(*x);
    return absl::OkStatus();
  };
  if (key == "temperature") {
    return number([&](double x) { sampling->set_temperature(x); });
  } else if (key == "top_p") {
    return number([&](double x) { sampling->set_top_p(x); });
  } else if (key == "min_p") {
    return number([&](double x) { sampling->set_min_p(x); });
  } else if (key == "presence_penalty") {
    return number([&](double x) { sampling->set_presence_penalty(x); });
  } else if (key == "frequency_penalty") {
    return number([&](double x) { sampling->set_frequency_penalty(x); });
  } else if (key == "repetition_penalty") {
    return number([&](double x) { sampling->set_repetition_penalty(x); });
  } else if (key == "top_k") {
    auto x = Integer(v, key, -1, kInt32Max);  // -1 = off (vLLM)
    if (!x.ok()) return x.status();
    sampling->set_top_k(*x < 0 ? 0 : static_cast<int32_t>(*x));
  } else if (key == "seed") {
    if (v.is_number_unsigned()) {
      sampling->set_seed(v.get<uint64_t>());
    } else {
      auto x = Integer(v, key, 0, std::numeric_limits<int64_t>::max());
      if (!x.ok()) return x.status();
      sampling->set_seed(static_cast<uint64_t>(*x));
    }
  } else if (key == "logit_bias") {
    return ParseLogitBias(v, r);
  } else {
    *known = false;
  }
  return absl::OkStatus();
}

// When generation stops: lengths, stop strings and tokens, ignore_eos.
absl::Status ParseStopField(Endpoint endpoint, const std::string& key, const json& v,
                            OpenAiRequest* out, bool* known) {
  tandem::v1::GenerateRequest* r = &out->request;
  const bool chat = endpoint == Endpoint::kChat;
  auto* stop = r->mutable_stop();
  if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
    auto x = Integer(v, key, 1, kInt32Max);
    if (!x.ok()) return x.status();
    stop->set_max_tokens(static_cast<int32_t>(*x));
  } else if (key == "min_tokens") {
    auto x = Integer(v, key, 0, kInt32Max);
    if (!x.ok()) return x.status();
    stop->set_min_tokens(static_cast<int32_t>(*x));
  } else if (key == "stop") {
    return ParseStop(v, r);
  } else if (key == "stop_token_ids") {
    if (!v.is_array()) return Invalid(key, "must be an array of token ids");
    for (const json& id : v) {
      auto x = Integer(id, key, 0, kInt32Max);
      if (!x.ok()) return x.status();
      stop->add_stop_token_ids(static_cast<int32_t>(*x));
    }
  } else if (key == "ignore_eos") {
    if (!v.is_boolean()) return Invalid(key, "must be a boolean");
    stop->set_ignore_eos(v.get<bool>());
  } else {
    *known = false;
  }
  return absl::OkStatus();
}

// n, logprobs, streaming, user and Tandem's num_speculative_tokens.
absl::Status ParseOutputField(Endpoint endpoint, const std::string& key, const json& v,
                              OpenAiRequest* out, bool* known) {
  tandem::v1::GenerateRequest* r = &out->request;
  const bool chat = endpoint == Endpoint::kChat;
  if (key == "n" || (!chat && key == "best_of")) {
    auto x = Integer(v, key, 1, kInt32Max);
    if (!x.ok()) return x.status();
    if (*x != 1) return Invalid(key, "only 1 is supported");
  } else if (key == "logprobs") {
    if (chat) {
      if (!v.is_boolean()) return Invalid(key, "must be a boolean");
      r->mutable_logprobs()->set_enabled(v.get<bool>());
    } else {  // completions: the number of alternatives per position
      auto x = Integer(v, key, 0, kInt32Max);
      if (!x.ok()) return x.status();
      r->mutable_logprobs()->set_enabled(true);
      r->mutable_logprobs()->set_top_logprobs(static_cast<int32_t>(std::min<int64_t>(*x, 1000)));
    }
  } else if (key == "top_logprobs" && chat) {
    auto x = Integer(v, key, 0, kInt32Max);
    if (!x.ok()) return x.status();
    r->mutable_logprobs()->set_top_logprobs(static_cast<int32_t>(std::min<int64_t>(*x, 1000)));
  } else if (key == "stream") {
    if (!v.is_boolean()) return Invalid(key, "must be a boolean");
    out->stream = v.get<bool>();
  } else if (key == "stream_options") {
    if (!v.is_object()) return Invalid(key, "must be an object");
    for (const auto& [k, x] : v.items()) {
      if (k != "include_usage") return Invalid("stream_options." + k, "unsupported field");
      if (!x.is_boolean()) return Invalid("stream_options.include_usage", "must be a boolean");
      out->include_usage = x.get<bool>();
    }
  } else if (key == "num_speculative_tokens") {  // Tandem's extension (extra_body)
    auto x = Integer(v, key, 0, 16);
    if (!x.ok()) return x.status();
    r->mutable_speculative()->set_num_speculative_tokens(static_cast<int32_t>(*x));
  } else if (key == "user") {
    auto s = String(v, key);
    if (!s.ok()) return s.status();
    if (s->size() > kMaxUserBytes) return Invalid(key, "too long");
  } else if (!chat && key == "echo") {
    if (!v.is_boolean()) return Invalid(key, "must be a boolean");
    if (v.get<bool>()) return Invalid(key, "echo is not supported");
  } else if (!chat && key == "suffix") {
    return Invalid(key, "suffix is not supported");

  } else {
    *known = false;
  }
  return absl::OkStatus();
}

// One top-level field of the body into `out`; *known = false for a field
// this endpoint does not take (the caller rejects it by name).
absl::Status ParseField(Endpoint endpoint, const std::string& key, const json& v,
                        OpenAiRequest* out, bool* known) {
  tandem::v1::GenerateRequest* r = &out->request;
  const bool chat = endpoint == Endpoint::kChat;
  *known = true;
  // OpenAI clients send null for "not set".
  if (v.is_null() && key != "prompt" && key != "messages") return absl::OkStatus();
  if (key == "model") {
    auto s = String(v, key);
    return s.status();  // compared by the caller
  } else if (key == "prompt" && !chat) {
    return ParsePrompt(v, r);
  } else if (key == "messages" && chat) {
    return ParseMessages(v, r);
  }
  for (auto* parse : {ParseSamplingField, ParseStopField, ParseOutputField}) {
    TANDEM_RETURN_IF_ERROR(parse(endpoint, key, v, out, known));
    if (*known) return absl::OkStatus();
    *known = true;
  }
  *known = false;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, std::string_view body,
                                                 const std::string& model_name) {
  if (tandem::json::NestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return Invalid("body", absl::StrFormat("JSON nested deeper than %d", kMaxJsonDepth));
  }
  absl::StatusOr<json> parsed =
      tandem::json::Parse(body, {.max_depth = kMaxJsonDepth, .max_bytes = body.size()});
  if (!parsed.ok()) return Invalid("body", "not valid JSON");
  const json& j = *parsed;
  if (!j.is_object()) return Invalid("body", "must be a JSON object");
  OpenAiRequest out;
  out.endpoint = endpoint;
  for (const auto& [key, v] : j.items()) {
    bool known = false;
    if (absl::Status s = ParseField(endpoint, key, v, &out, &known); !s.ok()) return s;
    if (!known) {
      return Invalid(
          key, absl::StrFormat("unknown field '%s'", router::SanitizeUtf8(key.substr(0, 64))));
    }
  }
  const char* required = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (!j.contains(required) || j[required].is_null()) return Invalid(required, "is required");
  if (j.contains("model") && j["model"].is_string() &&
      j["model"].get<std::string>() != model_name) {
    absl::Status s = absl::NotFoundError(absl::StrFormat(
        "The model '%s' does not exist; this server serves '%s'",
        router::SanitizeUtf8(j["model"].get<std::string>().substr(0, 256)), model_name));
    s.SetPayload(kParamPayload, absl::Cord("model"));
    return s;
  }
  if (out.include_usage && !out.stream) {
    return Invalid("stream_options", "only allowed when stream is true");
  }
  return out;
}

namespace {

// The gRPC field path the router's validation names (services/router/
// validate.cc) and the OpenAI parameter it came from. Longer paths first
// where one is a prefix of another ("stop.stop_token_ids" before
// "stop.stop").
struct ParamName {
  absl::string_view path, completions, chat;
};
constexpr ParamName kParamNames[] = {
    {"sampling.temperature", "temperature", "temperature"},
    {"sampling.top_k", "top_k", "top_k"},
    {"sampling.top_p", "top_p", "top_p"},
    {"sampling.min_p", "min_p", "min_p"},
    {"sampling.repetition_penalty", "repetition_penalty", "repetition_penalty"},
    {"sampling.presence_penalty", "presence_penalty", "presence_penalty"},
    {"sampling.frequency_penalty", "frequency_penalty", "frequency_penalty"},
    {"sampling.logit_bias", "logit_bias", "logit_bias"},
    {"sampling.seed", "seed", "seed"},
    {"logprobs.top_logprobs", "logprobs", "top_logprobs"},
    {"stop.max_tokens", "max_tokens", "max_tokens"},
    {"stop.min_tokens", "min_tokens", "min_tokens"},
    {"stop.stop_token_ids", "stop_token_ids", "stop_token_ids"},
    {"stop.stop", "stop", "stop"},
    {"speculative.num_speculative_tokens", "num_speculative_tokens", "num_speculative_tokens"},
    {"token_ids.ids", "prompt", "messages"},
    {"token_ids", "prompt", "messages"},
    {"text", "prompt", "messages"},
    {"messages", "prompt", "messages"},
    {"prompt", "prompt", "messages"},
};

}  // namespace

absl::Status WithOpenAiParam(Endpoint endpoint, const absl::Status& status) {
  if (status.ok() || status.code() != absl::StatusCode::kInvalidArgument ||
      status.GetPayload(kParamPayload).has_value()) {
    return status;
  }
  const absl::string_view msg = status.message();
  for (const ParamName& p : kParamNames) {
    if (msg.substr(0, p.path.size()) != p.path) continue;
    // The path must end there: "stop.stop" does not name "stop.stopx".
    const absl::string_view rest = msg.substr(p.path.size());
    if (!rest.empty() && rest[0] != ' ' && rest[0] != ':' && rest[0] != '[' && rest[0] != '.') {
      continue;
    }
    const absl::string_view name = endpoint == Endpoint::kChat ? p.chat : p.completions;
    // "sampling.top_p must be ..." -> "top_p must be ...",
    // "token_ids.ids[5]: token id ..." -> "prompt[5]: token id ...".
    absl::Status out = absl::InvalidArgumentError(absl::StrCat(name, rest));
    status.ForEachPayload(
        [&](absl::string_view url, const absl::Cord& v) { out.SetPayload(url, v); });
    // A message's own field keeps its index, as the parser's errors do
    // ("messages[0].role").
    std::string param(name);
    if (p.path == "messages") param += std::string(rest.substr(0, rest.find_first_of(" :")));
    out.SetPayload(kParamPayload, absl::Cord(param));
    return out;
  }
  return status;
}

ApiError ApiErrorFrom(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  if (auto p = status.GetPayload(kParamPayload); p.has_value()) e.param = std::string(*p);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "invalid_request_error";
      e.code = e.param == "model" ? "model_not_found" : "not_found";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "invalid_request_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
  }
  return e;
}

std::string ApiErrorJson(const ApiError& error) {
  json e = {{"message", router::SanitizeUtf8(error.message)},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return tandem::json::Dump(json{{"error", e}});
}

namespace {

const char* FinishReasonName(tandem::v1::FinishReason r) {
  switch (r) {
    case tandem::v1::FINISH_REASON_LENGTH:
    case tandem::v1::FINISH_REASON_DEADLINE:
      return "length";
    case tandem::v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "stop";
  }
}

std::string Piece(const tokenizer::Tokenizer* tok, int32_t id) {
  return router::SanitizeUtf8(tok->TokenToPiece(id));
}

json UsageJson(const tandem::v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

json BytesOf(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// OpenAI's logprobs object for these positions (null when none).
json LogprobsJson(Endpoint endpoint, const tokenizer::Tokenizer* tok,
                  const std::vector<tandem::v1::PositionLogprobs>& lps, bool enabled) {
  if (!enabled) return nullptr;
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const auto& p : lps) {
      const std::string t = Piece(tok, p.sampled().token_id());
      json top = json::array();
      for (const auto& a : p.top()) {
        const std::string at = Piece(tok, a.token_id());
        top.push_back({{"token", at}, {"logprob", a.logprob()}, {"bytes", BytesOf(at)}});
      }
      content.push_back({{"token", t},
                         {"logprob", p.sampled().logprob()},
                         {"bytes", BytesOf(t)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array();
  for (const auto& p : lps) {
    tokens.push_back(Piece(tok, p.sampled().token_id()));
    token_logprobs.push_back(p.sampled().logprob());
    json alts = json::object();
    for (const auto& a : p.top()) alts[Piece(tok, a.token_id())] = a.logprob();
    top.push_back(alts);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}};
}

}  // namespace

ResponseBuilder::ResponseBuilder(const OpenAiRequest& request, std::string model_name,
                                 const tokenizer::Tokenizer* tokenizer, int64_t created)
    : request_(request),
      model_name_(std::move(model_name)),
      tokenizer_(tokenizer),
      created_(created) {}

void ResponseBuilder::Add(const tandem::v1::GenerateResponse& r) {
  if (id_.empty()) id_ = r.request_id();
  text_ += r.text();
  for (const auto& lp : r.logprobs()) logprobs_.push_back(lp);
  if (r.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = FinishReasonName(r.finish_reason());
    usage_ = r.usage();
  }
}

std::string ResponseBuilder::Body() const {
  const bool chat = request_.endpoint == Endpoint::kChat;
  const bool lp = request_.request.logprobs().enabled();
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(request_.endpoint, tokenizer_, logprobs_, lp)},
                 {"finish_reason", finish_reason_}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  json body = {{"id", (chat ? "chatcmpl-" : "cmpl-") + id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_name_},
               {"choices", json::array({choice})},
               {"usage", UsageJson(usage_)}};
  return tandem::json::Dump(body);
}

std::string ResponseBuilder::Chunk(const tandem::v1::GenerateResponse& r, bool last) {
  const bool chat = request_.endpoint == Endpoint::kChat;
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + r.request_id();
  auto envelope = [&](json choices) {
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", model_name_},
                {"choices", std::move(choices)}};
  };
  std::string out;
  auto emit = [&](const json& j) { out += "data: " + tandem::json::Dump(j) + "\n\n"; };
  if (chat && !sent_role_) {
    sent_role_ = true;
    emit(envelope(json::array({{{"index", 0},
                                {"delta", {{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}}})));
  }
  std::vector<tandem::v1::PositionLogprobs> lps(r.logprobs().begin(), r.logprobs().end());
  const bool lp = request_.request.logprobs().enabled();
  if (!r.text().empty() || !lps.empty() || last) {
    json choice = {
        {"index", 0},
        {"logprobs", LogprobsJson(request_.endpoint, tokenizer_, lps, lp && !lps.empty())},
        {"finish_reason", last ? json(FinishReasonName(r.finish_reason())) : json()}};
    if (chat) {
      choice["delta"] = r.text().empty() ? json::object() : json{{"content", r.text()}};
    } else {
      choice["text"] = r.text();
    }
    emit(envelope(json::array({choice})));
  }
  if (last) {
    if (request_.include_usage) {
      json u = envelope(json::array());
      u["usage"] = UsageJson(r.usage());
      emit(u);
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

std::string ResponseBuilder::ErrorEvent(const ApiError& error) {
  return "data: " + ApiErrorJson(error) + "\n\ndata: [DONE]\n\n";
}

}  // namespace tandem::http
