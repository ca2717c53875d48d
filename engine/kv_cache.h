// Paged KV cache storage.
//
// Per layer, K and V are f32 arrays [num_blocks, block_size, num_kv_heads,
// head_dim]. A token's K/V live at a slot = block_id * block_size + offset;
// which blocks a sequence owns is the block allocator's business (its block
// table), not this class's: KvCacheStorage is only memory plus geometry.
//
// Thread safety: none; the engine thread owns it. Memory is allocated once in
// Create() and zero-filled.
#ifndef TANDEM_ENGINE_KV_CACHE_H_
#define TANDEM_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace tandem::engine {

// Geometry of a paged KV cache, whatever memory holds it (host or device).
struct KvCacheShape {
  int64_t num_layers = 0;
  kernels::PagedKvLayout layout;  // num_blocks, block_size, num_kv_heads, head_dim

  int64_t num_slots() const { return layout.num_blocks * layout.block_size; }
  // Floats of one token's K (or V) in one layer: num_kv_heads * head_dim.
  int64_t row_floats() const { return layout.num_kv_heads * layout.head_dim; }
  // Bytes of one token's K and V in every layer in the f32 interchange
  // layout of engine/kv_export.h: [num_layers][K|V][row_floats].
  int64_t interchange_bytes_per_token() const {
    return 2 * num_layers * row_floats() * static_cast<int64_t>(sizeof(float));
  }
};

class KvCacheStorage {
 public:
  static constexpr int64_t kDefaultBlockSize = 16;

  // InvalidArgument on non-positive or overflowing geometry.
  static absl::StatusOr<std::unique_ptr<KvCacheStorage>> Create(int64_t num_layers,
                                                                int64_t num_blocks,
                                                                int64_t block_size,
                                                                int64_t num_kv_heads,
                                                                int64_t head_dim);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return layout_.num_blocks; }
  int64_t block_size() const { return layout_.block_size; }
  int64_t num_slots() const { return layout_.num_blocks * layout_.block_size; }
  int64_t num_kv_heads() const { return layout_.num_kv_heads; }
  int64_t head_dim() const { return layout_.head_dim; }
  const kernels::PagedKvLayout& layout() const { return layout_; }
  KvCacheShape shape() const { return KvCacheShape{num_layers_, layout_}; }

  // Floats of one block of one layer's K (or V): block_size * kv_heads * head_dim.
  int64_t block_floats() const {
    return layout_.block_size * layout_.num_kv_heads * layout_.head_dim;
  }
  int64_t total_bytes() const { return 2 * num_layers_ * layer_floats_ * int64_t(sizeof(float)); }

  // [num_blocks, block_size, num_kv_heads, head_dim]. REQUIRES: layer < num_layers().
  float* k(int64_t layer) { return data_.data() + (2 * layer) * layer_floats_; }
  float* v(int64_t layer) { return data_.data() + (2 * layer + 1) * layer_floats_; }
  const float* k(int64_t layer) const { return data_.data() + (2 * layer) * layer_floats_; }
  const float* v(int64_t layer) const { return data_.data() + (2 * layer + 1) * layer_floats_; }

  // Copies block src's K and V to block dst in every layer (copy-on-write).
  // REQUIRES: 0 <= src, dst < num_blocks().
  void CopyBlock(int64_t src, int64_t dst);

 private:
  KvCacheStorage(int64_t num_layers, const kernels::PagedKvLayout& layout);

  int64_t num_layers_;
  kernels::PagedKvLayout layout_;
  int64_t layer_floats_;
  std::vector<float> data_;  // [num_layers][K|V][num_blocks, block_size, kv_heads, head_dim]
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_KV_CACHE_H_
