#include "engine/kv_export.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

absl::Status KvExport::Validate() const {
  if (num_layers < 1) return absl::InvalidArgumentError("num_layers must be >= 1");
  if (num_kv_heads < 1) return absl::InvalidArgumentError("num_kv_heads must be >= 1");
  if (head_dim < 1) return absl::InvalidArgumentError("head_dim must be >= 1");
  if (bytes_per_token != BytesPerToken(num_layers, num_kv_heads, head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_token ", bytes_per_token, " does not match the geometry"));
  }
  if (static_cast<int64_t>(bytes.size()) != num_tokens() * bytes_per_token) {
    return absl::InvalidArgumentError(absl::StrCat("kv bytes ", bytes.size(), " != num_tokens ",
                                                   num_tokens(), " x bytes_per_token ",
                                                   bytes_per_token));
  }
  return absl::OkStatus();
}

KvExport ExportKv(const KvCacheStorage& cache, const KvCacheManager& kv, SeqId seq,
                  absl::Span<const int32_t> token_ids) {
  KvExport out;
  out.token_ids.assign(token_ids.begin(), token_ids.end());
  out.num_layers = cache.num_layers();
  out.num_kv_heads = cache.num_kv_heads();
  out.head_dim = cache.head_dim();
  out.bytes_per_token = KvExport::BytesPerToken(out.num_layers, out.num_kv_heads, out.head_dim);
  out.bytes.resize(out.num_tokens() * out.bytes_per_token);
  const int64_t row = cache.num_kv_heads() * cache.head_dim();
  const size_t row_bytes = row * sizeof(float);
  char* dst = out.bytes.data();
  for (int64_t t = 0; t < out.num_tokens(); ++t) {
    const int64_t slot = kv.Slot(seq, t);
    for (int64_t l = 0; l < out.num_layers; ++l) {
      std::memcpy(dst, cache.k(l) + slot * row, row_bytes);
      dst += row_bytes;
      std::memcpy(dst, cache.v(l) + slot * row, row_bytes);
      dst += row_bytes;
    }
  }
  return out;
}

void ImportKv(const KvExport& src, int64_t begin, int64_t end, const KvCacheManager& kv, SeqId seq,
              KvCacheStorage* cache) {
  TANDEM_CHECK(src.num_layers == cache->num_layers() && src.num_kv_heads == cache->num_kv_heads() &&
               src.head_dim == cache->head_dim());
  TANDEM_CHECK(0 <= begin && begin <= end && end <= src.num_tokens());
  const int64_t row = cache->num_kv_heads() * cache->head_dim();
  const size_t row_bytes = row * sizeof(float);
  const char* p = src.bytes.data() + begin * src.bytes_per_token;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t slot = kv.Slot(seq, t);
    for (int64_t l = 0; l < src.num_layers; ++l) {
      std::memcpy(cache->k(l) + slot * row, p, row_bytes);
      p += row_bytes;
      std::memcpy(cache->v(l) + slot * row, p, row_bytes);
      p += row_bytes;
    }
  }
}

}  // namespace tandem::engine
