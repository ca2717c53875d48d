#include "services/transfer/kv_push_pipe.h"

#include <utility>

namespace tandem::transfer {

KvPushPipe::KvPushPipe(KvTransport* transport, KvTransferTarget target,
                       tandem::v1::KvCompatibility compat, KvSendPlan plan, absl::Time deadline,
                       std::function<void()> on_done)
    : transport_(transport),
      target_(std::move(target)),
      compat_(std::move(compat)),
      plan_(std::move(plan)),
      deadline_(deadline),
      on_done_(std::move(on_done)),
      async_state_(std::make_shared<AsyncState>()) {
  async_state_->on_done = on_done_;
}

KvPushPipe::~KvPushPipe() {
  if (!finished_) Cancel();
  if (async_ != nullptr) {
    WaitAsyncDone();
    return;
  }
  if (!thread_.joinable()) return;
  // Destroyed from on_done, the thread's last act: nothing of the pipe is
  // touched after it.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool KvPushPipe::OpenAsync() {
  std::shared_ptr<AsyncState> state = async_state_;
  async_ = transport_->OpenAsync(
      target_, compat_, plan_, deadline_, [state](absl::StatusOr<KvSendResult> r) {
        if (!r.ok()) state->failed.store(true);
        std::function<void()> notify;
        {
          absl::MutexLock lock(&state->mu);
          state->result = std::move(r);
          state->callback_thread = std::this_thread::get_id();
          notify = state->on_done;
        }
        if (notify) notify();  // may destroy the pipe: only `state` is touched after it
        absl::MutexLock lock(&state->mu);
        state->callback_returned = true;
      });
  if (async_ == nullptr) return false;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
  }
  if (cancelled) async_->Cancel();
  return true;
}

void KvPushPipe::WaitAsyncDone() {
  AsyncState& s = *async_state_;
  absl::MutexLock lock(&s.mu);
  if (s.callback_thread == std::this_thread::get_id()) return;  // destroyed from on_done
  s.mu.Await(absl::Condition(&s.callback_returned));
}

void KvPushPipe::Push(std::string bytes) { Enqueue(Piece{std::move(bytes), nullptr}); }

void KvPushPipe::PushDevice(std::shared_ptr<const engine::KvDeviceBytes> piece) {
  Enqueue(Piece{std::string(), std::move(piece)});
}

void KvPushPipe::Enqueue(Piece piece) {
  if (failed()) return;
  if (!opened_) {
    opened_ = true;
    if (!OpenAsync()) thread_ = std::thread([this] { Run(); });
  }
  if (async_ != nullptr) {
    // The asynchronous streams (host transport) carry host bytes only.
    if (piece.device != nullptr) {
      async_state_->failed.store(true);
      async_->Cancel();
      return;
    }
    async_->Write(std::move(piece.bytes));
    return;
  }
  absl::MutexLock lock(&mu_);
  pieces_.push_back(std::move(piece));
}

absl::StatusOr<KvSendResult> KvPushPipe::Finish() {
  finished_ = true;
  if (async_ != nullptr) {
    async_->Close();
    AsyncState& s = *async_state_;
    absl::MutexLock lock(&s.mu);
    s.mu.Await(absl::Condition(&s.callback_returned));
    return *s.result;
  }
  if (!thread_.joinable()) {
    // Nothing was pushed (a zero-byte handoff cannot happen: >= 1 token).
    return absl::FailedPreconditionError("KV push: finish without any piece");
  }
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  return *std::move(result_);
}

bool KvPushPipe::Close() {
  finished_ = true;
  if (async_ != nullptr) {
    async_->Close();
    return true;
  }
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) {
    if (!result_.has_value()) {
      result_ = absl::FailedPreconditionError("KV push: finish without any piece");
    }
    return false;
  }
  closed_ = true;
  return true;
}

std::optional<absl::StatusOr<KvSendResult>> KvPushPipe::TryResult() {
  {
    absl::MutexLock lock(&async_state_->mu);
    if (async_state_->result.has_value()) return async_state_->result;
  }
  absl::MutexLock lock(&mu_);
  return result_;
}

void KvPushPipe::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    closed_ = true;
    if (stream_ != nullptr) stream_->Cancel();
  }
  if (async_ != nullptr) async_->Cancel();
}

void KvPushPipe::Run() {
  absl::StatusOr<std::unique_ptr<KvSendStream>> stream =
      transport_->Open(target_, compat_, plan_, deadline_);
  auto done = [&](absl::StatusOr<KvSendResult> r) {
    if (!r.ok()) async_state_->failed.store(true);
    {
      absl::MutexLock lock(&mu_);
      stream_ = nullptr;
      result_ = std::move(r);
    }
    if (on_done_) {
      const std::function<void()> notify = on_done_;  // a copy: on_done may destroy the pipe
      notify();
    }
  };
  if (!stream.ok()) {
    done(stream.status());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stream_ = stream->get();
    if (cancelled_) (*stream)->Cancel();
  }
  while (true) {
    Piece piece;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvPushPipe* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return !p->pieces_.empty() || p->closed_; },
          this));
      if (cancelled_) break;
      if (pieces_.empty()) break;  // closed and drained
      piece = std::move(pieces_.front());
      pieces_.pop_front();
    }
    absl::Status st = piece.device != nullptr ? (*stream)->WriteDevice(std::move(piece.device))
                                              : (*stream)->Write(piece.bytes);
    if (!st.ok()) {
      done(st);
      return;
    }
  }
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
  }
  if (cancelled) {
    done(absl::CancelledError("KV push cancelled"));
    return;  // the stream's destructor cancels the call
  }
  done((*stream)->Finish());
}

}  // namespace tandem::transfer
