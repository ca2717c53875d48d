// Paged KV cache storage.
//
// Per layer, K and V are arrays [num_blocks, block_size, num_kv_heads,
// head_dim] of the cache's KvDtype (kernels/kv_dtype.h), plus for int8/fp8 a
// one-byte KvScale per (slot, KV head) in [num_blocks, block_size,
// num_kv_heads]. A token's K/V live at a slot = block_id * block_size +
// offset; which blocks a sequence owns is the block allocator's business (its
// block table), not this class's: KvCacheStorage is only memory plus
// geometry.
//
// Thread safety: none; the engine thread owns it. Memory is allocated once in
// Create() and zero-filled.
#ifndef TANDEM_ENGINE_KV_CACHE_H_
#define TANDEM_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/zeroed_buffer.h"
#include "kernels/kernels.h"
#include "kernels/kv_dtype.h"

namespace tandem::engine {

using kernels::KvDtype;

// Geometry of a paged KV cache, whatever memory holds it (host or device).
struct KvCacheShape {
  int64_t num_layers = 0;
  kernels::PagedKvLayout layout;  // num_blocks, block_size, num_kv_heads, head_dim
  KvDtype dtype = KvDtype::kF32;

  int64_t num_slots() const { return layout.num_blocks * layout.block_size; }
  // Elements of one token's K (or V) in one layer: num_kv_heads * head_dim.
  int64_t row_elements() const { return layout.num_kv_heads * layout.head_dim; }
  // Bytes of one token's K (or V) row in one layer in the interchange layout
  // of engine/kv_export.h: the elements, then num_kv_heads KvScale bytes for
  // int8/fp8 (kernels::KvRowBytes).
  int64_t row_bytes() const {
    return kernels::KvRowBytes(dtype, layout.num_kv_heads, layout.head_dim);
  }
  // Bytes of one token's K and V in every layer, in the cache and in the
  // interchange layout [num_layers][K|V][row_bytes]: 2 * num_layers * row_bytes.
  int64_t bytes_per_token() const { return 2 * num_layers * row_bytes(); }
  // Same as bytes_per_token() (the interchange carries the native bytes).
  int64_t interchange_bytes_per_token() const { return bytes_per_token(); }
};

class KvCacheStorage {
 public:
  static constexpr int64_t kDefaultBlockSize = 16;

  // InvalidArgument on non-positive or overflowing geometry.
  static absl::StatusOr<std::unique_ptr<KvCacheStorage>> Create(
      int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
      int64_t head_dim, KvDtype dtype = KvDtype::kF32);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return layout_.num_blocks; }
  int64_t block_size() const { return layout_.block_size; }
  int64_t num_slots() const { return layout_.num_blocks * layout_.block_size; }
  int64_t num_kv_heads() const { return layout_.num_kv_heads; }
  int64_t head_dim() const { return layout_.head_dim; }
  KvDtype dtype() const { return dtype_; }
  const kernels::PagedKvLayout& layout() const { return layout_; }
  KvCacheShape shape() const { return KvCacheShape{num_layers_, layout_, dtype_}; }

  // Elements of one block of one layer's K (or V): block_size * kv_heads * head_dim.
  int64_t block_floats() const {
    return layout_.block_size * layout_.num_kv_heads * layout_.head_dim;
  }
  int64_t total_bytes() const { return static_cast<int64_t>(data_.size() + scales_.size()); }

  // One layer's K and V (and scales) for the kernels. REQUIRES: layer < num_layers().
  kernels::KvCacheView view(int64_t layer);
  // Element bytes of K (or V) of `slot` in `layer`: row_elements of dtype.
  char* k_bytes(int64_t layer) { return data_.data() + (2 * layer) * layer_bytes_; }
  char* v_bytes(int64_t layer) { return data_.data() + (2 * layer + 1) * layer_bytes_; }
  // [num_slots, num_kv_heads] scales; null unless int8/fp8.
  kernels::KvScale* k_scales(int64_t layer);
  kernels::KvScale* v_scales(int64_t layer);

  // The f32 arrays [num_blocks, block_size, num_kv_heads, head_dim].
  // REQUIRES: dtype() == kF32, layer < num_layers().
  float* k(int64_t layer) { return reinterpret_cast<float*>(k_bytes(layer)); }
  float* v(int64_t layer) { return reinterpret_cast<float*>(v_bytes(layer)); }
  const float* k(int64_t layer) const {
    return reinterpret_cast<const float*>(data_.data() + (2 * layer) * layer_bytes_);
  }
  const float* v(int64_t layer) const {
    return reinterpret_cast<const float*>(data_.data() + (2 * layer + 1) * layer_bytes_);
  }

  // Copies block src's K and V (and scales) to block dst in every layer
  // (copy-on-write). REQUIRES: 0 <= src, dst < num_blocks().
  void CopyBlock(int64_t src, int64_t dst);

  // Token `slot`'s K and V of every layer to / from the interchange layout
  // [num_layers][K|V][elements, scales] (shape().bytes_per_token() bytes).
  // REQUIRES: 0 <= slot < num_slots().
  void ReadSlot(int64_t slot, char* dst) const;
  void WriteSlot(int64_t slot, const char* src);

 private:
  KvCacheStorage(int64_t num_layers, const kernels::PagedKvLayout& layout, KvDtype dtype,
                 int64_t layer_bytes, int64_t layer_scales, ZeroedBuffer data, ZeroedBuffer scales);
  kernels::KvScale* scale_codes() { return reinterpret_cast<kernels::KvScale*>(scales_.data()); }
  const kernels::KvScale* scale_codes() const {
    return reinterpret_cast<const kernels::KvScale*>(scales_.data());
  }

  int64_t num_layers_;
  kernels::PagedKvLayout layout_;
  KvDtype dtype_;
  int64_t layer_bytes_;   // element bytes of one layer's K (or V)
  int64_t layer_scales_;  // scales of one layer's K (or V); 0 without scales
  // [num_layers][K|V][num_blocks, block_size, kv_heads, head_dim] elements.
  // Page-aligned, zero until first written (resident as blocks are used).
  ZeroedBuffer data_;
  ZeroedBuffer scales_;  // KvScale [num_layers][K|V][num_blocks, block_size, kv_heads]
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_KV_CACHE_H_
