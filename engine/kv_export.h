// The K/V of a run of tokens, copied out of the paged cache into one host
// buffer: what a prefill worker hands to a decode worker (and, later, what a
// migration replays).
//
// Layout of `bytes` (the cache's native bytes, little-endian host order),
// token-major so that a receiver can write each token's row straight into its
// cache slot:
//   [num_tokens][num_layers][K|V][row]
//   row = [num_kv_heads * head_dim elements of the KV dtype]
//         [num_kv_heads KvScale bytes]  (int8 / fp8 only; kernels/kv_dtype.h)
// i.e. token t, layer l, K at byte offset ((t * num_layers + l) * 2 + 0) *
// row_bytes, V at (... + 1) * row_bytes, with row_bytes =
// kernels::KvRowBytes(dtype, num_kv_heads, head_dim) and bytes_per_token =
// 2 * num_layers * row_bytes (KvCacheShape::bytes_per_token()). f32 is the
// layout before KV dtypes existed.
//
// The dtype itself is not carried here: sender and receiver agree on it
// through their KvCompatibility (services/common/compat.h, kv_dtype), and
// ImportKv refuses bytes whose size per token is not the cache's.
//
// Thread safety: an immutable value once built; shared as shared_ptr<const>.
#ifndef TANDEM_ENGINE_KV_EXPORT_H_
#define TANDEM_ENGINE_KV_EXPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/executor.h"
#include "engine/kv_cache_manager.h"

namespace tandem::engine {

// K/V bytes in an executor's KV memory domain (Executor::kv_memory_domain():
// host memory for the CPU executor, a CUDA device's memory for the CUDA
// one), in the layout above: what the NCCL handoff sends and receives with
// no host staging. Owns the memory; `free` releases it when the last
// reference goes (the executor's allocator, or the transport's).
class KvDeviceBytes {
 public:
  using FreeFn = std::function<void(void*)>;
  KvDeviceBytes(void* data, int64_t size, std::string domain, FreeFn free)
      : data_(data), size_(size), domain_(std::move(domain)), free_(std::move(free)) {}
  ~KvDeviceBytes() {
    if (free_ && data_ != nullptr) free_(data_);
  }
  KvDeviceBytes(const KvDeviceBytes&) = delete;
  KvDeviceBytes& operator=(const KvDeviceBytes&) = delete;

  void* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& domain() const { return domain_; }  // e.g. "cpu", "cuda:0"

 private:
  void* data_;
  int64_t size_;
  std::string domain_;
  FreeFn free_;
};

struct KvExport {
  std::vector<int32_t> token_ids;  // [num_tokens] the tokens the K/V belong to
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t bytes_per_token = 0;  // BytesPerToken(geometry, the cache's dtype)
  std::string bytes;            // [num_tokens * bytes_per_token], layout above
  // Instead of `bytes` (then empty): the same payload in an executor's KV
  // memory domain (the NCCL handoff between two CUDA workers).
  std::shared_ptr<const KvDeviceBytes> device;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t payload_bytes() const {
    return device != nullptr ? device->size() : static_cast<int64_t>(bytes.size());
  }
  // bytes_per_token for the geometry and KV dtype.
  static int64_t BytesPerToken(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                               KvDtype dtype = KvDtype::kF32) {
    return kernels::KvBytesPerToken(dtype, num_layers, num_kv_heads, head_dim);
  }
  // InvalidArgument naming the field when the geometry, bytes_per_token or
  // the buffer size disagree with each other. bytes_per_token must be that
  // of one of the KV dtypes for the geometry (which one is the cache's
  // business: ImportKv checks it against its cache).
  absl::Status Validate() const;
};

// Copies positions [0, num_tokens) of `seq` (its K/V must be computed) out of
// the executor's cache. REQUIRES: the block table of seq covers num_tokens
// tokens. Errors are the executor's (a device copy failing).
absl::StatusOr<KvExport> ExportKv(Executor& executor, const KvCacheManager& kv, SeqId seq,
                                  absl::Span<const int32_t> token_ids);

// Copies positions [begin, end) of `seq` (computed) into *bytes in the
// layout above ((end - begin) * bytes_per_token bytes): one piece of a
// streamed export. REQUIRES: 0 <= begin <= end <= tokens covered by seq's
// block table.
absl::Status ReadKvRange(Executor& executor, const KvCacheManager& kv, SeqId seq, int64_t begin,
                         int64_t end, std::string* bytes);

// The same range into new memory of executor.kv_memory_domain() (no host
// copy on CUDA): AllocKvDevice, then ReadKvDevice.
absl::StatusOr<std::shared_ptr<const KvDeviceBytes>> ReadKvRangeToDevice(Executor& executor,
                                                                         const KvCacheManager& kv,
                                                                         SeqId seq, int64_t begin,
                                                                         int64_t end);

// Writes positions [begin, end) of `src` into the slots of `seq`. A payload
// in `src.device` is written with WriteKvDevice (FailedPrecondition when its
// domain is not the executor's).
// InvalidArgument when src's geometry or bytes_per_token (its KV dtype)
// differs from the executor's cache or [begin, end) is not within src. REQUIRES: the block table of
// seq covers end tokens.
absl::Status ImportKv(const KvExport& src, int64_t begin, int64_t end, const KvCacheManager& kv,
                      SeqId seq, Executor& executor);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_KV_EXPORT_H_
