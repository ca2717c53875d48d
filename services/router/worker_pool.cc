#include "services/router/worker_pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/support/byte_buffer.h"

namespace tandem::router {
namespace {

constexpr int kDefaultBlockSize = 16;

// The engine's chained block hashes (engine/block_hash.h) of the prompt's
// full blocks, with the request's cache key as the extra key: the same
// values a worker's prefix cache computes for them, and block i matches only
// when blocks 0..i all match.
std::vector<uint64_t> BlockHashes(const std::vector<int32_t>& prompt, uint64_t cache_key,
                                  int block_size) {
  std::vector<uint64_t> out;
  engine::BlockHash h = engine::kRootBlockHash;
  for (size_t start = 0; start + block_size <= prompt.size(); start += block_size) {
    h = engine::HashBlockTokens(
        h, absl::MakeConstSpan(prompt).subspan(start, static_cast<size_t>(block_size)), cache_key);
    out.push_back(h);
  }
  return out;
}

// Leading blocks of a prompt (its chained hashes) the router has sent to `w`.
int64_t LeadingSeenBlocks(const Worker& w, const std::vector<uint64_t>& hashes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) {
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && w.seen_blocks.contains(hashes[n])) ++n;
  return n;
}

// Records that these blocks went to `w` (the set starts over when full).
void RememberBlocks(Worker& w, const std::vector<uint64_t>& hashes, size_t max_seen)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) {
  if (w.seen_blocks.size() + hashes.size() > max_seen) w.seen_blocks.clear();
  w.seen_blocks.insert(hashes.begin(), hashes.end());
}

// grpc.health.v1.Health/Check for the whole server (service ""), without
// the health protos: the request is empty and SERVING is `08 01`. OK(true)
// when SERVING, OK(false) otherwise; a worker without the health service
// (UNIMPLEMENTED) counts as serving (GetStats still gates it).
absl::StatusOr<bool> HealthCheck(grpc::Channel* channel, absl::Duration timeout) {
  static const grpc::internal::RpcMethod kMethod("/grpc.health.v1.Health/Check",
                                                 grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, kMethod, &ctx, request, &response);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return true;
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes == std::string("\x08\x01", 2);
}

bool ValidAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  return !address.empty() && address.size() <= 256 && colon != std::string::npos && colon > 0 &&
         colon + 1 < address.size();
}

}  // namespace

WorkerPool::WorkerPool(Options options) : options_(std::move(options)) {}

WorkerPool::~WorkerPool() { Stop(); }

std::shared_ptr<Worker> WorkerPool::MakeWorker(const std::string& role,
                                               const std::string& address) {
  auto w = std::make_shared<Worker>();
  w->role = role;
  w->address = address;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Each worker gets its own subchannel (not shared with other pools).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  w->channel = services::CreateChannel(address, options_.channel_security, args);
  if (role == "prefill") {
    w->prefill = tandem::v1::PrefillWorker::NewStub(w->channel);
  } else {
    w->decode = tandem::v1::DecodeWorker::NewStub(w->channel);
  }
  return w;
}

absl::Status WorkerPool::AddStatic(const std::string& role, const std::string& address) {
  if (role != "prefill" && role != "decode") {
    return absl::InvalidArgumentError(
        absl::StrFormat("role must be prefill or decode: '%s'", role));
  }
  if (!ValidAddress(address)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad %s address '%s' (want host:port)", role, address));
  }
  auto w = MakeWorker(role, address);
  w->is_static = true;
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(workers_.size()) >= options_.max_workers) {
    return absl::ResourceExhaustedError("too many workers");
  }
  workers_.push_back(std::move(w));
  return absl::OkStatus();
}

absl::Status WorkerPool::CheckCompat(const tandem::v1::KvCompatibility& compat) {
  const ExpectedModel& m = options_.model;
  if (compat.num_layers() != m.num_layers || compat.num_kv_heads() != m.num_kv_heads ||
      compat.head_dim() != m.head_dim) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "KV compatibility: worker serves %d layers x %d KV heads x %d head dim; the router's "
        "model has %d x %d x %d",
        compat.num_layers(), compat.num_kv_heads(), compat.head_dim(), m.num_layers, m.num_kv_heads,
        m.head_dim));
  }
  absl::MutexLock lock(&mu_);
  if (!compat_hash_.has_value()) compat_hash_ = compat.hash();
  if (*compat_hash_ != compat.hash()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "KV compatibility hash %016x differs from the other workers' %016x (model '%s')",
        compat.hash(), *compat_hash_, compat.model_name()));
  }
  return absl::OkStatus();
}

absl::Status WorkerPool::Register(const tandem::v1::RegisterRequest& request) {
  const std::string& role = request.role();
  if (role != "prefill" && role != "decode") {
    return absl::InvalidArgumentError(absl::StrFormat("role must be prefill or decode"));
  }
  if (!ValidAddress(request.address())) {
    return absl::InvalidArgumentError("address must be host:port");
  }
  if (request.metrics_address().size() > 256) {
    return absl::InvalidArgumentError("metrics_address too long");
  }
  if (absl::Status s = CheckCompat(request.compat()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->role == role && w->address == request.address()) {
      absl::MutexLock wl(&w->mu);
      w->metrics_address = request.metrics_address();
      w->pid = request.pid();
      if (request.draining()) {
        // Out of rotation now, not at the next poll; its streams go on.
        w->healthy = false;
        w->stats.set_draining(true);
      }
      return absl::OkStatus();
    }
  }
  if (request.draining()) return absl::OkStatus();  // leaving: nothing to add
  if (static_cast<int>(workers_.size()) >= options_.max_workers) {
    return absl::ResourceExhaustedError("too many workers registered");
  }
  auto w = MakeWorker(role, request.address());
  w->metrics_address = request.metrics_address();
  w->pid = request.pid();
  workers_.push_back(w);
  // Healthy only once a poll has seen it answer.
  return absl::OkStatus();
}

void WorkerPool::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { PollLoop(); });
}

void WorkerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void WorkerPool::PollLoop() {
  while (true) {
    PollOnce();
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.health_interval)) return;
  }
}

void WorkerPool::Poll(Worker& w) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  tandem::v1::WorkerStatsRequest req;
  tandem::v1::WorkerStats stats;
  grpc::Status s =
      w.prefill ? w.prefill->GetStats(&ctx, req, &stats) : w.decode->GetStats(&ctx, req, &stats);
  absl::Status compat = s.ok() ? CheckCompat(stats.compat()) : absl::OkStatus();
  absl::StatusOr<bool> serving = false;
  if (s.ok()) serving = HealthCheck(w.channel.get(), options_.rpc_timeout);
  absl::MutexLock lock(&w.mu);
  if (s.ok() && compat.ok() && stats.role() == w.role && serving.ok()) {
    w.stats = std::move(stats);
    // NOT_SERVING (draining) takes it out of rotation at once.
    w.healthy = !w.stats.draining() && *serving;
    w.consecutive_failures = 0;
  } else if (++w.consecutive_failures >= options_.failure_threshold || !compat.ok()) {
    w.healthy = false;
    // Declared failed: cut the streams still waiting on it (they migrate).
    for (auto& [id, on_failure] : w.watchers) on_failure();
  }
}

void WorkerPool::ReportFailure(Worker& w) {
  absl::MutexLock lock(&w.mu);
  w.healthy = false;
}

uint64_t WorkerPool::Watch(Worker& w, std::function<void()> on_failure) {
  absl::MutexLock lock(&w.mu);
  const uint64_t id = w.next_watch_id++;
  w.watchers.emplace(id, std::move(on_failure));
  return id;
}

void WorkerPool::Unwatch(Worker& w, uint64_t id) {
  absl::MutexLock lock(&w.mu);
  w.watchers.erase(id);
}

void WorkerPool::PollOnce() {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    workers = workers_;
  }
  for (const auto& w : workers) Poll(*w);
  // Registered workers that stopped answering are forgotten (they register
  // again when they come back); static ones stay, marked unhealthy.
  absl::MutexLock lock(&mu_);
  workers_.erase(std::remove_if(workers_.begin(), workers_.end(),
                                [&](const std::shared_ptr<Worker>& w) {
                                  absl::MutexLock wl(&w->mu);
                                  return !w->is_static &&
                                         w->consecutive_failures >= options_.failure_threshold;
                                }),
                 workers_.end());
}

std::shared_ptr<Worker> WorkerPool::PickPrefill(const std::vector<int32_t>& prompt,
                                                uint64_t cache_key, const WorkerSet& exclude) {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    workers = workers_;
  }
  std::shared_ptr<Worker> best;
  bool best_excluded = true;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  std::vector<uint64_t> hashes;
  for (const auto& w : workers) {
    if (w->role != "prefill") continue;
    absl::MutexLock lock(&w->mu);
    if (!w->healthy) continue;
    const bool excluded = exclude.contains(w.get());
    if (excluded && !best_excluded) continue;
    const int bs =
        w->stats.compat().block_size() > 0 ? w->stats.compat().block_size() : kDefaultBlockSize;
    if (hashes.empty()) hashes = BlockHashes(prompt, cache_key, bs);
    const int64_t cached_blocks = LeadingSeenBlocks(*w, hashes);
    const int64_t cost = static_cast<int64_t>(prompt.size()) - cached_blocks * bs +
                         w->stats.num_waiting_tokens() + w->inflight_tokens;
    if (cost < best_cost || (best_excluded && !excluded)) {
      best_cost = cost;
      best = w;
      best_excluded = excluded;
    }
  }
  if (best == nullptr) return nullptr;
  absl::MutexLock lock(&best->mu);
  best->inflight_tokens += static_cast<int64_t>(prompt.size());
  RememberBlocks(*best, hashes, options_.max_seen_blocks);
  return best;
}

std::shared_ptr<Worker> WorkerPool::PickDecode(const WorkerSet& exclude) {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    workers = workers_;
  }
  std::shared_ptr<Worker> best;
  bool best_excluded = true;
  int64_t best_free = std::numeric_limits<int64_t>::min();
  int64_t best_running = 0;
  for (const auto& w : workers) {
    if (w->role != "decode") continue;
    absl::MutexLock lock(&w->mu);
    if (!w->healthy) continue;
    const bool excluded = exclude.contains(w.get());
    if (excluded && !best_excluded) continue;
    // Requests sent since the last poll are not in its stats yet: count
    // each as one block so a burst spreads out.
    const int64_t free = w->stats.num_blocks_total() - w->stats.num_blocks_used() -
                         w->stats.num_leased_blocks() - w->inflight_requests;
    const int64_t running = w->stats.num_running() + w->inflight_requests;
    if (free > best_free || (free == best_free && running < best_running) ||
        (best_excluded && !excluded)) {
      best_free = free;
      best_running = running;
      best = w;
      best_excluded = excluded;
    }
  }
  if (best == nullptr) return nullptr;
  absl::MutexLock lock(&best->mu);
  ++best->inflight_requests;
  return best;
}

namespace {

int BlockSizeOf(const Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) {
  return w.stats.compat().block_size() > 0 ? w.stats.compat().block_size() : kDefaultBlockSize;
}

}  // namespace

int64_t WorkerPool::CachedPromptTokens(Worker& w, const std::vector<int32_t>& prompt,
                                       uint64_t cache_key) {
  absl::MutexLock lock(&w.mu);
  const int bs = BlockSizeOf(w);
  return LeadingSeenBlocks(w, BlockHashes(prompt, cache_key, bs)) * bs;
}

void WorkerPool::NotePrompt(Worker& w, const std::vector<int32_t>& prompt, uint64_t cache_key) {
  absl::MutexLock lock(&w.mu);
  RememberBlocks(w, BlockHashes(prompt, cache_key, BlockSizeOf(w)), options_.max_seen_blocks);
}

void WorkerPool::DonePrefill(Worker& w, int64_t num_tokens) {
  absl::MutexLock lock(&w.mu);
  w.inflight_tokens = std::max<int64_t>(0, w.inflight_tokens - num_tokens);
}

void WorkerPool::DoneDecode(Worker& w) {
  absl::MutexLock lock(&w.mu);
  w.inflight_requests = std::max<int64_t>(0, w.inflight_requests - 1);
}

int WorkerPool::NumHealthy(const std::string& role) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& w : workers_) {
    absl::MutexLock wl(&w->mu);
    n += w->role == role && w->healthy;
  }
  return n;
}

std::vector<WorkerSnapshot> WorkerPool::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerSnapshot> out;
  for (const auto& w : workers_) {
    absl::MutexLock wl(&w->mu);
    out.push_back({w->role, w->address, w->metrics_address, w->pid, w->healthy, w->stats});
  }
  return out;
}

}  // namespace tandem::router
