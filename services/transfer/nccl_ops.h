// NcclOps: every NCCL and CUDA call the NCCL KV transport makes, behind one
// small interface, so that the transport's protocol, ordering, timeout and
// abort logic run (and are tested) without a GPU.
//
// Implementations:
//   - MakeCudaNcclOps (services/transfer/cuda/nccl_ops_cuda.cc, compiled only
//     when CUDA and NCCL are found): the real thing. Communicators are created
//     non-blocking (ncclConfig_t.blocking = 0) so that init, group end and
//     stream waits are bounded by a deadline (poll ncclCommGetAsyncError and
//     cudaStreamQuery); every call first selects the ops' device.
//   - FakeNcclOps (fake_nccl_ops.h): in-process loopback for the CPU tests.
//
// Handles (Comm, Stream, device pointers) are opaque to the callers. A Comm
// that returned an error must be aborted (CommAbort) and never used again.
//
// Thread safety: the ops object is thread-safe; one Comm (and its Stream) is
// used by one thread at a time (the transport serializes per pair).
#ifndef TANDEM_SERVICES_TRANSFER_NCCL_OPS_H_
#define TANDEM_SERVICES_TRANSFER_NCCL_OPS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::transfer {

inline constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using NcclUniqueId = std::array<char, kNcclUniqueIdBytes>;

class NcclOps {
 public:
  using Comm = void*;
  using Stream = void*;

  virtual ~NcclOps() = default;

  // "cuda" or "fake" (logs, errors).
  virtual std::string name() const = 0;
  // Where DeviceAlloc's memory lives, in engine::Executor::kv_memory_domain()
  // terms ("cuda:N"; the fake: "cpu" unless told otherwise). When it is the
  // workers' executor's, the KV goes from the prefill cache to the decode
  // cache through device memory only (docs/nccl.md, "GPU-resident handoff").
  virtual std::string memory_domain() const = 0;

  // ncclGetUniqueId (rank 0 only).
  virtual absl::StatusOr<NcclUniqueId> GetUniqueId() = 0;
  // ncclCommInitRank for `rank` of `nranks`; every rank must call it at the
  // same time with the same id. Returns when all ranks joined; on error, at
  // `deadline` or once `cancelled` (may be empty; polled) returns true, the
  // half-made communicator is aborted and DeadlineExceeded / Cancelled /
  // Unavailable returned.
  virtual absl::StatusOr<Comm> CommInitRank(const NcclUniqueId& id, int nranks, int rank,
                                            absl::Time deadline,
                                            const std::function<bool()>& cancelled) = 0;
  // ncclCommAbort: frees the communicator and aborts whatever is in flight on
  // it; never blocks on the peer. Null is a no-op.
  virtual void CommAbort(Comm comm) = 0;

  virtual absl::StatusOr<Stream> StreamCreate() = 0;  // a dedicated non-blocking stream
  virtual void StreamDestroy(Stream stream) = 0;      // null is a no-op

  virtual absl::StatusOr<void*> DeviceAlloc(int64_t bytes) = 0;
  virtual void DeviceFree(void* ptr) = 0;
  virtual absl::StatusOr<void*> HostAlloc(int64_t bytes) = 0;  // pinned host memory
  virtual void HostFree(void* ptr) = 0;

  // Stream-ordered copies (cudaMemcpyAsync).
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes, Stream stream) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes, Stream stream) = 0;

  // ncclGroupStart / ncclGroupEnd around Send / Recv. GroupEnd returns when
  // the group is enqueued on its streams (non-blocking comms: it polls the
  // communicator's state until `deadline`).
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd(Comm comm, absl::Time deadline) = 0;
  // ncclSend / ncclRecv of `bytes` bytes (ncclUint8) to / from `peer`.
  virtual absl::Status Send(Comm comm, const void* buf, int64_t bytes, int peer, Stream stream) = 0;
  virtual absl::Status Recv(Comm comm, void* buf, int64_t bytes, int peer, Stream stream) = 0;

  // Waits until everything enqueued on `stream` completed: polls
  // cudaStreamQuery and ncclCommGetAsyncError(comm). DeadlineExceeded at
  // `deadline`, Unavailable / Internal on an NCCL or CUDA error. The caller
  // then aborts the communicator.
  virtual absl::Status WaitStream(Comm comm, Stream stream, absl::Time deadline) = 0;
};

// True when this build carries the CUDA implementation.
bool NcclBuiltIn();

// The CUDA / NCCL implementation on device `device`. Unavailable with a clear
// message when the build has no NCCL or the machine has no such CUDA device.
absl::StatusOr<std::shared_ptr<NcclOps>> MakeCudaNcclOps(int device = 0);

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_NCCL_OPS_H_
