// Scalar references for the paged KV write path and paged attention.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::kernels::ref {

namespace {

KvCacheView F32View(const float* k_cache, const float* v_cache) {
  KvCacheView view;
  view.k = const_cast<float*>(k_cache);
  view.v = const_cast<float*>(v_cache);
  return view;
}

// Head `kvh` of slot `slot` as f32.
void LoadHead(const PagedKvLayout& L, KvDtype dtype, const void* data, const KvScale* scales,
              int64_t slot, int64_t kvh, float* out) {
  const int64_t hd = L.head_dim;
  const int64_t row = slot * L.num_kv_heads + kvh;
  const auto* src = static_cast<const char*>(data) + row * hd * KvElementBytes(dtype);
  DequantizeKvHead(dtype, src, KvHasScales(dtype) ? scales[row] : kKvScaleOne, hd, out);
}

}  // namespace

void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, const KvCacheView& cache) {
  const int64_t hd = layout.head_dim;
  const int64_t eb = KvElementBytes(cache.dtype);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      const int64_t row = slot_mapping[t] * layout.num_kv_heads + h;
      const int64_t src = (t * layout.num_kv_heads + h) * hd;
      const KvScale ks =
          QuantizeKvHead(cache.dtype, k + src, hd, static_cast<char*>(cache.k) + row * hd * eb);
      const KvScale vs =
          QuantizeKvHead(cache.dtype, v + src, hd, static_cast<char*>(cache.v) + row * hd * eb);
      if (KvHasScales(cache.dtype)) {
        cache.k_scale[row] = ks;
        cache.v_scale[row] = vs;
      }
    }
  }
}

void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, float* k_cache, float* v_cache) {
  ref::WriteKv(layout, k, v, slot_mapping, n, F32View(k_cache, v_cache));
}

void PagedAttention(const PagedAttentionArgs& a, const float* q, const KvCacheView& cache,
                    float* out) {
  const PagedKvLayout& L = a.layout;
  const int64_t hd = L.head_dim;
  const int64_t group = a.num_heads / L.num_kv_heads;
  std::vector<float> row(hd);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
    for (int64_t t = a.query_start[s]; t < a.query_start[s + 1]; ++t) {
      const int64_t len = int64_t(a.positions[t]) + 1;
      for (int64_t h = 0; h < a.num_heads; ++h) {
        const float* qh = q + (t * a.num_heads + h) * hd;
        const int64_t kvh = h / group;
        std::vector<double> p(len);
        double mx = -INFINITY;
        for (int64_t j = 0; j < len; ++j) {
          const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
          LoadHead(L, cache.dtype, cache.k, cache.k_scale, slot, kvh, row.data());
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qh[d]) * row[d];
          p[j] = dot * a.scale;
          mx = std::fmax(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
        std::vector<double> acc(hd, 0.0);
        for (int64_t j = 0; j < len; ++j) {
          const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
          LoadHead(L, cache.dtype, cache.v, cache.v_scale, slot, kvh, row.data());
          for (int64_t d = 0; d < hd; ++d) acc[d] += p[j] / sum * row[d];
        }
        for (int64_t d = 0; d < hd; ++d) out[(t * a.num_heads + h) * hd + d] = float(acc[d]);
      }
    }
  }
}

void PagedAttention(const PagedAttentionArgs& a, const float* q, const float* k_cache,
                    const float* v_cache, float* out) {
  ref::PagedAttention(a, q, F32View(k_cache, v_cache), out);
}

}  // namespace tandem::kernels::ref
