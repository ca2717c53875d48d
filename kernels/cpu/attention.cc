// Dispatched paged attention and KV write.
//
// Work items are (tile, KV head) pairs split over the pool, a tile being up
// to 8 consecutive tokens of one sequence (a prefill chunk, a speculative
// verification): one item computes all query heads of the KV head's GQA
// group for every token of its tile (AttendGroup, for head dims 64, 80, 96,
// 128 and 256 and any group size: on AVX-512 16-lane registers, other builds
// a portable form with the same bits; other head dims: one (token, head) at
// a time, AttendOne). A tile of several tokens converts its KV head's K/V
// rows to f32 once into thread-local scratch, exactly the values the
// in-place loads give, and every token reads them there; a tile of one
// reads the cache in place. A context of more than kPartKeys (256) keys is
// attended in partitions of equal size fixed by its length (split-KV), each
// with its own scores in position order (DotF32 order), max, exp (Exp16) and
// a sum whose order depends only on the partition's length, then V
// accumulated in position order; MergeParts combines them in partition
// order. The partitions of a query run in its item, or, when there are few
// queries (one sequence's decode), as items of their own merged afterwards:
// the same arithmetic either way, so outputs are bit-identical for any batch
// or thread count.
//
// KV dtypes (kernels/kv_dtype.h) are read in place: each K/V row is
// converted to f32 in registers (AVX-512 AttendGroup) or into one row of
// scratch (other builds and head dims) right where it is used; int8/fp8
// scales multiply the score of their key and the softmax weight of their
// value, so no dequantized copy of the cache is ever made. The one
// exception is bounded: a multi-token tile's working copy of its KV head's
// rows (at most kMaxTileFloats per K and V: 2 MiB per thread, kept for
// reuse). f32 runs exactly the code it ran before dtypes existed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__F16C__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/variant.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace tandem::kernels {
TANDEM_KERNELS_VARIANT_BEGIN

void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, const KvCacheView& cache) {
  const int64_t width = layout.num_kv_heads * layout.head_dim;
  if (cache.dtype == KvDtype::kF32) {
    auto* kc = static_cast<float*>(cache.k);
    auto* vc = static_cast<float*>(cache.v);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(kc + slot_mapping[t] * width, k + t * width, width * sizeof(float));
      std::memcpy(vc + slot_mapping[t] * width, v + t * width, width * sizeof(float));
    }
    return;
  }
  const int64_t hd = layout.head_dim;
  const int64_t eb = KvElementBytes(cache.dtype);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      const int64_t row = slot_mapping[t] * layout.num_kv_heads + h;
      const int64_t src = t * width + h * hd;
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

namespace {

#if TANDEM_KERNELS_AVX512
// Elements 16c .. 16c+15 of a head stored as D, as f32. fp8 comes out as
// value * 2^-8 (its bits placed in a binary16; kRawScale restores it).
template <KvDtype D>
inline __m512 Load16(const char* row, int c) {
  if constexpr (D == KvDtype::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + 16 * c);
  } else if constexpr (D == KvDtype::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * c)));
  } else if constexpr (D == KvDtype::kBf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (D == KvDtype::kInt8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * c));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else {
    // e4m3 s.eeee.mmm -> binary16 s.0eeee.mmm0000000: same mantissa, exponent
    // bias 15 instead of 7 (also for subnormals), so the f16 value is 2^-8 x.
    // Sign-extended to 16 bits and shifted by 7, a negative code also sets
    // bit 14, which the mask clears.
    const __m256i b =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * c)));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(int16_t(0xbfff))));
  }
}

// Load16, stored to dst[0..16).
template <KvDtype D>
inline void Store16(const char* row, int c, float* dst) {
  _mm512_storeu_ps(dst, Load16<D>(row, c));
}
#else
// 16 binary16 values as f32 (exact either way).
inline void HalfToFloat16(const uint16_t* h, float* dst) {
#if defined(__F16C__)
  for (int i = 0; i < 16; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
#else
  for (int i = 0; i < 16; ++i) dst[i] = Fp16ToFp32(h[i]);
#endif
}

// The AVX-512 Load16's values, stored to dst[0..16).
template <KvDtype D>
inline void Store16(const char* row, int c, float* dst) {
  if constexpr (D == KvDtype::kF32) {
    std::memcpy(dst, row + 64 * c, 64);
  } else if constexpr (D == KvDtype::kF16) {
    uint16_t h[16];
    std::memcpy(h, row + 32 * c, 32);
    HalfToFloat16(h, dst);
  } else if constexpr (D == KvDtype::kBf16) {
    uint16_t h[16];
    std::memcpy(h, row + 32 * c, 32);
    for (int i = 0; i < 16; ++i) {
      const uint32_t u = uint32_t(h[i]) << 16;
      std::memcpy(dst + i, &u, 4);
    }
  } else if constexpr (D == KvDtype::kInt8) {
    for (int i = 0; i < 16; ++i) dst[i] = float(int8_t(row[16 * c + i]));
  } else {
    uint16_t h[16];  // e4m3 placed in a binary16, as the AVX-512 Load16<kFp8>
    for (int i = 0; i < 16; ++i) {
      h[i] = uint16_t((uint16_t(int16_t(int8_t(row[16 * c + i]))) << 7) & 0xbfff);
    }
    HalfToFloat16(h, dst);
  }
}
#endif

template <KvDtype D>
constexpr float kRawScale = D == KvDtype::kFp8 ? 256.f : 1.f;

// n elements of a head stored as `dtype` (no scale) into dst.
void ConvertRow(KvDtype dtype, const char* src, int64_t n, float* dst) {
  int64_t i = 0;
#if TANDEM_KERNELS_AVX512
  const auto chunks = [&](auto load, float mul) {
    const __m512 m = _mm512_set1_ps(mul);
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_mul_ps(load(int(i / 16)), m));
  };
  switch (dtype) {
    case KvDtype::kF16:
      chunks([&](int c) { return Load16<KvDtype::kF16>(src, c); }, 1.f);
      break;
    case KvDtype::kBf16:
      chunks([&](int c) { return Load16<KvDtype::kBf16>(src, c); }, 1.f);
      break;
    case KvDtype::kInt8:
      chunks([&](int c) { return Load16<KvDtype::kInt8>(src, c); }, 1.f);
      break;
    case KvDtype::kFp8:
      chunks([&](int c) { return Load16<KvDtype::kFp8>(src, c); }, kRawScale<KvDtype::kFp8>);
      break;
    case KvDtype::kF32:
      break;
  }
#endif
  if (i < n) {
    DequantizeKvHead(dtype, src + i * KvElementBytes(dtype), kKvScaleOne, n - i, dst + i);
  }
}

void AttendOne(const PagedAttentionArgs& a, const int32_t* table, int64_t len, const float* qh,
               int64_t kvh, const KvCacheView& cache, std::vector<float>& p,
               std::vector<float>& row, float* out) {
  const PagedKvLayout& L = a.layout;
  const int64_t hd = L.head_dim;
  const int64_t eb = KvElementBytes(cache.dtype);
  const bool f32 = cache.dtype == KvDtype::kF32;
  const bool scaled = KvHasScales(cache.dtype);
  row.resize(hd);
  // Row r's elements as f32: in place for f32, else converted into `row`.
  const auto load = [&](const void* data, int64_t r) -> const float* {
    const char* src = static_cast<const char*>(data) + r * hd * eb;
    if (f32) return reinterpret_cast<const float*>(src);
    ConvertRow(cache.dtype, src, hd, row.data());
    return row.data();
  };
  p.resize(len);
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
    const int64_t r = slot * L.num_kv_heads + kvh;
    p[j] = cpu::DotF32(qh, load(cache.k, r), hd) * a.scale;
    if (scaled) p[j] *= KvScaleToFp32(cache.k_scale[r]);
    mx = std::fmax(mx, p[j]);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
  const float inv = 1.f / sum;
  std::memset(out, 0, hd * sizeof(float));
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = int64_t(table[j / L.block_size]) * L.block_size + j % L.block_size;
    const int64_t r = slot * L.num_kv_heads + kvh;
    const float w = scaled ? p[j] * inv * KvScaleToFp32(cache.v_scale[r]) : p[j] * inv;
    cpu::AxpyF32(w, load(cache.v, r), hd, out);
  }
}

// cpu::Exp16 on one lane, step for step (2^n built in the exponent field:
// n is in [-126, 127] after the clamp, and p * 2^n rounds as scalef).
inline float ExpLane(float x) {
  // Exp16's clamp as its max_ps / min_ps define it ((a > b) ? a : b, so a
  // NaN becomes -87 as there), with compares: std::fmax / fmin are library
  // calls.
  x = x > -87.f ? x : -87.f;
  x = x < 88.f ? x : 88.f;
  const float n = std::nearbyint(x * 1.44269504089f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.f);
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, 4);
  return p * pow2;
}

// A softmax's max score and sum of numerators (over one partition of keys).
struct SoftmaxStats {
  float max, sum;
};

constexpr int kMaxGroup = 8;
// Head dims with the GQA-group kernel (AttendGroup): 64 (SmolLM2, Llama 3.2
// 1B, TinyLlama), 80 (Phi-2), 96 (Phi-3), 128 (Llama 2/3 7-70B, Qwen2.5,
// Mistral), 256 (Gemma); a head is kHd / 16 chunks of 16 lanes. Other head
// dims take AttendOne.
template <int kHd>
constexpr int kChunks = kHd / 16;

#if TANDEM_KERNELS_AVX512
// out[i] = sum of the 16 lanes of v[i]. Each output's lanes are added in
// the same tree, whatever i: within each 128-bit quarter (e0 + e2) + (e1 +
// e3), then quarters (q0 + q1) + (q2 + q3) (cpu::TransposeReduce16).
inline __m512 TransposeSum16(const __m512* v) {
  return cpu::TransposeReduce16(v, 16, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}
#endif

// K and V rows of keys k0, k0 + 1, ... of one KV head as AttendGroup reads
// them (keys 0, 1, ... of a partition starting at k0: From(k0)): key j's
// storage row r = Row(j) (looked up once per key), Load16<LD> of k(r) /
// v(r), times the scale ks(r) / vs(r) when kScaled.
//   PagedRows: in place in the paged cache (dtype D, through the block
//     table), the scales the cache's times kRawScale<D>;
//   HeadRows: f32 copies in scratch (HeadStore, made by GatherHead), holding
//     exactly the values Load16<D> gives, and the same scales.
// Both give AttendGroup bit-identical inputs, so a query's output does not
// depend on which one served it.
template <KvDtype D, int kHd>
struct PagedRows {
  static constexpr KvDtype kLoad = D;
  static constexpr int64_t kRowBytes = kHd * KvElementBytes(D);
  const PagedKvLayout* L;
  const int32_t* table;
  int64_t kvh;
  const KvCacheView* cache;
  int64_t k0 = 0;
  PagedRows From(int64_t first) const {
    PagedRows r = *this;
    r.k0 += first;
    return r;
  }
  int64_t Row(int64_t j) const {
    j += k0;
    const int64_t slot = int64_t(table[j / L->block_size]) * L->block_size + j % L->block_size;
    return slot * L->num_kv_heads + kvh;
  }
  const char* k(int64_t r) const { return static_cast<const char*>(cache->k) + r * kRowBytes; }
  const char* v(int64_t r) const { return static_cast<const char*>(cache->v) + r * kRowBytes; }
  float ks(int64_t r) const { return KvScaleToFp32(cache->k_scale[r]) * kRawScale<D>; }
  float vs(int64_t r) const { return KvScaleToFp32(cache->v_scale[r]) * kRawScale<D>; }
};

template <int kHd>
struct HeadRows {
  static constexpr KvDtype kLoad = KvDtype::kF32;
  const float *kf, *vf, *ksc, *vsc;  // [len][kHd], [len] from key k0
  HeadRows From(int64_t first) const {
    // The scales are null for dtypes without them (no offset on null).
    return {kf + first * kHd, vf + first * kHd, ksc != nullptr ? ksc + first : nullptr,
            vsc != nullptr ? vsc + first : nullptr};
  }
  static int64_t Row(int64_t j) { return j; }
  const char* k(int64_t r) const { return reinterpret_cast<const char*>(kf + r * kHd); }
  const char* v(int64_t r) const { return reinterpret_cast<const char*>(vf + r * kHd); }
  float ks(int64_t r) const { return ksc[r]; }
  float vs(int64_t r) const { return vsc[r]; }
};

// One KV head's keys [0, len) converted once, shared by every query of a
// tile (the rows of a prefill or of a speculative verification chunk).
template <int kHd>
struct HeadStore {
  std::vector<float> kf, vf, ksc, vsc;  // [len][kHd], [len]
  HeadRows<kHd> View() const { return {kf.data(), vf.data(), ksc.data(), vsc.data()}; }
};

template <KvDtype D, int kHd>
void GatherHead(const PagedRows<D, kHd>& src, int64_t len, HeadStore<kHd>& dst) {
  dst.kf.resize(len * kHd);
  dst.vf.resize(len * kHd);
  if constexpr (KvHasScales(D)) {
    dst.ksc.resize(len);
    dst.vsc.resize(len);
  }
  for (int64_t j = 0; j < len; ++j) {
    const int64_t r = src.Row(j);
    const char* kr = src.k(r);
    const char* vr = src.v(r);
    float* kd = dst.kf.data() + j * kHd;
    float* vd = dst.vf.data() + j * kHd;
    for (int c = 0; c < kChunks<kHd>; ++c) {
      Store16<D>(kr, c, kd + 16 * c);
      Store16<D>(vr, c, vd + 16 * c);
    }
    if constexpr (KvHasScales(D)) {
      dst.ksc[j] = src.ks(r);
      dst.vsc[j] = src.vs(r);
    }
  }
}

#if TANDEM_KERNELS_AVX512
// Lanes of a 16-key block with rem keys left: all from 16 on.
inline __mmask16 KeyMask(int64_t rem) { return rem >= 16 ? __mmask16(0xffff) : cpu::TailMask(rem); }

// One key's 16-lane partial dot with q (chunks qv[0..C)): even chunks into
// e, odd into o, in chunk order, then e + o (head_dim 64: e = q0 k0 + q2 k2,
// o = q1 k1 + q3 k3). Straight-line code (a fold, no loop) so that the
// caller's 16-key loop unrolls fully.
template <KvDtype LD, int... I>
inline __m512 KeyPartial(const __m512* qv, const char* k, std::integer_sequence<int, I...>) {
  __m512 e = _mm512_mul_ps(qv[0], Load16<LD>(k, 0));
  __m512 o = _mm512_mul_ps(qv[1], Load16<LD>(k, 1));
  const auto step = [&](auto c) {
    __m512& acc = c % 2 == 0 ? e : o;
    acc = _mm512_fmadd_ps(qv[c + 2], Load16<LD>(k, c + 2), acc);
  };
  (step(std::integral_constant<int, I>()), ...);
  return _mm512_add_ps(e, o);
}

// p[g * stride + j] = score of key j for head g (of `group`, <= kMaxGroup),
// head_dim kHd.
template <int kHd, bool kScaled, typename Rows>
void ScoreKeys(const Rows& rows, float score_scale, int64_t len, const float* q, int group,
               int64_t stride, float* p) {
  constexpr KvDtype LD = Rows::kLoad;
  constexpr int C = kChunks<kHd>;
  __m512 qv[kMaxGroup][C];
  for (int g = 0; g < group; ++g) {
    for (int c = 0; c < C; ++c) qv[g][c] = _mm512_loadu_ps(q + g * kHd + 16 * c);
  }
  // Scores 16 keys at a time: per key a 16-lane partial product, then one
  // transpose-reduce of the 16 partials gives the 16 dots in one register.
  // Every key's dot sums its lanes in the same fixed tree (TransposeSum16),
  // whichever slot of the 16 it has, so a score depends only on q and k.
  const __m512 scale = _mm512_set1_ps(score_scale);
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, len - j0);
    const char* kr[16];
    [[maybe_unused]] alignas(64) float ks[16];
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t j = j0 + std::min(i, nk - 1);  // pad with the last key (masked off)
      const int64_t r = rows.Row(j);
      kr[i] = rows.k(r);
      if constexpr (kScaled) ks[i] = rows.ks(r);
    }
    const __mmask16 m = KeyMask(nk);
    // A stored dtype other than f32 is widened once per key into kf (L1),
    // not once per head of the group (the widening is exact, so the
    // products are the same).
    [[maybe_unused]] alignas(64) float kf[16 * kHd];
    const bool widened = LD != KvDtype::kF32 && group > 1;
    if (widened) {
      for (int i = 0; i < 16; ++i) {
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) _mm512_store_ps(kf + i * kHd + 16 * c, Load16<LD>(kr[i], c));
        kr[i] = reinterpret_cast<const char*>(kf + i * kHd);
      }
    }
    for (int g = 0; g < group; ++g) {
      __m512 part[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        part[i] = widened ? KeyPartial<KvDtype::kF32>(qv[g], kr[i],
                                                      std::make_integer_sequence<int, C - 2>())
                          : KeyPartial<LD>(qv[g], kr[i], std::make_integer_sequence<int, C - 2>());
      }
      __m512 sc = _mm512_mul_ps(TransposeSum16(part), scale);
      if constexpr (kScaled) sc = _mm512_mul_ps(sc, _mm512_load_ps(ks));
      _mm512_mask_storeu_ps(p + g * stride + j0, m, sc);
    }
  }
}

// Softmax numerators of p[0..len) in place (Exp16); returns 1 / their sum
// (lane l takes keys l, l + 16, ..., then Reduce16's tree), and the max and
// the sum in *st.
inline float SoftmaxLanes(float* p, int64_t len, SoftmaxStats* st) {
  // max is exact in any order.
  __m512 mx16 = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = KeyMask(len - j);
    mx16 = _mm512_mask_max_ps(mx16, m, mx16, _mm512_maskz_loadu_ps(m, p + j));
  }
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx16));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = KeyMask(len - j);
    const __m512 e = cpu::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + j), mv));
    _mm512_mask_storeu_ps(p + j, m, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  st->max = _mm512_cvtss_f32(mv);
  st->sum = cpu::Reduce16(sum);
  return 1.f / st->sum;
}

// p[g * stride + j] *= inv[g] (then times key j's value scale when
// kScaled) for the `group` heads: each key's softmax weight, the same
// products the V loop formed one key at a time before, so no bits change.
template <bool kScaled, typename Rows>
void WeighKeys(const Rows& rows, int64_t len, int group, const float* inv, int64_t stride,
               float* p) {
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const __mmask16 m = KeyMask(len - j0);
    [[maybe_unused]] alignas(64) float vs[16] = {};
    if constexpr (kScaled) {
      for (int64_t i = 0; i < 16 && j0 + i < len; ++i) vs[i] = rows.vs(rows.Row(j0 + i));
    }
    for (int g = 0; g < group; ++g) {
      float* pg = p + g * stride + j0;
      __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pg), _mm512_set1_ps(inv[g]));
      if constexpr (kScaled) w = _mm512_mul_ps(w, _mm512_load_ps(vs));
      _mm512_mask_storeu_ps(pg, m, w);
    }
  }
}

// out[g * kHd ..] = sum over keys j of w[g * stride + j] v_j for kG heads
// (w: WeighKeys' weights), in key order. kG is a compile-time count so that
// the kG x C accumulators stay in registers (with a run-time head count GCC
// kept them on the stack, a store and a reload per key and chunk).
template <int kHd, int kG, typename Rows>
void AccumulateV(const Rows& rows, int64_t len, const float* w, int64_t stride, float* out) {
  constexpr KvDtype LD = Rows::kLoad;
  constexpr int C = kChunks<kHd>;
  __m512 acc[kG][C];
#pragma GCC unroll 8
  for (int g = 0; g < kG; ++g) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < len; ++j) {
    const int64_t r = rows.Row(j);
    const char* vr = rows.v(r);
    __m512 v[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      v[c] = Load16<LD>(vr, c);
      // In a register: GCC would otherwise fold the load into each head's
      // multiply-add (kG loads of the same row chunk instead of one).
      if constexpr (kG > 1) asm("" : "+v"(v[c]));
    }
#pragma GCC unroll 8
    for (int g = 0; g < kG; ++g) {
      const __m512 wj = _mm512_set1_ps(w[g * stride + j]);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(wj, v[c], acc[g][c]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < kG; ++g) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * kHd + 16 * c, acc[g][c]);
  }
}

// Heads per AccumulateV pass: at most 16 accumulators (head_dim 64: 4
// heads, 80-128: 2, 256: 1), so they and the C value chunks fit the 32
// registers.
template <int kHd>
constexpr int kVPass = kChunks<kHd> <= 4   ? 4
                       : kChunks<kHd> <= 8 ? 2
                                           : 1;

// AccumulateV for n (1 .. kVPass) heads.
template <int kHd, typename Rows, int... I>
void AccumulateVHeads(int n, const Rows& rows, int64_t len, const float* w, int64_t stride,
                      float* out, std::integer_sequence<int, I...>) {
  ((n == I + 1 ? AccumulateV<kHd, I + 1>(rows, len, w, stride, out) : void()), ...);
}

// out[g * kHd ..] for the `group` heads from their softmax numerators p
// (row g at p + g * stride) and 1 / their sums inv[g]: each head's V sum
// is computed alone, so the split into passes of kVPass heads does not
// change any bits.
template <int kHd, bool kScaled, typename Rows>
void SumValues(const Rows& rows, int64_t len, int group, const float* inv, int64_t stride, float* p,
               float* out) {
  WeighKeys<kScaled>(rows, len, group, inv, stride, p);
  for (int g0 = 0; g0 < group; g0 += kVPass<kHd>) {
    AccumulateVHeads<kHd>(std::min(kVPass<kHd>, group - g0), rows, len, p + g0 * stride, stride,
                          out + g0 * kHd, std::make_integer_sequence<int, kVPass<kHd>>());
  }
}
#else
// The AVX-512 kernels above without AVX-512: the same lanes, fused
// multiply-adds, exp steps and trees, one float at a time (loops the
// compiler vectorizes where it can), so its outputs are bit-identical. No
// multiply feeds an add outside an explicit std::fma, so contraction
// (-ffp-contract=fast) cannot change them.

// The 16 lanes of v summed in TransposeSum16's tree.
inline float LaneSum16(const float* v) {
  float q[4];
  for (int k = 0; k < 4; ++k) q[k] = (v[4 * k] + v[4 * k + 2]) + (v[4 * k + 1] + v[4 * k + 3]);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

// p[g * stride + j] = score of key j for head g.
template <int kHd, bool kScaled, typename Rows>
void ScoreKeys(const Rows& rows, float score_scale, int64_t len, const float* q, int group,
               int64_t stride, float* p) {
  constexpr int C = kChunks<kHd>;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t r = rows.Row(j);
    float k[kHd];
    for (int c = 0; c < C; ++c) Store16<Rows::kLoad>(rows.k(r), c, k + 16 * c);
    for (int g = 0; g < group; ++g) {
      const float* qg = q + g * kHd;
      float part[16];
      for (int l = 0; l < 16; ++l) {
        float e = qg[l] * k[l], o = qg[16 + l] * k[16 + l];
        for (int c = 2; c + 1 < C; c += 2) {
          e = std::fma(qg[16 * c + l], k[16 * c + l], e);
          o = std::fma(qg[16 * c + 16 + l], k[16 * c + 16 + l], o);
        }
        if constexpr (C % 2 == 1) e = std::fma(qg[16 * C - 16 + l], k[16 * C - 16 + l], e);
        part[l] = e + o;
      }
      float sc = LaneSum16(part) * score_scale;
      if constexpr (kScaled) sc *= rows.ks(r);
      p[g * stride + j] = sc;
    }
  }
}

// Softmax numerators of p[0..len) in place; returns 1 / their sum, summed
// as the AVX-512 path does: lane l takes keys l, l + 16, ..., then
// Reduce16's tree. (Exp and sum are separate loops: no product meets an
// add.)
inline float SoftmaxLanes(float* p, int64_t len, SoftmaxStats* st) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; ++j) mx = std::fmax(mx, p[j]);
  for (int64_t j = 0; j < len; ++j) p[j] = ExpLane(p[j] - mx);
  float sum[16] = {};
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    for (int64_t l = 0; l < 16 && j0 + l < len; ++l) sum[l] += p[j0 + l];
  }
  st->max = mx;
  st->sum = cpu::Reduce16Lanes(sum);
  return 1.f / st->sum;
}

// The AVX-512 SumValues one float at a time: w = p * inv (times the value
// scale), then acc = fma(w, v, acc) in key order.
template <int kHd, bool kScaled, typename Rows>
void SumValues(const Rows& rows, int64_t len, int group, const float* inv, int64_t stride, float* p,
               float* out) {
  float acc[kMaxGroup][kHd] = {};
  for (int64_t j = 0; j < len; ++j) {
    const int64_t r = rows.Row(j);
    float v[kHd];
    for (int c = 0; c < kChunks<kHd>; ++c) Store16<Rows::kLoad>(rows.v(r), c, v + 16 * c);
    for (int g = 0; g < group; ++g) {
      float w = p[g * stride + j] * inv[g];
      if constexpr (kScaled) w *= rows.vs(r);
      for (int i = 0; i < kHd; ++i) acc[g][i] = std::fma(w, v[i], acc[g][i]);
    }
  }
  for (int g = 0; g < group; ++g) std::memcpy(out + g * kHd, acc[g], sizeof(acc[g]));
}
#endif

// All `group` (<= kMaxGroup) heads of one KV head for one query, head_dim
// kHd, over keys [0, len) of `rows` (PagedRows or HeadRows, from a
// partition's first key; kScaled: int8 / fp8 scales): scores, softmax, V sums, each head
// alone. p: [group, len] scratch. st (optional): each head's softmax max and
// sum, for MergeParts.
template <int kHd, bool kScaled, typename Rows>
void AttendGroup(const Rows& rows, float score_scale, int64_t len, const float* q, int group,
                 std::vector<float>& p, float* out, SoftmaxStats* st = nullptr) {
  const int64_t stride = (len + 15) / 16 * 16;
  p.resize(group * stride);
  ScoreKeys<kHd, kScaled>(rows, score_scale, len, q, group, stride, p.data());
  float inv[kMaxGroup];
  SoftmaxStats unused[kMaxGroup];
  SoftmaxStats* stats = st != nullptr ? st : unused;
  for (int g = 0; g < group; ++g) inv[g] = SoftmaxLanes(p.data() + g * stride, len, &stats[g]);
  SumValues<kHd, kScaled>(rows, len, group, inv, stride, p.data(), out);
}

// Long contexts are attended in partitions (split-KV, as flash-decoding and
// the CUDA kernel): a context of len keys is cut into ceil(len /
// kPartKeys) partitions of equal size (a multiple of 16, the last one
// shorter); each is attended alone (AttendGroup: its own max, sum and
// normalized V sum) and MergeParts combines them in partition order. The
// cut depends on len only, so a query's output is the same whether its
// partitions run in one work item or in several (a single sequence's decode
// spreads them over the threads) and whatever the batch. Up to kPartKeys
// keys there is one partition and nothing to merge: the bits of the
// unpartitioned kernel.
constexpr int64_t kPartKeys = 256;

struct Partitions {
  int64_t size, count;
  explicit Partitions(int64_t len) {
    const int64_t want = (len + kPartKeys - 1) / kPartKeys;
    size = ((len + want - 1) / want + 15) / 16 * 16;
    count = (len + size - 1) / size;
  }
  int64_t begin(int64_t i) const { return i * size; }
  int64_t keys(int64_t len, int64_t i) const { return std::min(size, len - i * size); }
};

// out[g * kHd ..] for `group` heads = their attention outputs over all
// partitions, from each partition's normalized outputs (head g of partition
// i at o + i * o_stride + g * kHd) and softmax stats (st + i * st_stride +
// g): weights w_i = sum_i exp(max_i - max) over their total, in partition
// order. Only exactly rounded steps (ExpLane, fma, one multiply and one
// divide per weight), so every build gives the same bits. Overwrites each
// stats' sum with its w_i.
template <int kHd>
void MergeParts(int64_t parts, int64_t group, const float* o, int64_t o_stride, SoftmaxStats* st,
                int64_t st_stride, float* out) {
  for (int64_t g = 0; g < group; ++g) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < parts; ++i) {
      const float m = st[i * st_stride + g].max;
      mx = m > mx ? m : mx;  // (scores are finite)
    }
    float total = 0.f;
    for (int64_t i = 0; i < parts; ++i) {
      SoftmaxStats& s = st[i * st_stride + g];
      const float e = ExpLane(s.max - mx);
      total = std::fma(s.sum, e, total);
      s.sum = s.sum * e;
    }
    alignas(64) float acc[kHd] = {};
    for (int64_t i = 0; i < parts; ++i) {
      const float w = st[i * st_stride + g].sum / total;
      const float* oi = o + i * o_stride + g * kHd;
      for (int d = 0; d < kHd; ++d) acc[d] = std::fma(w, oi[d], acc[d]);
    }
    std::memcpy(out + g * kHd, acc, sizeof(acc));
  }
}

// Queries in a tile: consecutive tokens of one sequence sharing one
// conversion of their KV head's keys (at most kTileTokens). Tiles shrink
// while there would be fewer than 4 items per thread (a 5-token
// verification of one sequence on 2 threads), and below kMinTile tokens the
// conversion does not pay: 1 (each query reads the cache in place).
constexpr int64_t kTileTokens = 8;
constexpr int64_t kMinTile = 4;
constexpr int64_t kMaxTileFloats = 4096 * 64;  // K (and V) floats a tile converts, at most

int64_t TileTokens(const PagedAttentionArgs& a, int threads) {
  for (int64_t tile = kTileTokens; tile >= kMinTile; tile /= 2) {
    int64_t items = 0;
    for (int64_t s = 0; s < a.num_seqs; ++s) {
      items += (a.query_start[s + 1] - a.query_start[s] + tile - 1) / tile;
    }
    if (items * a.layout.num_kv_heads >= 4 * int64_t(threads)) return tile;
  }
  return 1;
}

// Partition outputs of single-token items, merged after the items ran
// (at most kMaxSpreadFloats: 16 MiB):
// [token][partition][head][hd] and [token][partition][head].
constexpr int64_t kMaxSpreadFloats = int64_t(4) << 20;
struct PartBuffer {
  int64_t max_parts = 0, heads = 0, hd = 0;
  std::vector<float> o;
  std::vector<SoftmaxStats> st;
  float* out(int64_t t, int64_t i, int64_t h) {
    return o.data() + ((t * max_parts + i) * heads + h) * hd;
  }
  SoftmaxStats* stats(int64_t t, int64_t i, int64_t h) {
    return st.data() + (t * max_parts + i) * heads + h;
  }
};

// Query token t (q, out: its rows of all heads), the `group` heads of KV
// head kvh, over its len keys: partitions [p0, p1) into `parts` when given
// (p1 - p0 of them), else all partitions merged into out (one partition:
// written there directly).
template <int kHd, bool kScaled, typename Rows>
void AttendQuery(const Rows& rows, float scale, int64_t len, int64_t p0, int64_t p1, const float* q,
                 int64_t group, int64_t kvh, std::vector<float>& p, float* out, PartBuffer* parts,
                 int64_t t) {
  const Partitions part(len);
  thread_local std::vector<float> po;
  thread_local std::vector<SoftmaxStats> pst;
  const bool direct = parts == nullptr && part.count == 1;
  if (parts == nullptr && !direct) {
    po.resize(part.count * group * kHd);
    pst.resize(part.count * group);
  }
  for (int64_t i = p0; i < p1; ++i) {
    // A group wider than kMaxGroup (multi-query attention) in parts: each
    // head's output is its own, so the split does not change any bits.
    for (int64_t g0 = 0; g0 < group; g0 += kMaxGroup) {
      const int n = int(std::min<int64_t>(kMaxGroup, group - g0));
      const float* qh = q + (kvh * group + g0) * kHd;
      float* o = direct  ? out + (kvh * group + g0) * kHd
                 : parts ? parts->out(t, i, kvh * group + g0)
                         : po.data() + (i * group + g0) * kHd;
      SoftmaxStats* st = direct  ? nullptr
                         : parts ? parts->stats(t, i, kvh * group + g0)
                                 : pst.data() + i * group + g0;
      AttendGroup<kHd, kScaled>(rows.From(part.begin(i)), scale, part.keys(len, i), qh, n, p, o,
                                st);
    }
  }
  if (parts != nullptr || direct) return;
  MergeParts<kHd>(part.count, group, po.data(), group * kHd, pst.data(), group,
                  out + kvh * group * kHd);
}

// One work item: tokens [t0, t1) of sequence `seq` (one tile), KV head kvh,
// each query's partitions [p0, p1) into `parts` (single-token items spread
// over the threads), or all of them merged into out (parts null). One token
// reads the cache in place; more convert the keys they need once (the
// longest context of the tile) into thread-local scratch.
template <KvDtype D, int kHd>
void AttendTile(const PagedAttentionArgs& a, int64_t seq, int64_t t0, int64_t t1, int64_t kvh,
                int64_t p0, int64_t p1, const float* q, const KvCacheView& cache, float* out,
                PartBuffer* parts) {
  constexpr bool kScaled = KvHasScales(D);
  thread_local std::vector<float> p;
  thread_local HeadStore<kHd> scratch;
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  const PagedRows<D, kHd> paged{&a.layout, a.block_tables + seq * a.max_blocks_per_seq, kvh,
                                &cache};
  int64_t len = 0;
  for (int64_t t = t0; t < t1; ++t) len = std::max<int64_t>(len, int64_t(a.positions[t]) + 1);
  // One token, or a context too long to copy: every token in place.
  const bool gather = t1 - t0 > 1 && len * kHd <= kMaxTileFloats;
  if (gather) GatherHead(paged, len, scratch);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = int64_t(a.positions[t]) + 1;
    const int64_t end = parts != nullptr ? p1 : Partitions(n).count;
    const float* qt = q + t * a.num_heads * kHd;
    float* ot = out + t * a.num_heads * kHd;
    if (gather) {
      AttendQuery<kHd, kScaled>(scratch.View(), a.scale, n, p0, end, qt, group, kvh, p, ot, parts,
                                t);
    } else {
      AttendQuery<kHd, kScaled>(paged, a.scale, n, p0, end, qt, group, kvh, p, ot, parts, t);
    }
  }
}

using TileFn = void (*)(const PagedAttentionArgs&, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, const float*, const KvCacheView&, float*, PartBuffer*);
template <int kHd>
TileFn TileFnFor(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return AttendTile<KvDtype::kF32, kHd>;
    case KvDtype::kF16:
      return AttendTile<KvDtype::kF16, kHd>;
    case KvDtype::kBf16:
      return AttendTile<KvDtype::kBf16, kHd>;
    case KvDtype::kInt8:
      return AttendTile<KvDtype::kInt8, kHd>;
    case KvDtype::kFp8:
      return AttendTile<KvDtype::kFp8, kHd>;
  }
  return nullptr;
}

using MergeFn = void (*)(int64_t, int64_t, const float*, int64_t, SoftmaxStats*, int64_t, float*);
struct GroupFns {
  TileFn tile = nullptr;  // nullptr: AttendOne
  MergeFn merge = nullptr;
};
template <int kHd>
GroupFns GroupFnsOf(KvDtype d) {
  return {TileFnFor<kHd>(d), MergeParts<kHd>};
}

// The group kernel and partition merge for this head dim and dtype.
GroupFns GroupFnsFor(int64_t head_dim, KvDtype d) {
  switch (head_dim) {
    case 64:
      return GroupFnsOf<64>(d);
    case 80:
      return GroupFnsOf<80>(d);
    case 96:
      return GroupFnsOf<96>(d);
    case 128:
      return GroupFnsOf<128>(d);
    case 256:
      return GroupFnsOf<256>(d);
    default:
      return {};
  }
}

// Few queries (a single sequence's decode or short verification): items
// (token, KV head, partition), so that one long context keeps every thread
// busy (3 KV heads on 2 threads were 2 items on one), then each query's
// partitions merged in order. False (nothing done) when no query has more
// than one partition.
bool SpreadPartitions(const PagedAttentionArgs& a, TileFn fn, MergeFn merge, const float* q,
                      const KvCacheView& cache, float* out, ThreadPool* pool,
                      const std::vector<int32_t>& seq_of) {
  const int64_t num_tokens = int64_t(seq_of.size());
  const int64_t kvh = a.layout.num_kv_heads;
  struct Item {
    int64_t t, h, part, parts;
  };
  std::vector<Item> items;
  int64_t max_parts = 1;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t count = Partitions(int64_t(a.positions[t]) + 1).count;
    max_parts = std::max(max_parts, count);
    for (int64_t h = 0; h < kvh; ++h) {
      for (int64_t i = 0; i < count; ++i) items.push_back({t, h, i, count});
    }
  }
  // Nothing to spread, or a buffer past kMaxSpreadFloats (very long contexts
  // on many threads): the partitions run inside their query's item instead.
  if (max_parts == 1 ||
      num_tokens * max_parts * a.num_heads * a.layout.head_dim > kMaxSpreadFloats) {
    return false;
  }
  // The caller's buffer: a thread_local named inside the lambda would be
  // each worker's own.
  thread_local PartBuffer caller_buf;
  PartBuffer& buf = caller_buf;
  buf.max_parts = max_parts;
  buf.heads = a.num_heads;
  buf.hd = a.layout.head_dim;
  buf.o.resize(num_tokens * max_parts * a.num_heads * buf.hd);
  buf.st.resize(num_tokens * max_parts * a.num_heads);
  PartBuffer* parts = &buf;
  ThreadPool::Run(pool, int64_t(items.size()), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const Item& it = items[k];
      // A one-partition query is written to out directly (parts null).
      fn(a, seq_of[it.t], it.t, it.t + 1, it.h, it.part, it.part + 1, q, cache, out,
         it.parts > 1 ? parts : nullptr);
    }
  });
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t count = Partitions(int64_t(a.positions[t]) + 1).count;
    if (count == 1) continue;
    merge(count, a.num_heads, buf.out(t, 0, 0), a.num_heads * buf.hd, buf.stats(t, 0, 0),
          a.num_heads, out + t * a.num_heads * buf.hd);
  }
  return true;
}

}  // namespace

void PagedAttention(const PagedAttentionArgs& a, const float* q, const KvCacheView& cache,
                    float* out, ThreadPool* pool) {
  const int64_t num_tokens = a.num_seqs > 0 ? a.query_start[a.num_seqs] : 0;
  if (num_tokens <= 0) return;
  std::vector<int32_t> seq_of(num_tokens);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    for (int64_t t = a.query_start[s]; t < a.query_start[s + 1]; ++t) seq_of[t] = int32_t(s);
  }
  const int64_t hd = a.layout.head_dim;
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  if (const GroupFns fns = GroupFnsFor(hd, cache.dtype); fns.tile != nullptr) {
    const TileFn fn = fns.tile;
    // Tiles of up to `tile` tokens of one sequence; items (tile, KV head).
    const int64_t kvh = a.layout.num_kv_heads;
    const int threads = pool == nullptr ? 1 : pool->num_threads();
    const int64_t tile = TileTokens(a, threads);
    if (threads > 1 && tile == 1 && num_tokens * kvh < 4 * int64_t(threads) &&
        SpreadPartitions(a, fn, fns.merge, q, cache, out, pool, seq_of)) {
      return;
    }
    std::vector<int32_t> tiles;  // first token of each tile, then num_tokens
    for (int64_t s = 0; s < a.num_seqs; ++s) {
      for (int64_t t = a.query_start[s]; t < a.query_start[s + 1]; t += tile) {
        tiles.push_back(int32_t(t));
      }
    }
    const int64_t num_tiles = int64_t(tiles.size());
    tiles.push_back(int32_t(num_tokens));
    ThreadPool::Run(pool, num_tiles * kvh, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / kvh, h = item % kvh;
        fn(a, seq_of[tiles[i]], tiles[i], tiles[i + 1], h, 0, 0, q, cache, out, nullptr);
      }
    });
    return;
  }
  ThreadPool::Run(pool, num_tokens * a.num_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> p, row;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / a.num_heads, h = item % a.num_heads;
      const int32_t* table = a.block_tables + seq_of[t] * a.max_blocks_per_seq;
      AttendOne(a, table, int64_t(a.positions[t]) + 1, q + item * hd, h / group, cache, p, row,
                out + item * hd);
    }
  });
}

TANDEM_KERNELS_VARIANT_END

#if TANDEM_KERNELS_VARIANT_PRIMARY
// f32 caches: the KvCacheView entry points (the chosen variant's).
void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, float* k_cache, float* v_cache) {
  KvCacheView view;
  view.k = k_cache;
  view.v = v_cache;
  WriteKv(layout, k, v, slot_mapping, n, view);
}

void PagedAttention(const PagedAttentionArgs& a, const float* q, const float* k_cache,
                    const float* v_cache, float* out, ThreadPool* pool) {
  KvCacheView view;
  view.k = const_cast<float*>(k_cache);
  view.v = const_cast<float*>(v_cache);
  PagedAttention(a, q, view, out, pool);
}
#endif
}  // namespace tandem::kernels
