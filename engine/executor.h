// The backend seam: where one engine step runs.
//
// The engine above this line is backend-neutral: the scheduler decides which
// tokens run and which KV blocks they use (block ids only), the ModelRunner
// flattens a step into a ForwardBatch and samples on the host. Below it, an
// Executor owns the model's compute state and the paged KV cache memory
// (host memory for the CPU executor, device memory for the CUDA one),
// addressed by block id / slot, and does four things:
//   - CopyBlocks: the scheduler's copy-on-write block copies, in order;
//   - Forward: one ForwardBatch -> f32 logits of the logits_indices rows,
//     on the host (sampling stays in engine/sampler.cc for every backend);
//   - ReadKv / WriteKv: K/V of a list of slots in the interchange layout of
//     engine/kv_export.h, the cache's native bytes (the prefill -> decode
//     handoff, migration); ReadKvDevice / WriteKvDevice the same in the
//     executor's own memory domain (device memory on CUDA: the NCCL handoff
//     without host staging).
// No CUDA type appears here or in any engine header: the CUDA executor is
// reached through MakeExecutor and lives in engine/cuda/ (built only when
// nvcc is found).
//
// Thread safety: none; the engine thread owns its executor.
#ifndef TANDEM_ENGINE_EXECUTOR_H_
#define TANDEM_ENGINE_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/forward_batch.h"
#include "engine/kv_cache.h"
#include "engine/kv_cache_manager.h"

namespace tandem::engine {

class KvDeviceBytes;
class LlamaModel;

enum class Device { kCpu, kCuda };

// "cpu" / "cuda" (flags); false on anything else.
bool ParseDevice(std::string_view s, Device* device);
std::string_view DeviceName(Device device);

class Executor {
 public:
  virtual ~Executor() = default;

  virtual Device device() const = 0;
  // One line for start-up logs, e.g. "cpu: 2 threads, KV f32 in host memory".
  virtual std::string Describe() const = 0;
  // The KV cache this executor owns.
  virtual const KvCacheShape& kv_shape() const = 0;
  // Bytes of KV cache memory held (host or device).
  virtual int64_t kv_cache_bytes() const = 0;

  // Copies every layer's K and V of block src to block dst, in order.
  // InvalidArgument on an id outside [0, num_blocks).
  virtual absl::Status CopyBlocks(absl::Span<const BlockCopy> copies) = 0;

  // Runs `batch` (validated: InvalidArgument on any inconsistency), writing
  // its tokens' K/V into the cache. logits: host, caller-allocated,
  // [batch.logits_indices.size(), vocab_size].
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits) = 0;

  // K/V of `slots` (one per token, in order) to / from host bytes in the
  // interchange layout [token][layer][K|V][row: kv_heads * head_dim elements
  // of kv_shape().dtype, then kv_heads KvScale bytes for int8/fp8]:
  // slots.size() * kv_shape().bytes_per_token() bytes.
  // InvalidArgument on a slot out of range.
  virtual absl::Status ReadKv(absl::Span<const int64_t> slots, char* dst) = 0;
  virtual absl::Status WriteKv(absl::Span<const int64_t> slots, const char* src) = 0;

  // The memory ReadKvDevice / WriteKvDevice work on: "cpu" (host memory) or
  // "cuda:N" (device N's). Memory of this domain from elsewhere in the
  // process (an NCCL transport's buffer, NcclOps::memory_domain()) works too.
  virtual std::string kv_memory_domain() const = 0;
  // `bytes` of kv_memory_domain() memory, freed with the last reference.
  // ResourceExhausted when it cannot be had.
  virtual absl::StatusOr<std::shared_ptr<KvDeviceBytes>> AllocKvDevice(int64_t bytes) = 0;
  // ReadKv / WriteKv with dst / src in kv_memory_domain() memory: on CUDA a
  // gather / scatter kernel and no host copy (the GPU-resident KV handoff).
  // Complete when they return.
  virtual absl::Status ReadKvDevice(absl::Span<const int64_t> slots, void* dst) = 0;
  virtual absl::Status WriteKvDevice(absl::Span<const int64_t> slots, const void* src) = 0;
};

struct ExecutorOptions {
  Device device = Device::kCpu;
  int device_index = 0;  // CUDA device ordinal
  int64_t num_blocks = 0;
  int64_t block_size = KvCacheStorage::kDefaultBlockSize;
  // Element type of the KV cache (kernels/kv_dtype.h). The CUDA executor
  // holds f32 only and refuses the others (FailedPrecondition).
  KvDtype kv_dtype = KvDtype::kF32;
  // CUDA: every matrix product on the f32 GEMV, so a sequence's logits are
  // bit-identical whatever else shares its step (alone, batched, prefilled
  // on another worker); prefill is slower. Also on when the environment has
  // TANDEM_BATCH_INVARIANT=1 (inherited by `tandem serve`'s workers). The CPU
  // executor is batch invariant always.
  bool batch_invariant = false;
  // CUDA: decode steps (one token per sequence, up to 64 sequences, every
  // matrix product on the Gemv) replay a CUDA graph captured per padded
  // batch size and context bucket instead of launching ~10 kernels per
  // layer. Also off when the environment has TANDEM_CUDA_GRAPHS=0.
  bool cuda_graphs = true;
  // CUDA: the Gemv (<= 8 tokens, or every step when batch invariant) of
  // planar Q4_0 / Q4_1 / Q8_0 matrices on two-level int8 activations
  // (kernels::cuda::GemvInt8: dp4a, the CPU fast path's precision) instead
  // of f32 math on the dequantized weights. Also on when the environment has
  // TANDEM_CUDA_INT8_ACTS=1. Off by default until measured on a GPU
  // (docs/gpu.md).
  bool int8_activations = false;
};

// The executor for options.device over `model` (not owned; must outlive it).
// kCuda: FailedPrecondition when this build has no CUDA support or no device
// is visible (one line, naming the cause).
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const LlamaModel* model,
                                                       const ExecutorOptions& options);

// OK when `device` can run here: always for kCpu; for kCuda, a CUDA build
// with at least one visible device, else FailedPrecondition (one line, e.g.
// "--device cuda: no CUDA device is visible (cudaGetDeviceCount: no CUDA-capable
// device is detected)"). CLIs call this before loading a model.
absl::Status CheckDeviceAvailable(Device device);

// OK when `device`'s executor can hold a KV cache of `dtype`: every dtype on
// the CPU, f32 / f16 / bf16 on CUDA (FailedPrecondition naming
// --kv-cache-dtype for int8 / fp8 there).
absl::Status CheckKvDtypeSupported(Device device, KvDtype dtype);

// Bytes free for a KV cache on options.device with `model`'s weights there,
// what a --kv-cache-memory fraction is a fraction of. kCpu: MemAvailable
// (/proc/meminfo; the weights are loaded already). kCuda: the free bytes of
// device options.device_index (cudaMemGetInfo, after the CUDA context is
// made) less the bytes `model`'s weights will take there (uploaded after
// this, with the KV cache). FailedPrecondition without a device,
// ResourceExhausted when the weights alone do not fit.
absl::StatusOr<int64_t> FreeMemoryForKv(const LlamaModel* model, const ExecutorOptions& options);

// Validates a slot list against a cache shape (ReadKv / WriteKv helpers).
absl::Status ValidateSlots(const KvCacheShape& shape, absl::Span<const int64_t> slots);
// Validates block copies against a cache shape.
absl::Status ValidateBlockCopies(const KvCacheShape& shape, absl::Span<const BlockCopy> copies);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_EXECUTOR_H_
