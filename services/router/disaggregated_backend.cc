#include "services/router/disaggregated_backend.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
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

class DisaggregatedCall final {
 public:
  DisaggregatedCall(PreparedRequest request, std::shared_ptr<CallQueue> queue, WorkerPool* pool,
                    const DisaggregatedBackend::Options& options, std::string handle_base)
      : request_(std::move(request)),
        queue_(std::move(queue)),
        pool_(pool),
        options_(options),
        handle_base_(std::move(handle_base)) {}

  // Runs `call` on a thread of its own that owns it (a reference) until the
  // call has ended, ReleaseKv included; `live` counts it meanwhile.
  static void Launch(std::shared_ptr<DisaggregatedCall> call, std::shared_ptr<Worker> prefill,
                     std::shared_ptr<Worker> decode, std::shared_ptr<LiveCalls> live) {
    live->Add();
    std::thread([call = std::move(call), p = std::move(prefill), d = std::move(decode),
                 live = std::move(live)]() mutable {
      std::shared_ptr<DisaggregatedCall> self = std::move(call);
      self->Run(std::move(p), std::move(d));
      self.reset();  // the call is gone before the backend may be
      live->Done();
    }).detach();
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }

 private:
  // Makes `ctx` the context Cancel() reaches; false when already cancelled.
  bool Arm(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu_);
    active_ = ctx;
    failed_worker_ = nullptr;
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
  // The worker the pool declared failed during the RPC in flight, if any.
  const Worker* failed_worker() {
    absl::MutexLock lock(&mu_);
    return failed_worker_;
  }
  // The pool declared `w` (which the RPC in flight depends on) failed: cut it.
  void OnWorkerFailed(const Worker* w) {
    absl::MutexLock lock(&mu_);
    if (failed_worker_ == nullptr) failed_worker_ = w;
    if (active_ != nullptr) active_->TryCancel();
  }

  // Watches `w` for the duration of one RPC.
  class WatchScope {
   public:
    WatchScope(DisaggregatedCall* call, Worker& w)
        : w_(w), id_(WorkerPool::Watch(w, [call, p = &w] { call->OnWorkerFailed(p); })) {}
    ~WatchScope() { WorkerPool::Unwatch(w_, id_); }

   private:
    Worker& w_;
    const uint64_t id_;
  };

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

  static void ReleaseKv(Worker& decode, const std::string& handle) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kReleaseTimeout));
    tandem::v1::ReleaseKvRequest req;
    req.set_kv_handle(handle);
    tandem::v1::ReleaseKvResponse resp;
    (void)decode.decode->ReleaseKv(&ctx, req, &resp);  // best effort; the lease expires anyway
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

  // One dispatch: prefill on `prefill` (null: decode-side prefill), decode
  // on `decode`. Returns kNone when the request ended (its finish pushed),
  // else what failed; `last_error` describes it.
  Failure Attempt(const std::shared_ptr<Worker>& prefill, const std::shared_ptr<Worker>& decode,
                  const tandem::v1::WorkerSamplingParams& params, int attempt) {
    const std::string handle =
        prefill != nullptr ? absl::StrFormat("%s.%d", handle_base_, attempt) : "";
    // 1. Prefill (prompt + delivered tokens), which pushes the KV to `decode`.
    if (prefill != nullptr) {
      tandem::v1::PrefillRequest req;
      req.set_request_id(request_.request_id);
      req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                          request_.prompt_token_ids.end());
      req.mutable_prefix_output_token_ids()->Add(delivered_.begin(), delivered_.end());
      *req.mutable_params() = params;
      req.set_decode_address(decode->address);
      req.set_kv_handle(handle);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcLimit));
      grpc::Status s;
      tandem::v1::FinishReason early_finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
      bool kv_landed = false;
      {
        // The push hangs on the decode worker too when that one hangs.
        WatchScope watch_prefill(this, *prefill);
        WatchScope watch_decode(this, *decode);
        if (Arm(&ctx)) {
          auto reader = prefill->prefill->Prefill(&ctx, req);
          tandem::v1::PrefillResponse msg;
          while (reader->Read(&msg)) {
            num_cached_tokens_ = std::max(num_cached_tokens_, msg.num_cached_tokens());
            queue_seconds_ += msg.queue_seconds();
            // 2. The first token goes to the client the moment it arrives
            // (TTFT), while the prefill worker still pushes the K/V.
            std::vector<tandem::v1::PositionLogprobs> lp;
            if (msg.first_token_id() >= 0 && request_.logprobs) lp.push_back(msg.first_logprobs());
            if (msg.first_token_id() >= 0) {
              PushTokens({msg.first_token_id()}, msg.first_text(), std::move(lp));
            } else if (!msg.first_text().empty()) {
              PushTokens({}, msg.first_text(), {});
            }
            if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
              early_finish = msg.finish_reason();
            }
            kv_landed = kv_landed || msg.kv_landed();
          }
          s = reader->Finish();
        } else {
          s = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        }
      }
      Disarm();
      WorkerPool::DonePrefill(*prefill, static_cast<int64_t>(request_.prompt_token_ids.size()));
      if (s.ok() && early_finish == tandem::v1::FINISH_REASON_UNSPECIFIED && !kv_landed) {
        s = grpc::Status(grpc::StatusCode::INTERNAL, "prefill ended without its K/V landing");
      }
      if (!s.ok()) {
        const Worker* failed = failed_worker();
        if (failed != decode.get()) ReleaseKv(*decode, handle);  // a hung one would stall us
        WorkerPool::DoneDecode(*decode);
        if (cancelled()) {
          FinishCancelled();
          return Failure::kNone;
        }
        last_error_ = absl::StrFormat("prefill worker %s: %s", prefill->address, s.error_message());
        if (failed == decode.get()) {
          last_error_ = absl::StrFormat("decode worker %s missed its health checks during the push",
                                        decode->address);
          return Failure::kTransfer;
        }
        if (s.error_code() == grpc::StatusCode::ABORTED) {  // the push failed
          WorkerPool::ReportFailure(*decode);
          return Failure::kTransfer;
        }
        if (failed != nullptr || WorkerFault(s.error_code())) {
          WorkerPool::ReportFailure(*prefill);
          return Failure::kPrefill;
        }
        FinishError(s, absl::StrFormat("prefill worker %s", prefill->address));
        return Failure::kNone;
      }
      if (early_finish != tandem::v1::FINISH_REASON_UNSPECIFIED || cancelled()) {
        ReleaseKv(*decode, handle);
        WorkerPool::DoneDecode(*decode);
        if (cancelled()) {
          FinishCancelled();
        } else {
          Finish(early_finish, absl::OkStatus());
        }
        return Failure::kNone;
      }
    }
    // 3. Decode adopts the leased KV (or prefills here) and streams the rest.
    tandem::v1::DecodeRequest req;
    req.set_request_id(request_.request_id);
    req.set_kv_handle(handle);
    req.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                        request_.prompt_token_ids.end());
    req.mutable_prefix_output_token_ids()->Add(delivered_.begin(), delivered_.end());
    req.set_first_token_id(-1);
    *req.mutable_params() = params;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcLimit));
    tandem::v1::FinishReason reason = tandem::v1::FINISH_REASON_UNSPECIFIED;
    grpc::Status s;
    {
      WatchScope watch(this, *decode);
      if (Arm(&ctx)) {
        auto reader = decode->decode->Decode(&ctx, req);
        tandem::v1::DecodeResponse resp;
        while (reader->Read(&resp)) {
          if (resp.queue_seconds() > 0) queue_seconds_ += resp.queue_seconds();
          if (resp.num_cached_tokens() > 0 && prefill == nullptr) {
            num_cached_tokens_ = std::max(num_cached_tokens_, resp.num_cached_tokens());
          }
          if (!resp.token_ids().empty() || !resp.text().empty()) {
            PushTokens({resp.token_ids().begin(), resp.token_ids().end()}, resp.text(),
                       {resp.logprobs().begin(), resp.logprobs().end()});
          }
          if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
            reason = resp.finish_reason();
          }
        }
        s = reader->Finish();
      } else {
        s = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
    }
    Disarm();
    WorkerPool::DoneDecode(*decode);
    if (s.ok() && reason != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      Finish(reason, absl::OkStatus());
      return Failure::kNone;
    }
    const bool failed = failed_worker() != nullptr;
    if (!handle.empty() && !failed) ReleaseKv(*decode, handle);
    if (cancelled()) {
      FinishCancelled();
      return Failure::kNone;
    }
    if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "stream ended without a finish");
    last_error_ = absl::StrFormat("decode worker %s: %s", decode->address, s.error_message());
    if (failed || WorkerFault(s.error_code())) {
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) WorkerPool::ReportFailure(*decode);
      return Failure::kDecode;
    }
    FinishError(s, absl::StrFormat("decode worker %s", decode->address));
    return Failure::kNone;
  }

  void Run(std::shared_ptr<Worker> prefill, std::shared_ptr<Worker> decode) {
    tandem::v1::WorkerSamplingParams params;
    services::ToProto(request_.params, &params);
    params.set_cache_key(request_.cache_key);
    if (!request_.logprobs) params.set_top_logprobs(-1);

    WorkerSet bad_prefill, bad_decode;
    for (int attempt = 0;; ++attempt) {
      const Failure f = Attempt(prefill, decode, params, attempt);
      if (f == Failure::kNone) return;
      (f == Failure::kPrefill ? bad_prefill : bad_decode)
          .insert(f == Failure::kPrefill ? prefill.get() : decode.get());
      if (attempt >= options_.migration_limit) {
        Finish(tandem::v1::FINISH_REASON_UNSPECIFIED,
               absl::UnavailableError(
                   absl::StrFormat("gave up after %d migrations (--migration-limit); last: %s",
                                   attempt, last_error_)));
        return;
      }
      if (options_.metrics != nullptr) options_.metrics->Migrations(FailureName(f))->Inc();
      if (!failed_at_.has_value()) failed_at_ = absl::Now();
      decode = pool_->PickDecode(bad_decode);
      if (decode == nullptr) {
        Finish(tandem::v1::FINISH_REASON_UNSPECIFIED,
               absl::UnavailableError(absl::StrFormat(
                   "no healthy decode worker to migrate to; last: %s", last_error_)));
        return;
      }
      // Null: no prefill worker is healthy; the decode worker prefills.
      prefill = pool_->PickPrefill(request_.prompt_token_ids, request_.cache_key, bad_prefill);
      pool_->NotePrompt(*decode, request_.prompt_token_ids, request_.cache_key);
      const std::string via =
          prefill != nullptr
              ? absl::StrFormat("prefill %s + decode %s", prefill->address, decode->address)
              : absl::StrFormat("decode %s (decode-side prefill)", decode->address);
      spdlog::warn("request {}: {}; migrating ({}/{}) to {}, {} tokens delivered",
                   request_.request_id, last_error_, attempt + 1, options_.migration_limit, via,
                   delivered_.size());
    }
  }

  const PreparedRequest request_;
  const std::shared_ptr<CallQueue> queue_;
  WorkerPool* const pool_;
  const DisaggregatedBackend::Options options_;
  const std::string handle_base_;
  // Call thread only.
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
// (a gRPC reaction must not block); the call's thread winds down (TryCancel,
// ReleaseKv) on its own.
class DisaggregatedCallHandle final : public BackendCall {
 public:
  explicit DisaggregatedCallHandle(std::shared_ptr<DisaggregatedCall> call)
      : call_(std::move(call)) {}
  ~DisaggregatedCallHandle() override { call_->Cancel(); }
  void Cancel() override { call_->Cancel(); }

 private:
  std::shared_ptr<DisaggregatedCall> call_;
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
                                                  std::move(handle));
  DisaggregatedCall::Launch(call, std::move(prefill), std::move(decode), live_);
  return std::make_unique<DisaggregatedCallHandle>(std::move(call));
}

}  // namespace tandem::router
