// WorkerHost: the gRPC server around one worker service, shared by the
// prefill and decode servers: listen (port 0 allowed), health
// (grpc.health.v1.Health with the service's name SERVING), reflection, a
// bounded sync thread pool, periodic WorkerRegistry.Register with the router
// (heartbeat), and a metrics refresher.
//
// Thread safety: Shutdown may be called from any thread; idempotent.
#ifndef TANDEM_SERVICES_COMMON_WORKER_HOST_H_
#define TANDEM_SERVICES_COMMON_WORKER_HOST_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server.h"
#include "services/common/worker_runtime.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::services {

// Counts an RPC in flight while in scope (a worker's drain waits for 0).
class ActiveRpc {
 public:
  explicit ActiveRpc(std::atomic<int>* n) : n_(n) { n_->fetch_add(1); }
  ~ActiveRpc() { n_->fetch_sub(1); }
  ActiveRpc(const ActiveRpc&) = delete;
  ActiveRpc& operator=(const ActiveRpc&) = delete;

 private:
  std::atomic<int>* n_;
};

// Blocks until *n is 0: the service's reactors, which outlive the gRPC
// server's Shutdown (an engine callback or a KV push thread may hold the last
// reference), have all ended, so the service and its transport can go. Call
// after the server and the engine are shut down (their calls are cancelled,
// so each remaining reference ends soon); logs every 10 s while it waits.
void WaitForRpcsToEnd(const std::atomic<int>& n, const std::string& role);

class WorkerHost {
 public:
  // service: not owned, outlives the host. role: "prefill" | "decode".
  // stats_fn: refreshed metrics every 250 ms (runs on the host's thread).
  static absl::StatusOr<std::unique_ptr<WorkerHost>> Start(
      const WorkerServerConfig& config, const std::string& role, const std::string& service_name,
      grpc::Service* service, WorkerRuntime* runtime, std::function<void()> stats_fn);
  ~WorkerHost();

  int port() const { return port_; }
  // The address announced to the router (advertise_address or host:port).
  const std::string& address() const { return address_; }
  // Drain starts: health NOT_SERVING and an immediate Register(draining)
  // to the router, so it stops routing here before its next health poll.
  // The server keeps serving the calls it gets. Idempotent.
  void SetDraining();
  // Health NOT_SERVING, stop heartbeats, then stop the server (in-flight
  // calls are cancelled after `grace`).
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  WorkerHost() = default;
  void Loop();

  WorkerServerConfig config_;
  std::string role_;
  std::string service_name_;
  WorkerRuntime* runtime_ = nullptr;
  std::function<void()> stats_fn_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool announce_ ABSL_GUARDED_BY(mu_) = false;  // register now (drain started)
  absl::CondVar cv_;
  std::thread thread_;
};

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_WORKER_HOST_H_
