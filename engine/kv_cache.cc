#include "engine/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::engine {

absl::StatusOr<std::unique_ptr<KvCacheStorage>> KvCacheStorage::Create(
    int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
    int64_t head_dim, KvDtype dtype) {
  if (num_layers < 1 || num_blocks < 1 || block_size < 1 || num_kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError("KV cache geometry must be positive");
  }
  constexpr int64_t kMaxBytes = int64_t{1} << 42;
  const double bytes = 2.0 * num_layers * num_blocks * block_size *
                       double(kernels::KvRowBytes(dtype, num_kv_heads, head_dim));
  if (bytes > double(kMaxBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", bytes, " bytes is too large"));
  }
  kernels::PagedKvLayout layout{num_blocks, block_size, num_kv_heads, head_dim};
  const int64_t layer_bytes =
      num_blocks * block_size * num_kv_heads * head_dim * kernels::KvElementBytes(dtype);
  const int64_t layer_scales =
      kernels::KvHasScales(dtype) ? num_blocks * block_size * num_kv_heads : 0;
  // Zeroed by the kernel page by page as blocks are first written, not here.
  auto allocate = [](size_t bytes) -> absl::StatusOr<ZeroedBuffer> {
    absl::StatusOr<ZeroedBuffer> buf = ZeroedBuffer::Allocate(bytes);
    if (!buf.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache (--kv-cache-memory): ", buf.status().message()));
    }
    return buf;
  };
  absl::StatusOr<ZeroedBuffer> data = allocate(size_t(2 * num_layers * layer_bytes));
  if (!data.ok()) return data.status();
  absl::StatusOr<ZeroedBuffer> scales =
      allocate(size_t(2 * num_layers * layer_scales) * kernels::kKvScaleBytes);
  if (!scales.ok()) return scales.status();
  return std::unique_ptr<KvCacheStorage>(new KvCacheStorage(
      num_layers, layout, dtype, layer_bytes, layer_scales, *std::move(data), *std::move(scales)));
}

KvCacheStorage::KvCacheStorage(int64_t num_layers, const kernels::PagedKvLayout& layout,
                               KvDtype dtype, int64_t layer_bytes, int64_t layer_scales,
                               ZeroedBuffer data, ZeroedBuffer scales)
    : num_layers_(num_layers),
      layout_(layout),
      dtype_(dtype),
      layer_bytes_(layer_bytes),
      layer_scales_(layer_scales),
      data_(std::move(data)),
      scales_(std::move(scales)) {}

kernels::KvScale* KvCacheStorage::k_scales(int64_t layer) {
  return layer_scales_ > 0 ? scale_codes() + (2 * layer) * layer_scales_ : nullptr;
}
kernels::KvScale* KvCacheStorage::v_scales(int64_t layer) {
  return layer_scales_ > 0 ? scale_codes() + (2 * layer + 1) * layer_scales_ : nullptr;
}

kernels::KvCacheView KvCacheStorage::view(int64_t layer) {
  kernels::KvCacheView v;
  v.dtype = dtype_;
  v.k = k_bytes(layer);
  v.v = v_bytes(layer);
  v.k_scale = k_scales(layer);
  v.v_scale = v_scales(layer);
  return v;
}

void KvCacheStorage::CopyBlock(int64_t src, int64_t dst) {
  if (src == dst) return;
  const int64_t nb = block_floats() * kernels::KvElementBytes(dtype_);
  const int64_t ns = layer_scales_ > 0 ? layout_.block_size * layout_.num_kv_heads : 0;
  for (int64_t half = 0; half < 2 * num_layers_; ++half) {
    char* d = data_.data() + half * layer_bytes_;
    std::copy_n(d + src * nb, nb, d + dst * nb);
    if (ns > 0) {
      kernels::KvScale* s = scale_codes() + half * layer_scales_;
      std::copy_n(s + src * ns, ns, s + dst * ns);
    }
  }
}

void KvCacheStorage::ReadSlot(int64_t slot, char* dst) const {
  const int64_t eb = layout_.num_kv_heads * layout_.head_dim * kernels::KvElementBytes(dtype_);
  const int64_t ns = layer_scales_ > 0 ? layout_.num_kv_heads : 0;
  for (int64_t half = 0; half < 2 * num_layers_; ++half) {
    std::memcpy(dst, data_.data() + half * layer_bytes_ + slot * eb, eb);
    dst += eb;
    if (ns > 0) {
      std::memcpy(dst, scale_codes() + half * layer_scales_ + slot * ns,
                  ns * kernels::kKvScaleBytes);
      dst += ns * kernels::kKvScaleBytes;
    }
  }
}

void KvCacheStorage::WriteSlot(int64_t slot, const char* src) {
  const int64_t eb = layout_.num_kv_heads * layout_.head_dim * kernels::KvElementBytes(dtype_);
  const int64_t ns = layer_scales_ > 0 ? layout_.num_kv_heads : 0;
  for (int64_t half = 0; half < 2 * num_layers_; ++half) {
    std::memcpy(data_.data() + half * layer_bytes_ + slot * eb, src, eb);
    src += eb;
    if (ns > 0) {
      std::memcpy(scale_codes() + half * layer_scales_ + slot * ns, src,
                  ns * kernels::kKvScaleBytes);
      src += ns * kernels::kKvScaleBytes;
    }
  }
}

}  // namespace tandem::engine
