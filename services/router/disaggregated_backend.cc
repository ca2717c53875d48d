#include "services/router/disaggregated_backend.h"

#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"

namespace tandem::router {
namespace {

constexpr absl::Duration kWorkerRpcLimit = absl::Minutes(30);  // safety net only
constexpr absl::Duration kReleaseTimeout = absl::Seconds(2);

class DisaggregatedCall final : public BackendCall {
 public:
  DisaggregatedCall(PreparedRequest request, std::shared_ptr<CallQueue> queue,
                    std::shared_ptr<Worker> prefill, std::shared_ptr<Worker> decode,
                    std::string kv_handle)
      : request_(std::move(request)),
        queue_(std::move(queue)),
        prefill_(std::move(prefill)),
        decode_(std::move(decode)),
        kv_handle_(std::move(kv_handle)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~DisaggregatedCall() override {
    Cancel();
    thread_.join();
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }

 private:
  // Makes `ctx` the context Cancel() reaches; false when already cancelled.
  bool Arm(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu_);
    active_ = ctx;
    return !cancelled_;
  }
  void Disarm() {
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
  }
  bool cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  void Finish(tandem::v1::FinishReason reason, absl::Status status) {
    BackendEvent e;
    e.finished = true;
    e.finish_reason = reason;
    e.status = std::move(status);
    e.num_cached_tokens = num_cached_tokens_;
    e.queue_seconds = queue_seconds_;
    queue_->Push(std::move(e));
  }

  void ReleaseKv() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kReleaseTimeout));
    tandem::v1::ReleaseKvRequest req;
    req.set_kv_handle(kv_handle_);
    tandem::v1::ReleaseKvResponse resp;
    (void)decode_->decode->ReleaseKv(&ctx, req, &resp);  // best effort; the lease expires anyway
  }

  // Cancellation wins over the error it causes.
  void FinishError(const grpc::Status& s, const char* what) {
    if (cancelled() || s.error_code() == grpc::StatusCode::CANCELLED) {
      Finish(tandem::v1::FINISH_REASON_CANCELLED, absl::OkStatus());
      return;
    }
    absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
    // A worker that vanished is the client's UNAVAILABLE (retryable), not ours.
    if (code == absl::StatusCode::kDeadlineExceeded) code = absl::StatusCode::kUnavailable;
    Finish(tandem::v1::FINISH_REASON_UNSPECIFIED,
           absl::Status(code, absl::StrFormat("%s worker %s: %s", what,
                                              what[0] == 'p' ? prefill_->address : decode_->address,
                                              s.error_message())));
  }

  void Run() {
    tandem::v1::WorkerSamplingParams params;
    services::ToProto(request_.params, &params);
    params.set_cache_key(request_.cache_key);
    if (!request_.logprobs) params.set_top_logprobs(-1);

    // 1. Prefill, which pushes the KV to the decode worker.
    tandem::v1::PrefillResponse first;
    {
      tandem::v1::PrefillRequest req;
      req.set_request_id(request_.request_id);
      req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                          request_.prompt_token_ids.end());
      *req.mutable_params() = params;
      req.set_decode_address(decode_->address);
      req.set_kv_handle(kv_handle_);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcLimit));
      grpc::Status s = Arm(&ctx) ? prefill_->prefill->Prefill(&ctx, req, &first)
                                 : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      Disarm();
      WorkerPool::DonePrefill(*prefill_, static_cast<int64_t>(request_.prompt_token_ids.size()));
      if (!s.ok()) {
        ReleaseKv();
        WorkerPool::DoneDecode(*decode_);
        FinishError(s, "prefill");
        return;
      }
    }
    num_cached_tokens_ = first.num_cached_tokens();
    queue_seconds_ = first.queue_seconds();
    // 2. The first token goes to the client now: TTFT.
    {
      BackendEvent e;
      e.token_ids.push_back(first.first_token_id());
      e.text = first.first_text();
      if (request_.logprobs) e.logprobs.push_back(first.first_logprobs());
      queue_->Push(std::move(e));
    }
    if (first.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED || cancelled()) {
      ReleaseKv();
      WorkerPool::DoneDecode(*decode_);
      Finish(cancelled() ? tandem::v1::FINISH_REASON_CANCELLED : first.finish_reason(),
             absl::OkStatus());
      return;
    }
    // 3. Decode adopts the leased KV and streams the rest.
    tandem::v1::DecodeRequest req;
    req.set_request_id(request_.request_id);
    req.set_kv_handle(kv_handle_);
    req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                        request_.prompt_token_ids.end());
    req.set_first_token_id(first.first_token_id());
    *req.mutable_params() = params;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcLimit));
    tandem::v1::FinishReason reason = tandem::v1::FINISH_REASON_UNSPECIFIED;
    grpc::Status s;
    if (Arm(&ctx)) {
      auto reader = decode_->decode->Decode(&ctx, req);
      tandem::v1::DecodeResponse resp;
      while (reader->Read(&resp)) {
        if (resp.queue_seconds() > 0) queue_seconds_ += resp.queue_seconds();
        if (!resp.token_ids().empty() || !resp.text().empty()) {
          BackendEvent e;
          e.token_ids.assign(resp.token_ids().begin(), resp.token_ids().end());
          e.text = resp.text();
          e.logprobs.assign(resp.logprobs().begin(), resp.logprobs().end());
          queue_->Push(std::move(e));
        }
        if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
          reason = resp.finish_reason();
        }
      }
      s = reader->Finish();
    } else {
      s = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    Disarm();
    WorkerPool::DoneDecode(*decode_);
    if (s.ok() && reason != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      Finish(reason, absl::OkStatus());
      return;
    }
    ReleaseKv();
    if (s.ok())
      s = grpc::Status(grpc::StatusCode::INTERNAL, "stream ended without a finish reason");
    FinishError(s, "decode");
  }

  const PreparedRequest request_;
  const std::shared_ptr<CallQueue> queue_;
  const std::shared_ptr<Worker> prefill_;
  const std::shared_ptr<Worker> decode_;
  const std::string kv_handle_;
  int32_t num_cached_tokens_ = 0;  // call thread only
  double queue_seconds_ = 0;       // call thread only

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace

bool DisaggregatedBackend::Ready() const {
  return pool_->NumHealthy("prefill") > 0 && pool_->NumHealthy("decode") > 0;
}

absl::StatusOr<std::unique_ptr<BackendCall>> DisaggregatedBackend::Start(
    const PreparedRequest& request, std::shared_ptr<CallQueue> queue) {
  std::shared_ptr<Worker> decode = pool_->PickDecode();
  if (decode == nullptr) return absl::UnavailableError("no healthy decode worker");
  std::shared_ptr<Worker> prefill = pool_->PickPrefill(request.prompt_token_ids, request.cache_key);
  if (prefill == nullptr) {
    WorkerPool::DoneDecode(*decode);
    return absl::UnavailableError("no healthy prefill worker");
  }
  std::string handle = absl::StrFormat("%s/%d", request.request_id, next_handle_.fetch_add(1));
  return std::make_unique<DisaggregatedCall>(request, std::move(queue), std::move(prefill),
                                             std::move(decode), std::move(handle));
}

}  // namespace tandem::router
