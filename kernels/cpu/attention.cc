// Dispatched paged attention and KV write.
//
// Work items are (token, KV head) pairs split over the pool: one item
// computes all query heads of the KV head's GQA group, reading each K and V
// row once for the whole group (AVX-512, head_dim 64: queries and outputs
// stay in registers; other shapes: one head at a time as before). Each
// output is computed entirely by one thread: scores in position order
// (DotF32 order), max, exp (Exp16) and a sum whose order depends only on the
// context length, then V accumulated in position order. Nothing depends on
// other items, so outputs are bit-identical for any batch or thread count.
#include <algorithm>
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

#if TANDEM_KERNELS_AVX512
constexpr int kMaxGroup = 8;
constexpr int64_t kFastHeadDim = 64;

// out[i] = sum of the 16 lanes of v[i]. Each output's lanes are added in
// the same tree, whatever i: within each 128-bit quarter (e0 + e2) + (e1 +
// e3), then quarters (q0 + q1) + (q2 + q3).
inline __m512 TransposeSum16(const __m512* v) {
  __m512 s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i) {
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  // s[i], quarter L: keys 2i, 2i+1 interleaved: [a02, b02, a13, b13].
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s[2 * i]), y = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // t[i], quarter L: the quarter-L sums of keys 4i .. 4i+3.
  for (int i = 0; i < 2; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // u[i]: quarters (keys 8i..8i+3: q0+q1, q2+q3, keys 8i+4..: q0+q1, q2+q3).
  return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// All `group` heads of one KV head, head_dim 64. p: [group, len] scratch.
void AttendGroup64(const PagedAttentionArgs& a, const int32_t* table, int64_t len, const float* q,
                   int group, int64_t kvh, const float* k_cache, const float* v_cache,
                   std::vector<float>& p, float* out) {
  const PagedKvLayout& L = a.layout;
  const int64_t width = L.num_kv_heads * kFastHeadDim;
  const int64_t stride = (len + 15) / 16 * 16;
  p.resize(group * stride);
  __m512 qv[kMaxGroup][4];
  for (int g = 0; g < group; ++g) {
    for (int c = 0; c < 4; ++c) qv[g][c] = _mm512_loadu_ps(q + g * kFastHeadDim + 16 * c);
  }
  // Scores 16 keys at a time: per key a 16-lane partial product, then one
  // transpose-reduce of the 16 partials gives the 16 dots in one register.
  // Every key's dot sums its lanes in the same fixed tree (TransposeSum16),
  // whichever slot of the 16 it has, so a score depends only on q and k.
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, len - j0);
    const float* kr[16];
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t j = j0 + std::min(i, nk - 1);  // pad with the last key (masked off)
      const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
      kr[i] = k_cache + slot * width + kvh * kFastHeadDim;
    }
    const __mmask16 m = nk == 16 ? __mmask16(0xffff) : cpu::TailMask(nk);
    for (int g = 0; g < group; ++g) {
      __m512 part[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        __m512 e = _mm512_mul_ps(qv[g][0], _mm512_loadu_ps(kr[i]));
        __m512 o = _mm512_mul_ps(qv[g][1], _mm512_loadu_ps(kr[i] + 16));
        e = _mm512_fmadd_ps(qv[g][2], _mm512_loadu_ps(kr[i] + 32), e);
        o = _mm512_fmadd_ps(qv[g][3], _mm512_loadu_ps(kr[i] + 48), o);
        part[i] = _mm512_add_ps(e, o);
      }
      _mm512_mask_storeu_ps(p.data() + g * stride + j0, m,
                            _mm512_mul_ps(TransposeSum16(part), scale));
    }
  }
  float inv[kMaxGroup];
  for (int g = 0; g < group; ++g) {
    float* pg = p.data() + g * stride;
    // max is exact in any order.
    __m512 mx16 = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 m = len - j >= 16 ? __mmask16(0xffff) : cpu::TailMask(len - j);
      mx16 = _mm512_mask_max_ps(mx16, m, mx16, _mm512_maskz_loadu_ps(m, pg + j));
    }
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx16));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 m = len - j >= 16 ? __mmask16(0xffff) : cpu::TailMask(len - j);
      const __m512 e = cpu::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, pg + j), mv));
      _mm512_mask_storeu_ps(pg + j, m, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    inv[g] = 1.f / cpu::Reduce16(sum);
  }
  __m512 acc[kMaxGroup][4];
  for (int g = 0; g < group; ++g) {
    for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
    const float* vr = v_cache + slot * width + kvh * kFastHeadDim;
    const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
    const __m512 v2 = _mm512_loadu_ps(vr + 32), v3 = _mm512_loadu_ps(vr + 48);
    for (int g = 0; g < group; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * stride + j] * inv[g]);
      acc[g][0] = _mm512_fmadd_ps(w, v0, acc[g][0]);
      acc[g][1] = _mm512_fmadd_ps(w, v1, acc[g][1]);
      acc[g][2] = _mm512_fmadd_ps(w, v2, acc[g][2]);
      acc[g][3] = _mm512_fmadd_ps(w, v3, acc[g][3]);
    }
  }
  for (int g = 0; g < group; ++g) {
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + g * kFastHeadDim + 16 * c, acc[g][c]);
  }
}
#endif

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
#if TANDEM_KERNELS_AVX512
  if (hd == kFastHeadDim && group <= kMaxGroup) {
    const int64_t kvh = a.layout.num_kv_heads;
    ThreadPool::Run(pool, num_tokens * kvh, [&](int64_t begin, int64_t end) {
      std::vector<float> p;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / kvh, h = item % kvh;
        const int32_t* table = a.block_tables + seq_of[t] * a.max_blocks_per_seq;
        const int64_t off = (t * a.num_heads + h * group) * hd;
        AttendGroup64(a, table, int64_t(a.positions[t]) + 1, q + off, int(group), h, k_cache,
                      v_cache, p, out + off);
      }
    });
    return;
  }
#endif
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
