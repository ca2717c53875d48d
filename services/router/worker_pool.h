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
// Every worker's KvCompatibility must describe the router's model (layers,
// KV heads, head dim) and all workers must agree on the compat hash; others
// are refused at Register and dropped at the poll.
//
// Thread safety: thread-safe; the poll runs on its own thread between
// Start() and Stop().
#ifndef TANDEM_SERVICES_ROUTER_WORKER_POOL_H_
#define TANDEM_SERVICES_ROUTER_WORKER_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
};

struct WorkerSnapshot {
  std::string role, address, metrics_address;
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
    size_t max_seen_blocks = 1 << 16;  // per prefill worker; cleared when full
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
  std::shared_ptr<Worker> PickPrefill(const std::vector<int32_t>& prompt, uint64_t cache_key);
  std::shared_ptr<Worker> PickDecode();
  static void DonePrefill(Worker& w, int64_t num_tokens);
  static void DoneDecode(Worker& w);

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
