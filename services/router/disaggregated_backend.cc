#include "services/router/disaggregated_backend.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "grpcpp/support/client_callback.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace tandem::router {
namespace {

constexpr absl::Duration kWorkerRpcLimit = absl::Minutes(30);  // safety net only
constexpr absl::Duration kReleaseTimeout = absl::Seconds(1);

// What an attempt's failure means for the request.
enum class Failure {
  kNone,      // the attempt ended the request (finish event pushed)
  kPrefill,   // the prefill worker failed: run it elsewhere
  kTransfer,  // the push to the decode worker failed: decode side suspect
  kDecode,    // the decode stream broke: replay elsewhere
};

const char* FailureName(Failure f) {
  switch (f) {
    case Failure::kPrefill:
      return "prefill_failed";
    case Failure::kTransfer:
      return "transfer_failed";
    default:
      return "decode_failed";
  }
}

// Codes a failing worker produces (as opposed to the request's own errors,
// which end it): the connection broke, the worker is leaving or restarted,
// the stream was cut by its shutdown.
bool WorkerFault(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:  // not ours (checked first): the server cut it
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::NOT_FOUND:  // the lease vanished (expired / worker restarted)
      return true;
    default:
      return false;
  }
}

// One stream from a worker (Prefill or Decode) as a gRPC callback
// reader: each message and the end go to the call's functions on gRPC's
// callback threads; the reader deletes itself after its OnDone.
template <typename Request, typename Response>
class StreamReader final : public grpc::ClientReadReactor<Response> {
 public:
  using OnMessage = std::function<void(const Response&)>;
  using OnEnd = std::function<void(const grpc::Status&)>;
  StreamReader(Request request, OnMessage on_message, OnEnd on_end)
      : request_(std::move(request)),
        on_message_(std::move(on_message)),
        on_end_(std::move(on_end)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcLimit));
  }
  grpc::ClientContext* context() { return &context_; }
  const Request& request() const { return request_; }
  // Once the stub's async() method has bound the RPC to this reader.
  void Begin() {
    this->StartRead(&response_);
    this->StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    on_message_(response_);
    this->StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    OnEnd on_end = std::move(on_end_);
    on_end(status);  // the call lets go of context_ before anything else
    delete this;
  }

 private:
  grpc::ClientContext context_;
  const Request request_;
  Response response_;
  OnMessage on_message_;
  OnEnd on_end_;
};

using PrefillReader = StreamReader<tandem::v1::PrefillRequest, tandem::v1::PrefillResponse>;
using DecodeReader = StreamReader<tandem::v1::DecodeRequest, tandem::v1::DecodeResponse>;

// One request's state machine. Every step runs on a gRPC callback thread
// (or, for the first, the thread that called Start) when the previous one's
// RPC has ended: attempt = [Prefill stream] -> Decode stream, with an
// asynchronous ReleaseKv before the outcome on every path that does not end
// in a clean Decode finish, and a re-dispatch (Migrate) after a worker
// fault. Steps never overlap, so the request's state below needs no lock;
// only what Cancel() and the pool's watch reach (from other threads) is
// under mu_. The readers and ReleaseKv callbacks hold the call (shared_ptr)
// while they are in flight; when the last lets go the call is destroyed and
// tells LiveCalls.
class DisaggregatedCall final : public std::enable_shared_from_this<DisaggregatedCall> {
 public:
  DisaggregatedCall(PreparedRequest request, std::shared_ptr<CallQueue> queue, WorkerPool* pool,
                    const DisaggregatedBackend::Options& options, std::string handle_base,
                    std::shared_ptr<LiveCalls> live)
      : request_(std::move(request)),
        queue_(std::move(queue)),
        pool_(pool),
        options_(options),
        handle_base_(std::move(handle_base)),
        live_(std::move(live)) {
    live_->Add();
  }
  // The last step has ended (and let go of the call): the backend may go.
  ~DisaggregatedCall() { live_->Done(); }

  // Starts the first attempt. REQUIRES: owned by a shared_ptr.
  void Begin(std::shared_ptr<Worker> prefill, std::shared_ptr<Worker> decode) {
    services::ToProto(request_.params, &params_);
    params_.set_cache_key(request_.cache_key);
    if (!request_.logprobs) params_.set_top_logprobs(-1);
    prefill_ = std::move(prefill);
    decode_ = std::move(decode);
    StartAttempt();
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // gRPC 1.51's client reactions never run inline (can_inline = false), so
    // this cannot re-enter the call under mu_.
    if (active_ != nullptr) active_->TryCancel();
  }

 private:
  // Makes `ctx` the context Cancel() reaches (and the pool's watch cuts);
  // cancels it at once when the call already is. Before the RPC is bound: a
  // ClientContext cancelled before its call exists cancels the call at bind.
  void Arm(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu_);
    active_ = ctx;
    failed_worker_ = nullptr;
    if (cancelled_) ctx->TryCancel();
  }
  void Disarm() {
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
  }
  bool cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // The worker the pool declared failed during the RPC in flight, if any.
  const Worker* failed_worker() {
    absl::MutexLock lock(&mu_);
    return failed_worker_;
  }
  // The pool declared `w` (which the RPC in flight depends on) failed: cut
  // it. Runs on the poll thread under w.mu.
  void OnWorkerFailed(const Worker* w) {
    absl::MutexLock lock(&mu_);
    if (failed_worker_ == nullptr) failed_worker_ = w;
    if (active_ != nullptr) active_->TryCancel();
  }

  // Watches `w` until Unwatch(), for the RPC about to start. The watch's
  // callback holds `this` raw: Unwatch runs (under w.mu, so after any
  // callback in progress) before the RPC's step lets go of the call.
  void Watch(Worker& w) {
    watches_.emplace_back(&w, WorkerPool::Watch(w, [this, p = &w] { OnWorkerFailed(p); }));
  }
  void Unwatch() {
    for (auto& [w, id] : watches_) WorkerPool::Unwatch(*w, id);
    watches_.clear();
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

  void PushTokens(std::vector<int32_t> ids, std::string text,
                  std::vector<tandem::v1::PositionLogprobs> logprobs) {
    if (failed_at_.has_value() && !ids.empty()) {
      if (options_.metrics != nullptr) {
        options_.metrics->migration_recovery_time->Observe(
            absl::ToDoubleSeconds(absl::Now() - *failed_at_));
      }
      failed_at_.reset();
    }
    delivered_.insert(delivered_.end(), ids.begin(), ids.end());
    BackendEvent e;
    e.token_ids = std::move(ids);
    e.text = std::move(text);
    e.logprobs = std::move(logprobs);
    queue_->Push(std::move(e));
  }

  // DecodeWorker.ReleaseKv(handle) on `decode` when `release` (best effort:
  // the lease expires anyway), then `next`, on the RPC's callback thread.
  void ReleaseKvThen(bool release, const std::shared_ptr<Worker>& decode, const std::string& handle,
                     std::function<void()> next) {
    if (!release) {
      next();
      return;
    }
    struct Release {
      grpc::ClientContext context;
      tandem::v1::ReleaseKvRequest request;
      tandem::v1::ReleaseKvResponse response;
    };
    auto* r = new Release;
    r->context.set_deadline(absl::ToChronoTime(absl::Now() + kReleaseTimeout));
    r->request.set_kv_handle(handle);
    decode->decode->async()->ReleaseKv(&r->context, &r->request, &r->response,
                                       [r, decode, next = std::move(next)](const grpc::Status&) {
                                         delete r;
                                         next();
                                       });
  }

  // Ends the request with `s` (not a worker fault, or no retry left).
  void FinishError(const grpc::Status& s, const std::string& where) {
    absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
    // A worker that vanished is the client's UNAVAILABLE (retryable), not ours.
    if (code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kCancelled ||
        code == absl::StatusCode::kAborted || code == absl::StatusCode::kNotFound) {
      code = absl::StatusCode::kUnavailable;
    }
    Finish(tandem::v1::FINISH_REASON_UNSPECIFIED,
           absl::Status(code, absl::StrFormat("%s: %s", where, s.error_message())));
  }

  void FinishCancelled() { Finish(tandem::v1::FINISH_REASON_CANCELLED, absl::OkStatus()); }

  // One dispatch: prefill on prefill_ (null: decode-side prefill), decode on
  // decode_.
  void StartAttempt() {
    handle_ = prefill_ != nullptr ? absl::StrFormat("%s.%d", handle_base_, attempt_) : "";
    if (prefill_ != nullptr) {
      StartPrefill();
    } else {
      StartDecode();
    }
  }

  // 1. Prefill (prompt + delivered tokens), which pushes the KV to decode_.
  void StartPrefill() {
    tandem::v1::PrefillRequest req;
    req.set_request_id(request_.request_id);
    req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                        request_.prompt_token_ids.end());
    req.mutable_prefix_output_token_ids()->Add(delivered_.begin(), delivered_.end());
    *req.mutable_params() = params_;
    req.set_decode_address(decode_->address);
    req.set_kv_handle(handle_);
    early_finish_ = tandem::v1::FINISH_REASON_UNSPECIFIED;
    kv_landed_ = false;
    std::shared_ptr<DisaggregatedCall> self = shared_from_this();
    auto* reader = new PrefillReader(
        std::move(req), [this](const tandem::v1::PrefillResponse& msg) { OnPrefillMessage(msg); },
        [self](const grpc::Status& s) { self->OnPrefillEnd(s); });
    Arm(reader->context());
    // The push hangs on the decode worker too when that one hangs.
    Watch(*prefill_);
    Watch(*decode_);
    prefill_->prefill->async()->Prefill(reader->context(), &reader->request(), reader);
    reader->Begin();
  }

  void OnPrefillMessage(const tandem::v1::PrefillResponse& msg) {
    num_cached_tokens_ = std::max(num_cached_tokens_, msg.num_cached_tokens());
    queue_seconds_ += msg.queue_seconds();
    // 2. The first token goes to the client the moment it arrives (TTFT),
    // while the prefill worker still pushes the K/V.
    std::vector<tandem::v1::PositionLogprobs> lp;
    if (msg.first_token_id() >= 0 && request_.logprobs) lp.push_back(msg.first_logprobs());
    if (msg.first_token_id() >= 0) {
      PushTokens({msg.first_token_id()}, msg.first_text(), std::move(lp));
    } else if (!msg.first_text().empty()) {
      PushTokens({}, msg.first_text(), {});
    }
    if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      early_finish_ = msg.finish_reason();
    }
    kv_landed_ = kv_landed_ || msg.kv_landed();
  }

  void OnPrefillEnd(grpc::Status s) {
    Disarm();
    Unwatch();
    WorkerPool::DonePrefill(*prefill_, static_cast<int64_t>(request_.prompt_token_ids.size()));
    if (s.ok() && early_finish_ == tandem::v1::FINISH_REASON_UNSPECIFIED && !kv_landed_) {
      s = grpc::Status(grpc::StatusCode::INTERNAL, "prefill ended without its K/V landing");
    }
    std::shared_ptr<DisaggregatedCall> self = shared_from_this();
    if (!s.ok()) {
      const Worker* failed = failed_worker();
      // A hung decode worker would hold the release until its timeout.
      ReleaseKvThen(failed != decode_.get(), decode_, handle_,
                    [self, s, failed] { self->AfterPrefillFailed(s, failed); });
      return;
    }
    if (early_finish_ != tandem::v1::FINISH_REASON_UNSPECIFIED || cancelled()) {
      ReleaseKvThen(true, decode_, handle_, [self] {
        WorkerPool::DoneDecode(*self->decode_);
        if (self->cancelled()) {
          self->FinishCancelled();
        } else {
          self->Finish(self->early_finish_, absl::OkStatus());
        }
      });
      return;
    }
    StartDecode();
  }

  void AfterPrefillFailed(const grpc::Status& s, const Worker* failed) {
    WorkerPool::DoneDecode(*decode_);
    if (cancelled()) {
      FinishCancelled();
      return;
    }
    last_error_ = absl::StrFormat("prefill worker %s: %s", prefill_->address, s.error_message());
    if (failed == decode_.get()) {
      last_error_ = absl::StrFormat("decode worker %s missed its health checks during the push",
                                    decode_->address);
      Migrate(Failure::kTransfer);
      return;
    }
    if (s.error_code() == grpc::StatusCode::ABORTED) {  // the push failed
      WorkerPool::ReportFailure(*decode_);
      Migrate(Failure::kTransfer);
      return;
    }
    if (failed != nullptr || WorkerFault(s.error_code())) {
      WorkerPool::ReportFailure(*prefill_);
      Migrate(Failure::kPrefill);
      return;
    }
    FinishError(s, absl::StrFormat("prefill worker %s", prefill_->address));
  }

  // 3. Decode adopts the leased KV (or prefills here) and streams the rest.
  void StartDecode() {
    tandem::v1::DecodeRequest req;
    req.set_request_id(request_.request_id);
    req.set_kv_handle(handle_);
    req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                        request_.prompt_token_ids.end());
    req.mutable_prefix_output_token_ids()->Add(delivered_.begin(), delivered_.end());
    req.set_first_token_id(-1);
    *req.mutable_params() = params_;
    decode_reason_ = tandem::v1::FINISH_REASON_UNSPECIFIED;
    std::shared_ptr<DisaggregatedCall> self = shared_from_this();
    auto* reader = new DecodeReader(
        std::move(req), [this](const tandem::v1::DecodeResponse& resp) { OnDecodeMessage(resp); },
        [self](const grpc::Status& s) { self->OnDecodeEnd(s); });
    Arm(reader->context());
    Watch(*decode_);
    decode_->decode->async()->Decode(reader->context(), &reader->request(), reader);
    reader->Begin();
  }

  void OnDecodeMessage(const tandem::v1::DecodeResponse& resp) {
    if (resp.queue_seconds() > 0) queue_seconds_ += resp.queue_seconds();
    if (resp.num_cached_tokens() > 0 && prefill_ == nullptr) {
      num_cached_tokens_ = std::max(num_cached_tokens_, resp.num_cached_tokens());
    }
    if (!resp.token_ids().empty() || !resp.text().empty()) {
      PushTokens({resp.token_ids().begin(), resp.token_ids().end()}, resp.text(),
                 {resp.logprobs().begin(), resp.logprobs().end()});
    }
    if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      decode_reason_ = resp.finish_reason();
    }
  }

  void OnDecodeEnd(const grpc::Status& s) {
    Disarm();
    Unwatch();
    WorkerPool::DoneDecode(*decode_);
    if (s.ok() && decode_reason_ != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      Finish(decode_reason_, absl::OkStatus());
      return;
    }
    const bool failed = failed_worker() != nullptr;
    std::shared_ptr<DisaggregatedCall> self = shared_from_this();
    ReleaseKvThen(!handle_.empty() && !failed, decode_, handle_,
                  [self, s, failed] { self->AfterDecodeFailed(s, failed); });
  }

  void AfterDecodeFailed(grpc::Status s, bool failed) {
    if (cancelled()) {
      FinishCancelled();
      return;
    }
    if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "stream ended without a finish");
    last_error_ = absl::StrFormat("decode worker %s: %s", decode_->address, s.error_message());
    if (failed || WorkerFault(s.error_code())) {
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) WorkerPool::ReportFailure(*decode_);
      Migrate(Failure::kDecode);
      return;
    }
    FinishError(s, absl::StrFormat("decode worker %s", decode_->address));
  }

  // The attempt failed with `f`: re-dispatch elsewhere, or end the request.
  void Migrate(Failure f) {
    (f == Failure::kPrefill ? bad_prefill_ : bad_decode_)
        .insert(f == Failure::kPrefill ? prefill_.get() : decode_.get());
    if (attempt_ >= options_.migration_limit) {
      Finish(
          tandem::v1::FINISH_REASON_UNSPECIFIED,
          absl::UnavailableError(absl::StrFormat(
              "gave up after %d migrations (--migration-limit); last: %s", attempt_, last_error_)));
      return;
    }
    if (options_.metrics != nullptr) options_.metrics->Migrations(FailureName(f))->Inc();
    if (!failed_at_.has_value()) failed_at_ = absl::Now();
    decode_ = pool_->PickDecode(bad_decode_);
    if (decode_ == nullptr) {
      Finish(tandem::v1::FINISH_REASON_UNSPECIFIED,
             absl::UnavailableError(
                 absl::StrFormat("no healthy decode worker to migrate to; last: %s", last_error_)));
      return;
    }
    // Null: no prefill worker is healthy; the decode worker prefills.
    prefill_ = pool_->PickPrefill(request_.prompt_token_ids, request_.cache_key, bad_prefill_);
    pool_->NotePrompt(*decode_, request_.prompt_token_ids, request_.cache_key);
    const std::string via =
        prefill_ != nullptr
            ? absl::StrFormat("prefill %s + decode %s", prefill_->address, decode_->address)
            : absl::StrFormat("decode %s (decode-side prefill)", decode_->address);
    spdlog::warn("request {}: {}; migrating ({}/{}) to {}, {} tokens delivered",
                 request_.request_id, last_error_, attempt_ + 1, options_.migration_limit, via,
                 delivered_.size());
    ++attempt_;
    StartAttempt();
  }

  const PreparedRequest request_;
  const std::shared_ptr<CallQueue> queue_;
  WorkerPool* const pool_;
  const DisaggregatedBackend::Options options_;
  const std::string handle_base_;
  const std::shared_ptr<LiveCalls> live_;
  // The request's state: touched by one step at a time (see above).
  tandem::v1::WorkerSamplingParams params_;
  std::shared_ptr<Worker> prefill_;  // null: decode-side prefill
  std::shared_ptr<Worker> decode_;
  int attempt_ = 0;
  std::string handle_;  // this attempt's kv_handle ("" without a handoff)
  WorkerSet bad_prefill_, bad_decode_;
  std::vector<std::pair<Worker*, uint64_t>> watches_;  // the RPC in flight's
  tandem::v1::FinishReason early_finish_ = tandem::v1::FINISH_REASON_UNSPECIFIED;
  bool kv_landed_ = false;
  tandem::v1::FinishReason decode_reason_ = tandem::v1::FINISH_REASON_UNSPECIFIED;
  std::vector<int32_t> delivered_;  // tokens pushed to the client, in order
  std::string last_error_;
  std::optional<absl::Time> failed_at_;  // a failure not yet followed by a token
  int32_t num_cached_tokens_ = 0;
  double queue_seconds_ = 0;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  const Worker* failed_worker_ ABSL_GUARDED_BY(mu_) = nullptr;  // set by the pool's watch
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// What the router holds: destroying it cancels the call and returns at once
// (a gRPC reaction must not block); the call winds down (TryCancel,
// ReleaseKv) on gRPC's callback threads. It does not keep the call alive.
class DisaggregatedCallHandle final : public BackendCall {
 public:
  explicit DisaggregatedCallHandle(std::weak_ptr<DisaggregatedCall> call)
      : call_(std::move(call)) {}
  ~DisaggregatedCallHandle() override { Cancel(); }
  void Cancel() override {
    if (std::shared_ptr<DisaggregatedCall> call = call_.lock()) call->Cancel();
  }

 private:
  std::weak_ptr<DisaggregatedCall> call_;
};

}  // namespace

void LiveCalls::Add() {
  absl::MutexLock lock(&mu_);
  ++n_;
}

void LiveCalls::Done() {
  absl::MutexLock lock(&mu_);
  --n_;
}

void LiveCalls::WaitNone() {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ == 0; };
  mu_.Await(absl::Condition(&none));
}

DisaggregatedBackend::~DisaggregatedBackend() { live_->WaitNone(); }

bool DisaggregatedBackend::Ready() const {
  // Decode workers can prefill themselves; a prefill worker alone cannot serve.
  return pool_->NumHealthy("decode") > 0;
}

absl::StatusOr<std::unique_ptr<BackendCall>> DisaggregatedBackend::Start(
    const PreparedRequest& request, std::shared_ptr<CallQueue> queue) {
  std::shared_ptr<Worker> decode = pool_->PickDecode();
  if (decode == nullptr) return absl::UnavailableError("no healthy decode worker");
  // The pd-decider: a handoff pays off only for enough tokens the decode
  // worker would otherwise compute itself.
  const int64_t uncached =
      static_cast<int64_t>(request.prompt_token_ids.size()) -
      pool_->CachedPromptTokens(*decode, request.prompt_token_ids, request.cache_key);
  std::shared_ptr<Worker> prefill;
  if (uncached >= options_.remote_prefill_min_tokens) {
    // Null when no prefill worker is healthy: the decode worker prefills.
    prefill = pool_->PickPrefill(request.prompt_token_ids, request.cache_key);
  }
  pool_->NotePrompt(*decode, request.prompt_token_ids, request.cache_key);
  if (options_.metrics != nullptr) {
    options_.metrics->PrefillDecisions(prefill != nullptr ? "remote" : "local")->Inc();
  }
  std::string handle = absl::StrFormat("%s/%d", request.request_id, next_handle_.fetch_add(1));
  auto call = std::make_shared<DisaggregatedCall>(request, std::move(queue), pool_, options_,
                                                  std::move(handle), live_);
  call->Begin(std::move(prefill), std::move(decode));
  return std::make_unique<DisaggregatedCallHandle>(call);
}

}  // namespace tandem::router
