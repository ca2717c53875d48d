#include "services/prefill/prefill_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"
#include "services/transfer/host_kv_transport.h"
#include "services/transfer/kv_push_pipe.h"
#include "services/transfer/nccl_kv_transport.h"

namespace tandem::prefill {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(10);

bool DeadlinePassed(grpc::ServerContext* context) {
  return context->deadline() <= std::chrono::system_clock::now();
}

// A failed push names the decode worker and, when the failure is the
// transport's or the receiver's going away, is ABORTED: the router then
// knows the prefill worker is fine and the decode side is the suspect.
grpc::Status TransferFailed(const absl::Status& s, const std::string& decode_address,
                            grpc::ServerContextBase* context) {
  const std::string message =
      absl::StrCat("kv transfer to decode worker ", decode_address, ": ", s.message());
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:  // the decode worker's KV is full: retry hint
      return services::ToGrpcStatus(absl::Status(s.code(), message), context);
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kCancelled:
      return services::ToGrpcStatus(absl::Status(s.code(), message));
    default:
      return grpc::Status(grpc::StatusCode::ABORTED, message);
  }
}

}  // namespace

PrefillServiceImpl::PrefillServiceImpl(services::WorkerRuntime* runtime,
                                       transfer::KvTransport* transport)
    : runtime_(runtime), transport_(transport) {}

grpc::Status PrefillServiceImpl::Prefill(grpc::ServerContext* context,
                                         const tandem::v1::PrefillRequest* request,
                                         grpc::ServerWriter<tandem::v1::PrefillResponse>* writer) {
  services::ActiveRpc active(&active_rpcs_);
  if (draining_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this prefill worker is draining (shutting down); retry on another");
  }
  engine::Engine& engine = runtime_->engine();
  metrics::TandemMetrics& m = runtime_->metrics();
  absl::StatusOr<engine::SamplingParams> params =
      services::FromProto(request->params(), engine.model().config().vocab_size);
  if (!params.ok()) return services::ToGrpcStatus(params.status());
  const bool push = !request->decode_address().empty();
  engine::EngineRequest req;
  req.request_id = request->request_id();
  req.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                              request->prompt_token_ids().end());
  req.params = *std::move(params);
  req.extra_key = request->params().cache_key();
  req.export_kv = true;
  req.stream_kv_export = push;
  req.prefix_output_token_ids.assign(request->prefix_output_token_ids().begin(),
                                     request->prefix_output_token_ids().end());
  // The handoff covers prompt + replayed outputs (the engine validates them).
  transfer::KvSendPlan plan;
  plan.token_ids = req.prompt_token_ids;
  plan.token_ids.insert(plan.token_ids.end(), req.prefix_output_token_ids.begin(),
                        req.prefix_output_token_ids.end());
  plan.bytes_per_token = engine.kv_bytes_per_token();
  absl::StatusOr<engine::RequestHandle> handle = engine.Submit(std::move(req));
  if (!handle.ok()) return services::ToGrpcStatus(handle.status(), context);

  // The push runs on its own thread from the first chunk on; this thread
  // forwards the first token the moment the engine samples it.
  transfer::KvPushPipe pipe(transport_,
                            transfer::KvTransferTarget{request->decode_address(),
                                                       request->kv_handle(),
                                                       request->request_id(), context},
                            runtime_->compat(), std::move(plan),
                            absl::FromChrono(context->deadline()));
  std::optional<engine::FinishEvent> finish;
  std::optional<absl::Time> first_sent;
  int64_t overlapped_bytes = 0;
  bool cancelled = false;
  auto cancel = [&] {
    if (cancelled) return;
    engine.Cancel(*handle);
    pipe.Cancel();
    cancelled = true;
  };
  while (!finish.has_value()) {
    if (context->IsCancelled()) cancel();
    // The push failed (the receiver refused it, or went away): stop computing.
    if (!cancelled && pipe.failed()) {
      engine.Cancel(*handle);
      break;
    }
    std::optional<engine::EngineEvent> ev = (*handle)->Next(kPoll);
    if (!ev.has_value()) continue;
    if (auto* chunk = std::get_if<engine::KvChunkEvent>(&*ev)) {
      if (!first_sent.has_value()) overlapped_bytes += static_cast<int64_t>(chunk->bytes.size());
      if (!cancelled) pipe.Push(std::move(chunk->bytes));
    } else if (auto* tok = std::get_if<engine::TokenEvent>(&*ev)) {
      // TTFT: the token leaves now, whatever the push is doing.
      tandem::v1::PrefillResponse first;
      first.set_first_token_id(tok->token_id);
      if (tok->logprobs.has_value()) {
        services::ToProto(*tok->logprobs, first.mutable_first_logprobs());
      }
      first.set_first_text(tok->text);
      first_sent = absl::Now();
      if (!cancelled && !writer->Write(first)) cancel();  // the router is gone
    } else {
      finish = std::move(std::get<engine::FinishEvent>(*ev));
    }
  }
  if (cancelled) {
    return DeadlinePassed(context)
               ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded in prefill")
               : grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled");
  }
  if (!finish.has_value()) {
    // The push failed mid-prefill; its error says why (the engine request
    // is cancelled; its finish event is not waited for).
    m.kv_transfer_failures->Inc();
    absl::StatusOr<transfer::KvSendResult> failed = pipe.Finish();
    return TransferFailed(failed.status(), request->decode_address(), context);
  }
  if (finish->reason == engine::RequestFinishReason::kError) {
    return services::ToGrpcStatus(finish->status);
  }
  const engine::Usage& usage = finish->usage;
  tandem::v1::PrefillResponse last;
  last.set_num_cached_tokens(static_cast<int32_t>(usage.num_cached_tokens));
  last.set_queue_seconds(usage.queue_time_s);
  if (!first_sent.has_value()) {
    // A migration replay whose delivered tokens already end the request.
    if (request->prefix_output_token_ids().empty()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "prefill finished without a token");
    }
    last.set_first_token_id(-1);
    last.set_finish_reason(services::ToProto(finish->reason));
    last.set_first_text(finish->text);
    writer->Write(last);
    return grpc::Status::OK;
  }
  m.request_queue_time->Observe(usage.queue_time_s);
  m.request_prefill_time->Observe(std::max(0.0, usage.ttft_s - usage.queue_time_s));
  m.prompt_tokens->Inc(static_cast<double>(usage.num_prompt_tokens));
  last.set_first_token_id(-1);  // the token went in the first message
  last.set_prefill_seconds(std::max(0.0, usage.ttft_s - usage.queue_time_s));
  if (!finish->kv_exported) {
    // The first token ended the request: nothing to hand over.
    pipe.Cancel();
    last.set_finish_reason(services::ToProto(finish->reason));
    last.set_first_text(finish->text);
    writer->Write(last);
    return grpc::Status::OK;
  }
  if (!push) {
    writer->Write(last);
    return grpc::Status::OK;
  }
  absl::StatusOr<transfer::KvSendResult> sent = pipe.Finish();
  if (!sent.ok()) {
    m.kv_transfer_failures->Inc();
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled during the transfer");
    }
    return TransferFailed(sent.status(), request->decode_address(), context);
  }
  const double after_first = absl::ToDoubleSeconds(absl::Now() - *first_sent);
  m.kv_transfer_time->Observe(sent->seconds);
  m.kv_transfer_bytes->Inc(static_cast<double>(sent->num_bytes));
  m.kv_transfer_after_first_token->Observe(after_first);
  m.kv_transfer_overlapped_bytes->Inc(static_cast<double>(overlapped_bytes));
  last.set_kv_landed(true);
  last.set_transfer_seconds(sent->seconds);
  last.set_kv_bytes(sent->num_bytes);
  last.set_after_first_token_seconds(after_first);
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status PrefillServiceImpl::GetStats(grpc::ServerContext* context,
                                          const tandem::v1::WorkerStatsRequest* request,
                                          tandem::v1::WorkerStats* response) {
  const engine::EngineStats s = runtime_->engine().Stats();
  response->set_role("prefill");
  response->set_num_running(static_cast<int32_t>(s.num_running));
  response->set_num_waiting(static_cast<int32_t>(s.num_waiting));
  response->set_num_blocks_used(s.num_blocks_used);
  response->set_num_blocks_total(s.num_blocks_total);
  response->set_prefix_cache_query_tokens(s.num_prefix_cache_query_tokens);
  response->set_prefix_cache_hit_tokens(s.num_prefix_cache_hit_tokens);
  response->set_num_preemptions(s.num_preemptions);
  response->set_num_steps(s.num_steps);
  *response->mutable_compat() = runtime_->compat();
  response->set_draining(draining_.load());
  response->set_num_active_rpcs(active_rpcs_.load());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<PrefillServer>> PrefillServer::Start(
    const services::WorkerServerConfig& config) {
  std::unique_ptr<PrefillServer> s(new PrefillServer());
  // Before the model load: --kv-transport=nccl without NCCL or a GPU fails fast.
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<transfer::NcclOps> nccl_ops,
                          transfer::NcclOpsForTransport(config.kv_transport, config.nccl_ops));
  TANDEM_ASSIGN_OR_RETURN(s->runtime_, services::WorkerRuntime::Create(config, "prefill"));
  TANDEM_ASSIGN_OR_RETURN(services::ChannelSecurity kv_security,
                          services::MakeChannelSecurity(config.tls));
  TANDEM_ASSIGN_OR_RETURN(s->transport_, transfer::MakeKvTransport(config.kv_transport,
                                                                   nccl_ops, kv_security));
  s->service_ = std::make_unique<PrefillServiceImpl>(s->runtime_.get(), s->transport_.get());
  services::WorkerRuntime* rt = s->runtime_.get();
  TANDEM_ASSIGN_OR_RETURN(
      s->host_,
      services::WorkerHost::Start(config, "prefill", "tandem.v1.PrefillWorker", s->service_.get(),
                                  rt, [rt] { rt->UpdateEngineMetrics(); }));
  return s;
}

PrefillServer::~PrefillServer() { Shutdown(); }

bool PrefillServer::Drain(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  service_->set_draining(true);
  host_->SetDraining();
  while (service_->active_rpcs() > 0) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void PrefillServer::Shutdown() {
  if (host_ != nullptr) host_->Shutdown();
  if (runtime_ != nullptr) runtime_->Shutdown();
}

}  // namespace tandem::prefill
