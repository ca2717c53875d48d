#include "engine/kv_cache.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::engine {

absl::StatusOr<std::unique_ptr<KvCacheStorage>> KvCacheStorage::Create(int64_t num_layers,
                                                                       int64_t num_blocks,
                                                                       int64_t block_size,
                                                                       int64_t num_kv_heads,
                                                                       int64_t head_dim) {
  if (num_layers < 1 || num_blocks < 1 || block_size < 1 || num_kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError("KV cache geometry must be positive");
  }
  constexpr int64_t kMaxFloats = int64_t{1} << 40;
  const double floats = 2.0 * num_layers * num_blocks * block_size * num_kv_heads * head_dim;
  if (floats > double(kMaxFloats)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", floats, " floats is too large"));
  }
  kernels::PagedKvLayout layout{num_blocks, block_size, num_kv_heads, head_dim};
  return std::unique_ptr<KvCacheStorage>(new KvCacheStorage(num_layers, layout));
}

KvCacheStorage::KvCacheStorage(int64_t num_layers, const kernels::PagedKvLayout& layout)
    : num_layers_(num_layers),
      layout_(layout),
      layer_floats_(layout.num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim),
      data_(2 * num_layers * layer_floats_, 0.f) {}

void KvCacheStorage::CopyBlock(int64_t src, int64_t dst) {
  if (src == dst) return;
  const int64_t n = block_floats();
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    std::copy_n(k(layer) + src * n, n, k(layer) + dst * n);
    std::copy_n(v(layer) + src * n, n, v(layer) + dst * n);
  }
}

}  // namespace tandem::engine
