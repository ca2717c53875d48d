// Scalar references for the paged KV write path and paged attention.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::kernels::ref {

void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, float* k_cache, float* v_cache) {
  const int64_t width = layout.num_kv_heads * layout.head_dim;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < width; ++i) {
      k_cache[slot_mapping[t] * width + i] = k[t * width + i];
      v_cache[slot_mapping[t] * width + i] = v[t * width + i];
    }
  }
}

void PagedAttention(const PagedAttentionArgs& a, const float* q, const float* k_cache,
                    const float* v_cache, float* out) {
  const PagedKvLayout& L = a.layout;
  const int64_t hd = L.head_dim;
  const int64_t width = L.num_kv_heads * hd;
  const int64_t group = a.num_heads / L.num_kv_heads;
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
          const float* kj = k_cache + slot * width + kvh * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qh[d]) * kj[d];
          p[j] = dot * a.scale;
          mx = std::fmax(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
        std::vector<double> acc(hd, 0.0);
        for (int64_t j = 0; j < len; ++j) {
          const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
          const float* vj = v_cache + slot * width + kvh * hd;
          for (int64_t d = 0; d < hd; ++d) acc[d] += p[j] / sum * vj[d];
        }
        for (int64_t d = 0; d < hd; ++d) out[(t * a.num_heads + h) * hd + d] = float(acc[d]);
      }
    }
  }
}

}  // namespace tandem::kernels::ref
