// FakeNcclOps: an in-process NcclOps for the CPU tests (and a GPU-free
// loopback). "Device" memory is host memory; a stream is a queue of
// operations run in order by WaitStream; ranks of one communicator (made by
// CommInitRank with the same unique id, possibly from two FakeNcclOps of one
// FakeNcclFabric, i.e. a prefill and a decode worker in one test process)
// exchange bytes through per-(src, dst) channels. Like NCCL:
//   - CommInitRank returns only when all ranks joined (so a sender that does
//     not run its init concurrently with the peer's times out);
//   - the Sends and Recvs of one group progress together (a rank may send to
//     itself inside one group), a Recv completes when the matching Send's
//     bytes arrived and fails when the sizes differ;
//   - CommAbort affects only the local rank: the peer's pending Recv keeps
//     waiting until its own deadline (nothing tells it).
// Faults (per ops object) make init, sends or receives fail or hang.
//
// Thread safety: thread-safe (groups are per thread, like NCCL's).
#ifndef TANDEM_SERVICES_TRANSFER_FAKE_NCCL_OPS_H_
#define TANDEM_SERVICES_TRANSFER_FAKE_NCCL_OPS_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "services/transfer/nccl_ops.h"

namespace tandem::transfer {

struct FakeCommGroup;
struct FakeComm;

// The "network" the fake ranks share.
class FakeNcclFabric {
 public:
  FakeNcclFabric() = default;

 private:
  friend class FakeNcclOps;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, std::shared_ptr<FakeCommGroup>> pending_ ABSL_GUARDED_BY(mu_);
};

struct FakeNcclFaults {
  std::atomic<bool> fail_init{false};   // CommInitRank -> Unavailable
  std::atomic<bool> hang_init{false};   // CommInitRank never joins -> deadline
  std::atomic<bool> fail_send{false};   // a Send fails when it runs (async error)
  std::atomic<bool> hang_send{false};   // a Send never completes -> deadline
  std::atomic<bool> fail_recv{false};   // a Recv fails when it runs
  std::atomic<bool> fail_alloc{false};  // DeviceAlloc -> ResourceExhausted
};

class FakeNcclOps final : public NcclOps {
 public:
  // memory_domain: what memory_domain() says. Its "device" memory is host
  // memory whatever it says: "cpu" (the default) lets the CPU executors use
  // it directly, anything else makes the transport stage through the host.
  explicit FakeNcclOps(std::shared_ptr<FakeNcclFabric> fabric, std::string memory_domain = "cpu");
  ~FakeNcclOps() override;

  FakeNcclFaults& faults() { return faults_; }
  int num_inits() const { return num_inits_.load(); }    // communicators made
  int num_aborts() const { return num_aborts_.load(); }  // CommAbort calls on live comms
  int num_live_comms() const { return num_inits_.load() - num_aborts_.load(); }
  int64_t num_sends() const { return num_sends_.load(); }  // Send calls
  int64_t num_recvs() const { return num_recvs_.load(); }  // Recv calls
  int64_t live_device_bytes() const { return live_device_bytes_.load(); }

  std::string name() const override { return "fake"; }
  std::string memory_domain() const override { return memory_domain_; }
  absl::StatusOr<NcclUniqueId> GetUniqueId() override;
  absl::StatusOr<Comm> CommInitRank(const NcclUniqueId& id, int nranks, int rank,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled) override;
  void CommAbort(Comm comm) override;
  absl::StatusOr<Stream> StreamCreate() override;
  void StreamDestroy(Stream stream) override;
  absl::StatusOr<void*> DeviceAlloc(int64_t bytes) override;
  void DeviceFree(void* ptr) override;
  absl::StatusOr<void*> HostAlloc(int64_t bytes) override;
  void HostFree(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes, Stream stream) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes, Stream stream) override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd(Comm comm, absl::Time deadline) override;
  absl::Status Send(Comm comm, const void* buf, int64_t bytes, int peer, Stream stream) override;
  absl::Status Recv(Comm comm, void* buf, int64_t bytes, int peer, Stream stream) override;
  absl::Status WaitStream(Comm comm, Stream stream, absl::Time deadline) override;

 private:
  std::shared_ptr<FakeNcclFabric> fabric_;
  const std::string memory_domain_;
  FakeNcclFaults faults_;
  std::atomic<int> num_inits_{0};
  std::atomic<int> num_aborts_{0};
  std::atomic<int64_t> num_sends_{0};
  std::atomic<int64_t> num_recvs_{0};
  std::atomic<int64_t> live_device_bytes_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<void*, int64_t> device_allocs_ ABSL_GUARDED_BY(mu_);
  // Aborted communicators stay allocated until the ops die (a thread may
  // still be polling one).
  std::vector<std::unique_ptr<FakeComm>> comms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_FAKE_NCCL_OPS_H_
