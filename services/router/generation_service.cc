#include "services/router/generation_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"
#include "services/router/generate_reactor.h"
#include "spdlog/spdlog.h"

namespace tandem::router {
namespace {

using tandem::v1::FinishReason;
using tandem::v1::GenerateResponse;

}  // namespace

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = utf8::ValidUtf8Len(s, pos);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++pos;
    } else {
      out.append(s.substr(pos, n));
      pos += n;
    }
  }
  return out;
}

GenerationServiceImpl::GenerationServiceImpl(Options options) : options_(std::move(options)) {}

void GenerationServiceImpl::ReactorStarted() {
  absl::MutexLock lock(&reactors_mu_);
  ++live_reactors_;
}

void GenerationServiceImpl::ReactorFinished() {
  absl::MutexLock lock(&reactors_mu_);
  --live_reactors_;
}

void GenerationServiceImpl::WaitForReactors() {
  absl::MutexLock lock(&reactors_mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reactors_mu_) { return live_reactors_ == 0; };
  while (!reactors_mu_.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(10))) {
    spdlog::warn("router shutdown: still waiting for {} Generate stream(s) to end", live_reactors_);
  }
}

absl::Status GenerationServiceImpl::Fail(const absl::Status& status) {
  if (options_.metrics != nullptr) options_.metrics->RequestErrors(status.code())->Inc();
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  // An engine / worker queue is full: the router's retry hint, whatever the
  // worker suggested.
  return absl::ResourceExhaustedError(absl::StrFormat("%s; retry after %s", status.message(),
                                                      absl::FormatDuration(options_.retry_after)));
}

grpc::Status GenerationServiceImpl::Authenticate(const grpc::ServerContextBase* context) {
  grpc::Status s = options_.api_keys.Check(*context);
  if (!s.ok() && options_.metrics != nullptr) {
    options_.metrics->RequestErrors(absl::StatusCode::kUnauthenticated)->Inc();
  }
  return s;
}

absl::Status GenerationServiceImpl::AuthenticateHeader(const std::string* authorization) {
  grpc::Status s = options_.api_keys.CheckHeader(authorization);
  if (!s.ok() && options_.metrics != nullptr) {
    options_.metrics->RequestErrors(absl::StatusCode::kUnauthenticated)->Inc();
  }
  return services::FromGrpcStatus(s);
}

GenerationServiceImpl::AdmittedCall::~AdmittedCall() {
  call_.reset();  // cancels a running call (never blocks)
  if (service_ == nullptr) return;
  if (metrics::TandemMetrics* m = service_->options_.metrics; m != nullptr) {
    m->num_requests_running->Dec();
    m->num_inflight_tokens->Dec(static_cast<double>(cost_));
  }
  service_->inflight_tokens_.fetch_sub(cost_);
  service_->inflight_.fetch_sub(1);
}

void GenerationServiceImpl::AdmittedCall::CancelForClient() const {
  call_->Cancel();  // the workers free the request's KV
  if (metrics::TandemMetrics* m = service_->options_.metrics; m != nullptr) {
    m->RequestErrors(absl::StatusCode::kCancelled)->Inc();
  }
}

absl::StatusOr<std::unique_ptr<GenerationServiceImpl::AdmittedCall>> GenerationServiceImpl::Admit(
    const tandem::v1::GenerateRequest& request) {
  if (draining_.load()) {
    return Fail(absl::UnavailableError("the router is draining (shutting down); retry"));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<PreparedRequest> prepared =
      PrepareRequest(request, options_.limits, options_.tokenizer);
  if (!prepared.ok()) return Fail(prepared.status());
  // Token cost of admission: the prompt plus every token it may generate.
  const int64_t cost = static_cast<int64_t>(prepared->prompt_token_ids.size()) +
                       prepared->params.stop.max_tokens.value_or(0);
  if (cost > options_.max_inflight_tokens) {  // could never be admitted: not retryable
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) = %d tokens exceeds the router's "
        "--max-inflight-tokens %d",
        prepared->prompt_token_ids.size(), prepared->params.stop.max_tokens.value_or(0), cost,
        options_.max_inflight_tokens)));
  }
  metrics::TandemMetrics* m = options_.metrics;
  auto reject = [&](const std::string& why) {
    if (m != nullptr) m->RequestErrors(absl::StatusCode::kResourceExhausted)->Inc();
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s; retry after %s", why, absl::FormatDuration(options_.retry_after)));
  };
  if (inflight_.fetch_add(1) >= options_.max_inflight) {
    inflight_.fetch_sub(1);
    return reject(absl::StrFormat("the router has %d requests in flight (its --max-inflight)",
                                  options_.max_inflight));
  }
  if (const int64_t held = inflight_tokens_.fetch_add(cost);
      held + cost > options_.max_inflight_tokens) {
    inflight_tokens_.fetch_sub(cost);
    inflight_.fetch_sub(1);
    return reject(absl::StrFormat(
        "the router holds %d of its %d in-flight tokens (--max-inflight-tokens); this request "
        "needs %d",
        held, options_.max_inflight_tokens, cost));
  }
  if (m != nullptr) {
    m->num_requests_running->Inc();
    m->num_inflight_tokens->Inc(static_cast<double>(cost));
  }
  // From here the slots are held by `admitted` and given back when it goes.
  auto admitted = std::make_unique<AdmittedCall>();
  admitted->service_ = this;
  admitted->cost_ = cost;
  admitted->start_ = start;
  admitted->request_ = std::move(prepared).value();
  if (!options_.backend->Ready()) {
    return Fail(absl::UnavailableError("no live workers can take the request; retry later"));
  }
  admitted->queue_ = std::make_shared<CallQueue>();
  absl::StatusOr<std::unique_ptr<BackendCall>> call =
      options_.backend->Start(admitted->request_, admitted->queue_);
  if (!call.ok()) return Fail(call.status());
  admitted->call_ = std::move(call).value();
  return admitted;
}

GenerateResponse GenerateResponseBuilder::Token(BackendEvent& ev) {
  metrics::TandemMetrics* m = metrics_;
  const absl::Time t = absl::Now();
  const int64_t n = static_cast<int64_t>(ev.token_ids.size());
  if (n > 0) {
    if (num_tokens_ == 0) {
      first_token_time_ = t;
      if (m != nullptr) m->time_to_first_token->Observe(absl::ToDoubleSeconds(t - start_));
      if (m != nullptr && n > 1) {
        for (int64_t i = 1; i < n; ++i) m->inter_token_latency->Observe(0);
      }
    } else if (m != nullptr) {
      const double gap = absl::ToDoubleSeconds(t - last_token_time_) / static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i) m->inter_token_latency->Observe(gap);
    }
    last_token_time_ = t;
    num_tokens_ += n;
    if (m != nullptr) m->generation_tokens->Inc(static_cast<double>(n));
  }
  GenerateResponse resp;
  resp.set_request_id(request_.request_id);
  resp.mutable_token_ids()->Add(ev.token_ids.begin(), ev.token_ids.end());
  resp.set_text(std::move(ev.text));
  for (auto& lp : ev.logprobs) *resp.add_logprobs() = std::move(lp);
  return resp;
}

GenerateResponse GenerateResponseBuilder::Final(FinishReason reason, const std::string& tail,
                                                int32_t num_cached_tokens, double backend_queue_s) {
  const int64_t num_prompt = static_cast<int64_t>(request_.prompt_token_ids.size());
  GenerateResponse resp;
  resp.set_request_id(request_.request_id);
  resp.set_text(tail);
  resp.set_finish_reason(reason);
  resp.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(num_prompt));
  resp.mutable_usage()->set_cached_tokens(num_cached_tokens);
  resp.mutable_usage()->set_completion_tokens(static_cast<int32_t>(num_tokens_));
  const absl::Time now = absl::Now();
  auto* t = resp.mutable_timings();
  t->set_queue_seconds(backend_queue_s);
  t->set_ttft_seconds(num_tokens_ > 0 ? absl::ToDoubleSeconds(first_token_time_ - start_) : 0);
  t->set_mean_tpot_seconds(num_tokens_ > 1
                               ? absl::ToDoubleSeconds(last_token_time_ - first_token_time_) /
                                     static_cast<double>(num_tokens_ - 1)
                               : 0);
  t->set_e2e_seconds(absl::ToDoubleSeconds(now - start_));
  if (metrics_ != nullptr) {
    metrics_->RequestSuccess(services::FinishReasonName(reason))->Inc();
    metrics_->e2e_request_latency->Observe(t->e2e_seconds());
    metrics_->request_queue_time->Observe(backend_queue_s);
    metrics_->prompt_tokens->Inc(static_cast<double>(num_prompt));
  }
  return resp;
}

absl::Time FinishBy(absl::Time start, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return absl::InfiniteFuture();
  const absl::Duration margin =
      std::clamp((deadline - start) / 10, absl::Milliseconds(20), absl::Milliseconds(200));
  return deadline - margin;
}

grpc::ServerWriteReactor<GenerateResponse>* GenerationServiceImpl::Generate(
    grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) {
  return GenerateReactor::Start(this, context, *request);
}

CallStream::CallStream(GenerationServiceImpl::AdmittedCall* call)
    : call_(call), builder_(call->request(), call->start(), call->service_->options().metrics) {}

CallStream::Step CallStream::Next() {
  Step step;
  if (done_) return step;
  if (deadline_hit_) {
    done_ = true;
    step.kind = Step::kFinal;
    step.response = builder_.Final(tandem::v1::FINISH_REASON_DEADLINE, "", 0, 0);
    return step;
  }
  std::optional<BackendEvent> ev = call_->queue().TryPop();
  if (!ev.has_value()) return step;
  if (!ev->finished) {
    step.kind = Step::kToken;
    step.response = builder_.Token(*ev);
    return step;
  }
  done_ = true;
  if (!ev->status.ok()) {
    step.kind = Step::kError;
    step.status = call_->service_->Fail(ev->status);
    return step;
  }
  step.kind = Step::kFinal;
  step.response =
      builder_.Final(ev->finish_reason, ev->text, ev->num_cached_tokens, ev->queue_seconds);
  return step;
}

grpc::Status GenerationServiceImpl::Tokenize(grpc::ServerContext* context,
                                             const tandem::v1::TokenizeRequest* request,
                                             tandem::v1::TokenizeResponse* response) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) return auth;
  if (absl::Status s = CheckNoUnknownFields(*request, ""); !s.ok())
    return services::ToGrpcStatus(s);
  const tokenizer::Tokenizer& tok = *options_.tokenizer;
  std::vector<int32_t> ids;
  switch (request->input_case()) {
    case tandem::v1::TokenizeRequest::kText: {
      if (request->text().size() > kMaxPromptBytes) {
        return services::ToGrpcStatus(absl::InvalidArgumentError(absl::StrFormat(
            "text: %d bytes, at most %d", request->text().size(), kMaxPromptBytes)));
      }
      ids = tok.Encode(request->text(), request->add_special(), /*parse_special=*/true);
      break;
    }
    case tandem::v1::TokenizeRequest::kMessages: {
      auto chat = EncodeChat(request->messages(), tok);
      if (!chat.ok()) return services::ToGrpcStatus(chat.status());
      ids = std::move(chat).value();
      break;
    }
    default:
      return services::ToGrpcStatus(absl::InvalidArgumentError("input: set one of text, messages"));
  }
  for (int32_t id : ids) {
    response->add_token_ids(id);
    response->add_pieces(SanitizeUtf8(tok.TokenToPiece(id)));
  }
  return grpc::Status::OK;
}

grpc::Status GenerationServiceImpl::GetModelInfo(grpc::ServerContext* context,
                                                 const tandem::v1::GetModelInfoRequest* request,
                                                 tandem::v1::ModelInfo* response) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) return auth;
  response->set_model_name(options_.model_name);
  response->set_architecture(options_.architecture);
  response->set_context_length(options_.limits.context_length);
  response->set_vocab_size(options_.limits.vocab_size);
  response->set_max_tokens_limit(options_.limits.max_tokens_limit);
  response->set_max_prompt_tokens(options_.limits.context_length - 1);
  response->set_max_stop_strings(static_cast<int32_t>(kMaxStopStrings));
  response->set_max_top_logprobs(kMaxTopLogprobs);
  response->set_kv_bytes_per_token(options_.kv_bytes_per_token);
  for (int32_t id = 0; id < options_.limits.vocab_size; ++id) {
    if (options_.tokenizer->IsEog(id)) response->add_eos_token_ids(id);
  }
  return grpc::Status::OK;
}

}  // namespace tandem::router
