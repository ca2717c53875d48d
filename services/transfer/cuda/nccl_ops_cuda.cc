// NcclOps on CUDA + NCCL (compiled only when both are found; host C++, no
// nvcc needed). Communicators are non-blocking (ncclConfig_t.blocking = 0):
// init, group end and stream waits poll ncclCommGetAsyncError /
// cudaStreamQuery until done, an error or the caller's deadline, so nothing
// here blocks forever on a dead peer; the caller then calls CommAbort.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "services/transfer/nccl_ops.h"

static_assert(NCCL_UNIQUE_ID_BYTES == tandem::transfer::kNcclUniqueIdBytes);

namespace tandem::transfer {
namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclError(const char* what, ncclResult_t r, ncclComm_t comm = nullptr) {
  const char* last = ncclGetLastError(comm);
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(r), last != nullptr && *last != '\0' ? " (" : "",
                   last != nullptr ? last : "", last != nullptr && *last != '\0' ? ")" : ""));
}

// Polls with a growing pause (20 us .. 1 ms).
class Backoff {
 public:
  void Pause() {
    absl::SleepFor(pause_);
    pause_ = std::min(pause_ * 2, absl::Milliseconds(1));
  }

 private:
  absl::Duration pause_ = absl::Microseconds(20);
};

// Waits until the communicator's state leaves ncclInProgress.
absl::Status PollComm(ncclComm_t comm, const char* what, absl::Time deadline,
                      const std::function<bool()>& cancelled = nullptr) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r, comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state, comm);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    if (cancelled && cancelled()) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    backoff.Pause();
  }
}

class CudaNcclOps final : public NcclOps {
 public:
  explicit CudaNcclOps(int device) : device_(device) {}

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  std::string memory_domain() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r);
    NcclUniqueId out;
    std::memcpy(out.data(), id.internal, out.size());
    return out;
  }

  absl::StatusOr<Comm> CommInitRank(const NcclUniqueId& id, int nranks, int rank,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.data(), id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, nid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) ncclCommAbort(comm);
      return NcclError("ncclCommInitRank", r);
    }
    if (absl::Status st = PollComm(comm, "ncclCommInitRank", deadline, cancelled); !st.ok()) {
      ncclCommAbort(comm);
      return st;
    }
    return static_cast<Comm>(comm);
  }

  void CommAbort(Comm comm) override {
    if (comm == nullptr) return;
    (void)Select();
    ncclCommAbort(static_cast<ncclComm_t>(comm));
  }

  absl::StatusOr<Stream> StreamCreate() override {
    if (absl::Status st = Select(); !st.ok()) return st;
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", e);
    return static_cast<Stream>(s);
  }

  void StreamDestroy(Stream stream) override {
    if (stream == nullptr) return;
    (void)Select();
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  absl::StatusOr<void*> DeviceAlloc(int64_t bytes) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) return CudaError("cudaMalloc", e);
    return p;
  }

  void DeviceFree(void* ptr) override {
    if (ptr == nullptr) return;
    (void)Select();
    cudaFree(ptr);
  }

  absl::StatusOr<void*> HostAlloc(int64_t bytes) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) return CudaError("cudaMallocHost", e);
    return p;
  }

  void HostFree(void* ptr) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }

  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes, Stream stream) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaMemcpyAsync (to device)", e);
  }

  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes, Stream stream) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaMemcpyAsync (to host)", e);
  }

  absl::Status GroupStart() override {
    if (absl::Status st = Select(); !st.ok()) return st;
    ncclResult_t r = ncclGroupStart();
    return r == ncclSuccess ? absl::OkStatus() : NcclError("ncclGroupStart", r);
  }

  absl::Status GroupEnd(Comm comm, absl::Time deadline) override {
    ncclResult_t r = ncclGroupEnd();
    if (r == ncclSuccess) return absl::OkStatus();
    if (r != ncclInProgress) return NcclError("ncclGroupEnd", r, static_cast<ncclComm_t>(comm));
    return PollComm(static_cast<ncclComm_t>(comm), "ncclGroupEnd", deadline);
  }

  absl::Status Send(Comm comm, const void* buf, int64_t bytes, int peer, Stream stream) override {
    ncclResult_t r = ncclSend(buf, static_cast<size_t>(bytes), ncclUint8, peer,
                              static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream));
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    return NcclError("ncclSend", r, static_cast<ncclComm_t>(comm));
  }

  absl::Status Recv(Comm comm, void* buf, int64_t bytes, int peer, Stream stream) override {
    ncclResult_t r = ncclRecv(buf, static_cast<size_t>(bytes), ncclUint8, peer,
                              static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream));
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    return NcclError("ncclRecv", r, static_cast<ncclComm_t>(comm));
  }

  absl::Status WaitStream(Comm comm, Stream stream, absl::Time deadline) override {
    if (absl::Status st = Select(); !st.ok()) return st;
    Backoff backoff;
    while (true) {
      cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
      if (e != cudaSuccess && e != cudaErrorNotReady) return CudaError("cudaStreamQuery", e);
      if (comm != nullptr) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(static_cast<ncclComm_t>(comm), &state);
        if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r);
        if (state != ncclSuccess && state != ncclInProgress) {
          return NcclError("NCCL transfer", state, static_cast<ncclComm_t>(comm));
        }
      }
      if (e == cudaSuccess) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("NCCL transfer: stream did not complete in time");
      }
      backoff.Pause();
    }
  }

 private:
  absl::Status Select() {
    cudaError_t e = cudaSetDevice(device_);
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", e);
  }

  const int device_;
};

}  // namespace

bool NcclBuiltIn() { return true; }

absl::StatusOr<std::shared_ptr<NcclOps>> MakeCudaNcclOps(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("--kv-transport=nccl needs a CUDA device: ", cudaGetErrorName(e), " (",
                     cudaGetErrorString(e), ")"));
  }
  if (count == 0)
    return absl::UnavailableError("--kv-transport=nccl needs a CUDA device: none found");
  if (device < 0 || device >= count) {
    return absl::UnavailableError(absl::StrCat("--kv-transport=nccl: CUDA device ", device, " of ",
                                               count, " does not exist"));
  }
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the context now, not mid-transfer
  if (e != cudaSuccess) return CudaError("--kv-transport=nccl: CUDA device init", e);
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) return NcclError("ncclGetVersion", r);
  return std::shared_ptr<NcclOps>(std::make_shared<CudaNcclOps>(device));
}

}  // namespace tandem::transfer
