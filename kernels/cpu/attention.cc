// Dispatched paged attention and KV write.
//
// Work items are (token, query head) pairs split over the pool; each item is
// computed entirely by one thread: scores in position order, max, exp-sum in
// position order, then V accumulated in position order. Nothing depends on the
// other items, so outputs are bit-identical for any batch or thread count.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace tandem::kernels {

void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, float* k_cache, float* v_cache) {
  const int64_t width = layout.num_kv_heads * layout.head_dim;
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(k_cache + slot_mapping[t] * width, k + t * width, width * sizeof(float));
    std::memcpy(v_cache + slot_mapping[t] * width, v + t * width, width * sizeof(float));
  }
}

namespace {

void AttendOne(const PagedAttentionArgs& a, const int32_t* table, int64_t len, const float* qh,
               int64_t kvh, const float* k_cache, const float* v_cache, std::vector<float>& p,
               float* out) {
  const PagedKvLayout& L = a.layout;
  const int64_t hd = L.head_dim;
  const int64_t width = L.num_kv_heads * hd;
  p.resize(len);
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
    p[j] = cpu::DotF32(qh, k_cache + slot * width + kvh * hd, hd) * a.scale;
    mx = std::fmax(mx, p[j]);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
  const float inv = 1.f / sum;
  std::memset(out, 0, hd * sizeof(float));
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
    cpu::AxpyF32(p[j] * inv, v_cache + slot * width + kvh * hd, hd, out);
  }
}

}  // namespace

void PagedAttention(const PagedAttentionArgs& a, const float* q, const float* k_cache,
                    const float* v_cache, float* out, ThreadPool* pool) {
  const int64_t num_tokens = a.num_seqs > 0 ? a.query_start[a.num_seqs] : 0;
  if (num_tokens <= 0) return;
  std::vector<int32_t> seq_of(num_tokens);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    for (int64_t t = a.query_start[s]; t < a.query_start[s + 1]; ++t) seq_of[t] = int32_t(s);
  }
  const int64_t hd = a.layout.head_dim;
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  ThreadPool::Run(pool, num_tokens * a.num_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> p;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / a.num_heads, h = item % a.num_heads;
      const int32_t* table = a.block_tables + seq_of[t] * a.max_blocks_per_seq;
      AttendOne(a, table, int64_t(a.positions[t]) + 1, q + item * hd, h / group, k_cache, v_cache,
                p, out + item * hd);
    }
  });
}

}  // namespace tandem::kernels
