// The router's view of its workers: who they are (static addresses from
// flags, or WorkerRegistry.Register calls), whether they are healthy (every
// health_interval: GetStats, and grpc.health.v1 Check must say SERVING;
// failure_threshold failures in a row -> unhealthy), their load, and the routing policy
// that picks one prefill and one decode worker per request.
//
// Policy (docs/architecture.md):
//  - prefill: least cost = uncached prompt tokens (prompt blocks this worker
//    has not seen, from the chained block hashes the router sent it) +
//    queued prefill tokens (GetStats) + prompt tokens the router sent it
//    that are still in flight.
//  - decode: most free KV blocks (total - used - in-flight requests'
//    reservations), then fewest running sequences.
//  - both: workers a request has already failed on (its `exclude` set) are
//    taken only when no other healthy worker is left.
// Failure detection: failure_threshold failed polls in a row, a call's
// ReportFailure (its RPC to the worker broke), or Register(draining) take a
// worker out of rotation at once; only the polls put it back. When the
// polls declare a worker failed, the calls watching it (Watch) are told, so
// a stream stuck on a hung worker is cut and migrated instead of waiting.
// Every worker's KvCompatibility must describe the router's model (layers,
// KV heads, head dim) and all workers must agree on the compat hash; others
// are refused at Register and dropped at the poll.
//
// Thread safety: thread-safe; the poll runs on its own thread between
// Start() and Stop().
#ifndef TANDEM_SERVICES_ROUTER_WORKER_POOL_H_
#define TANDEM_SERVICES_ROUTER_WORKER_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/tls.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct ExpectedModel {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// One worker; shared by the pool and the calls using it.
struct Worker {
  std::string role;  // "prefill" | "decode"
  std::string address;
  std::string metrics_address;
  int64_t pid = 0;  // from its registration (0: static, or not told)
  bool is_static = false;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<tandem::v1::PrefillWorker::Stub> prefill;  // role == prefill
  std::unique_ptr<tandem::v1::DecodeWorker::Stub> decode;    // role == decode

  absl::Mutex mu;
  tandem::v1::WorkerStats stats ABSL_GUARDED_BY(mu);
  bool healthy ABSL_GUARDED_BY(mu) = false;
  int consecutive_failures ABSL_GUARDED_BY(mu) = 0;
  int64_t inflight_tokens ABSL_GUARDED_BY(mu) = 0;    // prefill: prompt tokens sent, not done
  int64_t inflight_requests ABSL_GUARDED_BY(mu) = 0;  // decode: streams open
  absl::flat_hash_set<uint64_t> seen_blocks ABSL_GUARDED_BY(mu);  // chained block hashes
  // Calls to tell when the polls declare this worker failed (WorkerPool::Watch).
  absl::flat_hash_map<uint64_t, std::function<void()>> watchers ABSL_GUARDED_BY(mu);
  uint64_t next_watch_id ABSL_GUARDED_BY(mu) = 1;
};

// Workers a request must avoid if it can (it failed on them).
using WorkerSet = absl::flat_hash_set<const Worker*>;

struct WorkerSnapshot {
  std::string role, address, metrics_address;
  int64_t pid = 0;
  bool healthy = false;
  tandem::v1::WorkerStats stats;
};

class WorkerPool {
 public:
  struct Options {
    ExpectedModel model;
    absl::Duration health_interval = absl::Seconds(1);
    absl::Duration rpc_timeout = absl::Seconds(1);
    int failure_threshold = 3;  // consecutive failed polls -> unhealthy (registered: dropped)
    int max_workers = 256;
    size_t max_seen_blocks = 1 << 16;            // per prefill worker; cleared when full
    services::ChannelSecurity channel_security;  // TLS of the channels to workers
  };
  explicit WorkerPool(Options options);
  ~WorkerPool();  // Stop()

  // A worker from flags: kept (unhealthy) even when polls fail.
  absl::Status AddStatic(const std::string& role, const std::string& address);
  // WorkerRegistry.Register: InvalidArgument for a bad role/address,
  // FailedPrecondition for a KV compat mismatch, ResourceExhausted past
  // max_workers. Re-registering refreshes the entry.
  absl::Status Register(const tandem::v1::RegisterRequest& request);

  void Start();
  void Stop();
  // Polls every worker once now (tests, start-up).
  void PollOnce();

  // Chooses a worker and accounts the request to it; nullptr when none is
  // healthy. Call Done*() when the request leaves that worker.
  std::shared_ptr<Worker> PickPrefill(const std::vector<int32_t>& prompt, uint64_t cache_key,
                                      const WorkerSet& exclude = {});
  std::shared_ptr<Worker> PickDecode(const WorkerSet& exclude = {});
  // Decode workers: prompt tokens the router expects `w` to hold in its
  // prefix cache (leading full blocks whose hashes it sent there; an
  // estimate: the worker may have evicted them). NotePrompt records that the
  // prompt's K/V goes to `w` (handed over or computed there).
  int64_t CachedPromptTokens(Worker& w, const std::vector<int32_t>& prompt, uint64_t cache_key);
  void NotePrompt(Worker& w, const std::vector<int32_t>& prompt, uint64_t cache_key);
  static void DonePrefill(Worker& w, int64_t num_tokens);
  static void DoneDecode(Worker& w);

  // A call's RPC to `w` failed the way a dead or leaving worker fails: out
  // of rotation until a poll sees it answer again.
  static void ReportFailure(Worker& w);
  // `on_failure` runs (on the poll thread, under w.mu: it must not call
  // back into the pool or take w.mu) when the polls declare `w` failed;
  // Unwatch before the callback's captures die. Returns the watch id.
  static uint64_t Watch(Worker& w, std::function<void()> on_failure);
  static void Unwatch(Worker& w, uint64_t id);

  int NumHealthy(const std::string& role) const;
  std::vector<WorkerSnapshot> List() const;

 private:
  std::shared_ptr<Worker> MakeWorker(const std::string& role, const std::string& address);
  absl::Status CheckCompat(const tandem::v1::KvCompatibility& compat) ABSL_LOCKS_EXCLUDED(mu_);
  void PollLoop();
  void Poll(Worker& w);

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> compat_hash_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_WORKER_POOL_H_
