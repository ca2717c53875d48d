#include "services/transfer/fake_nccl_ops.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::transfer {

struct FakeCommGroup {
  explicit FakeCommGroup(int n) : nranks(n) {}
  const int nranks;
  absl::Mutex mu;
  int joined ABSL_GUARDED_BY(mu) = 0;
  // (src, dst) -> messages in send order.
  std::map<std::pair<int, int>, std::deque<std::string>> channels ABSL_GUARDED_BY(mu);
};

static bool AllJoined(FakeCommGroup* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu) {
  return g->joined >= g->nranks;
}

struct FakeComm {
  std::shared_ptr<FakeCommGroup> group;
  int rank = 0;
  std::atomic<bool> aborted{false};
};

namespace {

struct FakeOp {
  enum Kind { kCopy, kSend, kRecv } kind = kCopy;
  FakeComm* comm = nullptr;
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
  int peer = 0;
  bool fail = false;
  bool hang = false;
};

struct FakeStream {
  absl::Mutex mu;
  std::deque<FakeOp> ops ABSL_GUARDED_BY(mu);
};

struct GroupState {
  int depth = 0;
  std::vector<std::pair<FakeStream*, FakeOp>> ops;
};
thread_local GroupState tl_group;

void Enqueue(FakeStream* s, FakeOp op) {
  absl::MutexLock lock(&s->mu);
  s->ops.push_back(op);
}

// Runs one op. DeadlineExceeded leaves it pending (a later wait may finish
// it); any other error is final.
absl::Status Run(const FakeOp& op, absl::Time deadline) {
  switch (op.kind) {
    case FakeOp::kCopy:
      std::memcpy(op.dst, op.src, op.bytes);
      return absl::OkStatus();
    case FakeOp::kSend: {
      FakeCommGroup* g = op.comm->group.get();
      if (op.comm->aborted.load()) return absl::UnavailableError("fake NCCL: communicator aborted");
      if (op.fail) return absl::InternalError("fake NCCL: injected send error (ncclSystemError)");
      if (op.hang) {
        absl::MutexLock lock(&g->mu);
        g->mu.AwaitWithDeadline(absl::Condition(
                                    +[](FakeComm* c) { return c->aborted.load(); }, op.comm),
                                deadline);
        if (op.comm->aborted.load())
          return absl::UnavailableError("fake NCCL: communicator aborted");
        return absl::DeadlineExceededError("fake NCCL: send did not complete");
      }
      absl::MutexLock lock(&g->mu);
      g->channels[{op.comm->rank, op.peer}].emplace_back(static_cast<const char*>(op.src),
                                                         static_cast<size_t>(op.bytes));
      return absl::OkStatus();
    }
    case FakeOp::kRecv: {
      FakeCommGroup* g = op.comm->group.get();
      if (op.comm->aborted.load()) return absl::UnavailableError("fake NCCL: communicator aborted");
      if (op.fail)
        return absl::InternalError("fake NCCL: injected receive error (ncclRemoteError)");
      absl::MutexLock lock(&g->mu);
      auto& ch = g->channels[{op.peer, op.comm->rank}];
      struct Arg {
        std::deque<std::string>* ch;
        FakeComm* comm;
      } arg{&ch, op.comm};
      g->mu.AwaitWithDeadline(
          absl::Condition(
              +[](Arg* a) { return !a->ch->empty() || a->comm->aborted.load(); }, &arg),
          deadline);
      if (op.comm->aborted.load()) return absl::UnavailableError("fake NCCL: communicator aborted");
      if (ch.empty()) return absl::DeadlineExceededError("fake NCCL: receive did not complete");
      std::string msg = std::move(ch.front());
      ch.pop_front();
      if (static_cast<int64_t>(msg.size()) != op.bytes) {
        return absl::InternalError(absl::StrCat("fake NCCL: message of ", msg.size(),
                                                " bytes for a receive of ", op.bytes));
      }
      std::memcpy(op.dst, msg.data(), msg.size());
      return absl::OkStatus();
    }
  }
  return absl::InternalError("fake NCCL: bad op");
}

}  // namespace

FakeNcclOps::FakeNcclOps(std::shared_ptr<FakeNcclFabric> fabric, std::string memory_domain)
    : fabric_(std::move(fabric)), memory_domain_(std::move(memory_domain)) {}

FakeNcclOps::~FakeNcclOps() {
  absl::MutexLock lock(&mu_);
  for (auto& [ptr, bytes] : device_allocs_) delete[] static_cast<char*>(ptr);
}

absl::StatusOr<NcclUniqueId> FakeNcclOps::GetUniqueId() {
  NcclUniqueId id{};
  absl::MutexLock lock(&fabric_->mu_);
  const std::string s = absl::StrCat("fake-nccl-id-", fabric_->next_id_++);
  std::memcpy(id.data(), s.data(), s.size());
  return id;
}

absl::StatusOr<NcclOps::Comm> FakeNcclOps::CommInitRank(const NcclUniqueId& id, int nranks,
                                                        int rank, absl::Time deadline,
                                                        const std::function<bool()>& cancelled) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError("fake NCCL: bad rank / nranks");
  }
  if (faults_.fail_init.load()) return absl::UnavailableError("fake NCCL: injected init error");
  if (faults_.hang_init.load()) {
    while (absl::Now() < deadline && !(cancelled && cancelled()))
      absl::SleepFor(absl::Milliseconds(5));
    return absl::DeadlineExceededError("fake NCCL: ncclCommInitRank timed out (injected)");
  }
  const std::string key(id.data(), id.size());
  std::shared_ptr<FakeCommGroup> group;
  {
    absl::MutexLock lock(&fabric_->mu_);
    auto& g = fabric_->pending_[key];
    if (g == nullptr) g = std::make_shared<FakeCommGroup>(nranks);
    if (g->nranks != nranks) return absl::InvalidArgumentError("fake NCCL: nranks mismatch");
    group = g;
  }
  bool ok = false;
  bool was_cancelled = false;
  {
    absl::MutexLock lock(&group->mu);
    ++group->joined;
    // Waits in slices so that `cancelled` is polled, like the CUDA ops do.
    while (true) {
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(10));
      ok = group->mu.AwaitWithDeadline(absl::Condition(&AllJoined, group.get()), slice);
      if (ok || absl::Now() >= deadline) break;
      if (cancelled && cancelled()) {
        was_cancelled = true;
        break;
      }
    }
    if (!ok) --group->joined;
  }
  {
    absl::MutexLock lock(&fabric_->mu_);
    auto it = fabric_->pending_.find(key);
    if (it != fabric_->pending_.end() && it->second == group) {
      absl::MutexLock glock(&group->mu);
      if (ok || group->joined == 0) fabric_->pending_.erase(it);
    }
  }
  if (was_cancelled) return absl::CancelledError("fake NCCL: ncclCommInitRank cancelled");
  if (!ok) {
    return absl::DeadlineExceededError(
        absl::StrCat("fake NCCL: ncclCommInitRank timed out waiting for ", nranks, " ranks"));
  }
  auto comm = std::make_unique<FakeComm>();
  comm->group = group;
  comm->rank = rank;
  Comm handle = comm.get();
  {
    absl::MutexLock lock(&mu_);
    comms_.push_back(std::move(comm));
  }
  ++num_inits_;
  return handle;
}

void FakeNcclOps::CommAbort(Comm comm) {
  if (comm == nullptr) return;
  auto* c = static_cast<FakeComm*>(comm);
  absl::MutexLock lock(&c->group->mu);  // wakes this rank's waiters
  if (!c->aborted.exchange(true)) ++num_aborts_;
}

absl::StatusOr<NcclOps::Stream> FakeNcclOps::StreamCreate() { return new FakeStream(); }

void FakeNcclOps::StreamDestroy(Stream stream) { delete static_cast<FakeStream*>(stream); }

absl::StatusOr<void*> FakeNcclOps::DeviceAlloc(int64_t bytes) {
  if (faults_.fail_alloc.load()) return absl::ResourceExhaustedError("fake CUDA: out of memory");
  char* p = new char[bytes];
  absl::MutexLock lock(&mu_);
  device_allocs_[p] = bytes;
  live_device_bytes_ += bytes;
  return p;
}

void FakeNcclOps::DeviceFree(void* ptr) {
  absl::MutexLock lock(&mu_);
  auto it = device_allocs_.find(ptr);
  if (it == device_allocs_.end()) return;
  live_device_bytes_ -= it->second;
  delete[] static_cast<char*>(ptr);
  device_allocs_.erase(it);
}

absl::StatusOr<void*> FakeNcclOps::HostAlloc(int64_t bytes) { return new char[bytes]; }

void FakeNcclOps::HostFree(void* ptr) { delete[] static_cast<char*>(ptr); }

absl::Status FakeNcclOps::CopyToDevice(void* dst, const void* src, int64_t bytes, Stream stream) {
  Enqueue(static_cast<FakeStream*>(stream), FakeOp{FakeOp::kCopy, nullptr, dst, src, bytes});
  return absl::OkStatus();
}

absl::Status FakeNcclOps::CopyToHost(void* dst, const void* src, int64_t bytes, Stream stream) {
  Enqueue(static_cast<FakeStream*>(stream), FakeOp{FakeOp::kCopy, nullptr, dst, src, bytes});
  return absl::OkStatus();
}

absl::Status FakeNcclOps::GroupStart() {
  ++tl_group.depth;
  return absl::OkStatus();
}

absl::Status FakeNcclOps::GroupEnd(Comm comm, absl::Time deadline) {
  if (tl_group.depth == 0) return absl::InternalError("fake NCCL: GroupEnd without GroupStart");
  if (--tl_group.depth > 0) return absl::OkStatus();
  // A group's operations progress together: enqueue its sends before its
  // receives, so a rank may send to itself within one group.
  std::vector<std::pair<FakeStream*, FakeOp>> ops = std::move(tl_group.ops);
  tl_group.ops.clear();
  for (auto& [s, op] : ops) {
    if (op.kind == FakeOp::kSend) Enqueue(s, op);
  }
  for (auto& [s, op] : ops) {
    if (op.kind != FakeOp::kSend) Enqueue(s, op);
  }
  return absl::OkStatus();
}

absl::Status FakeNcclOps::Send(Comm comm, const void* buf, int64_t bytes, int peer, Stream stream) {
  auto* c = static_cast<FakeComm*>(comm);
  if (c == nullptr || c->aborted.load())
    return absl::UnavailableError("fake NCCL: no communicator");
  if (peer < 0 || peer >= c->group->nranks)
    return absl::InvalidArgumentError("fake NCCL: bad peer");
  ++num_sends_;
  FakeOp op{FakeOp::kSend,           c, nullptr, buf, bytes, peer, faults_.fail_send.load(),
            faults_.hang_send.load()};
  if (tl_group.depth > 0) {
    tl_group.ops.emplace_back(static_cast<FakeStream*>(stream), op);
  } else {
    Enqueue(static_cast<FakeStream*>(stream), op);
  }
  return absl::OkStatus();
}

absl::Status FakeNcclOps::Recv(Comm comm, void* buf, int64_t bytes, int peer, Stream stream) {
  auto* c = static_cast<FakeComm*>(comm);
  if (c == nullptr || c->aborted.load())
    return absl::UnavailableError("fake NCCL: no communicator");
  if (peer < 0 || peer >= c->group->nranks)
    return absl::InvalidArgumentError("fake NCCL: bad peer");
  ++num_recvs_;
  FakeOp op{FakeOp::kRecv, c, buf, nullptr, bytes, peer, faults_.fail_recv.load(), false};
  if (tl_group.depth > 0) {
    tl_group.ops.emplace_back(static_cast<FakeStream*>(stream), op);
  } else {
    Enqueue(static_cast<FakeStream*>(stream), op);
  }
  return absl::OkStatus();
}

absl::Status FakeNcclOps::WaitStream(Comm comm, Stream stream, absl::Time deadline) {
  auto* s = static_cast<FakeStream*>(stream);
  while (true) {
    FakeOp op;
    {
      absl::MutexLock lock(&s->mu);
      if (s->ops.empty()) return absl::OkStatus();
      op = s->ops.front();
    }
    absl::Status st = Run(op, deadline);
    absl::MutexLock lock(&s->mu);
    if (st.ok()) {
      s->ops.pop_front();
      continue;
    }
    if (!absl::IsDeadlineExceeded(st)) s->ops.clear();
    return st;
  }
}

}  // namespace tandem::transfer
