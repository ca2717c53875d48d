// KV cache dtypes (kernels/kv_dtype.h): names and sizes, FP8 e4m3 coding,
// per-head quantize / dequantize error bounds, the fast KV write equal to the
// reference, and paged attention over each dtype against the scalar
// reference on the same quantized cache (tight) and the f32 reference
// (within the dtype's error), for head_dim 64 (the AVX-512 GQA path) and 128,
// GQA groups 1 / 3 / 4, block sizes 16 / 32 and context lengths that are not
// multiples of the block size.
#include "kernels/kv_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace tandem::kernels {
namespace {

constexpr KvDtype kAll[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8,
                            KvDtype::kFp8};

std::vector<float> RandomVec(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(KvDtypeTest, NamesParseAndSizes) {
  for (KvDtype d : kAll) {
    KvDtype back = KvDtype::kF32;
    ASSERT_TRUE(ParseKvDtype(KvDtypeName(d), &back)) << KvDtypeName(d);
    EXPECT_EQ(back, d);
  }
  KvDtype d = KvDtype::kF16;
  for (const char* bad : {"", "F16", "fp16", "e4m3", "int4", "f16 "}) {
    EXPECT_FALSE(ParseKvDtype(bad, &d)) << bad;
  }
  // SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64.
  EXPECT_EQ(KvBytesPerToken(KvDtype::kF32, 30, 3, 64), 46080);
  EXPECT_EQ(KvBytesPerToken(KvDtype::kF16, 30, 3, 64), 23040);
  EXPECT_EQ(KvBytesPerToken(KvDtype::kBf16, 30, 3, 64), 23040);
  // 11520 one-byte elements + 2 x 30 x 3 one-byte scales.
  EXPECT_EQ(KvBytesPerToken(KvDtype::kInt8, 30, 3, 64), 11700);
  EXPECT_EQ(KvBytesPerToken(KvDtype::kFp8, 30, 3, 64), 11700);
}

TEST(KvDtypeTest, Fp8E4m3CodesRoundTripAndRound) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN codes, never produced
    EXPECT_EQ(Fp32ToFp8E4m3(Fp8E4m3ToFp32(uint8_t(b))), b) << b;
  }
  EXPECT_EQ(Fp8E4m3ToFp32(0x7e), 448.f);
  EXPECT_EQ(Fp8E4m3ToFp32(0x38), 1.f);
  EXPECT_EQ(Fp8E4m3ToFp32(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(Fp8E4m3ToFp32(0x08), std::ldexp(1.f, -6));
  EXPECT_EQ(Fp8E4m3ToFp32(0xb8), -1.f);
  EXPECT_EQ(Fp32ToFp8E4m3(1e9f), 0x7e);  // saturates
  EXPECT_EQ(Fp32ToFp8E4m3(-1e9f), 0xfe);
  EXPECT_EQ(Fp32ToFp8E4m3(464.f), 0x7e);
  EXPECT_EQ(Fp32ToFp8E4m3(NAN), 0);
  EXPECT_EQ(Fp32ToFp8E4m3(1.0625f), 0x38);                      // tie between 1 and 1.125: even
  EXPECT_EQ(Fp32ToFp8E4m3(1.1875f), 0x3a);                      // tie between 1.125 and 1.25: even
  EXPECT_EQ(Fp32ToFp8E4m3(std::ldexp(1.f, -10)), 0x00);         // tie 0 / 2^-9: even
  EXPECT_EQ(Fp32ToFp8E4m3(std::ldexp(1.5f, -9)), 0x02);         // tie 1 / 2 steps: even
  EXPECT_EQ(Fp32ToFp8E4m3(std::ldexp(1.f, -6) * 0.99f), 0x08);  // rounds up into normals
  // Every f32 in range lands on the nearest code.
  const std::vector<float> xs = RandomVec(20000, 3, -500.f, 500.f);
  for (float x : xs) {
    const float y = Fp8E4m3ToFp32(Fp32ToFp8E4m3(x));
    const float ax = std::min(std::fabs(x), 448.f);
    EXPECT_LE(std::fabs(std::copysign(ax, x) - y), std::max(ax * 0.0625f, std::ldexp(1.f, -10)))
        << x;
  }
}

// The one-byte ue5m3 scale: every code's value, the round-up, the ends.
TEST(KvDtypeTest, KvScaleCodesAreUe5m3AndRoundUp) {
  EXPECT_EQ(KvScaleToFp32(0), std::ldexp(1.f, -15));
  EXPECT_EQ(KvScaleToFp32(1), std::ldexp(1.125f, -15));
  EXPECT_EQ(KvScaleToFp32(kKvScaleOne), 1.f);
  EXPECT_EQ(KvScaleToFp32(kKvScaleOne + 4), 1.5f);
  EXPECT_EQ(KvScaleToFp32(254), std::ldexp(1.75f, 16));
  EXPECT_TRUE(std::isnan(KvScaleToFp32(kKvScaleNan)));
  for (int c = 0; c < 255; ++c) {
    const float v = KvScaleToFp32(KvScale(c));
    EXPECT_EQ(v, std::ldexp(1.f + (c & 7) / 8.f, (c >> 3) - 15)) << c;
    EXPECT_EQ(KvScaleCeil(v), c) << c;  // exact values keep their code
    if (c > 0) {
      EXPECT_LT(KvScaleToFp32(KvScale(c - 1)), v) << c;  // monotonic
      EXPECT_EQ(KvScaleCeil(std::nextafter(KvScaleToFp32(KvScale(c - 1)), v)), c) << c;
    }
  }
  // Every s in range gets the smallest code >= s: a brute-force search.
  for (float s : RandomVec(5000, 7, -16.f, 17.f)) {
    s = std::exp2(s);
    int want = 254;
    while (want > 0 && KvScaleToFp32(KvScale(want - 1)) >= s) --want;
    const int got = KvScaleCeil(s);
    EXPECT_EQ(got, want) << s;
    if (s >= KvScaleToFp32(0) && s <= KvScaleToFp32(254)) {
      EXPECT_GE(KvScaleToFp32(KvScale(got)), s);
      EXPECT_LE(KvScaleToFp32(KvScale(got)), s * 1.125f);
    }
  }
  EXPECT_EQ(KvScaleCeil(0.f), 0);
  EXPECT_EQ(KvScaleCeil(-1.f), 0);
  EXPECT_EQ(KvScaleCeil(1e-30f), 0);
  EXPECT_EQ(KvScaleCeil(1e30f), 254);  // saturates: the values then clamp
  EXPECT_EQ(KvScaleCeil(INFINITY), 254);
  EXPECT_EQ(KvScaleCeil(NAN), kKvScaleNan);
}

TEST(KvDtypeTest, QuantizeDequantizeHeadWithinBounds) {
  for (KvDtype d : kAll) {
    for (int64_t hd : {64, 128, 20}) {
      for (uint32_t seed = 0; seed < 20; ++seed) {
        // A range of magnitudes, one outlier per head.
        std::vector<float> x = RandomVec(hd, seed, -2.f, 2.f);
        x[seed % hd] = 9.f * (seed % 2 ? 1.f : -1.f);
        if (seed % 5 == 0) x[(seed + 1) % hd] = 1e-4f;
        std::vector<char> q(hd * KvElementBytes(d));
        const KvScale s = QuantizeKvHead(d, x.data(), hd, q.data());
        std::vector<float> y(hd);
        DequantizeKvHead(d, q.data(), s, hd, y.data());
        const float amax = 9.f;
        // The stored scale: amax / 127 (448) rounded up, by at most 12.5 %.
        const float sv = KvScaleToFp32(s);
        for (int64_t i = 0; i < hd; ++i) {
          const float ax = std::fabs(x[i]);
          float bound = 0;
          switch (d) {
            case KvDtype::kF32:
              bound = 0;
              break;
            case KvDtype::kF16:
              bound = ax * std::ldexp(1.f, -11);
              break;
            case KvDtype::kBf16:
              bound = ax * std::ldexp(1.f, -8);
              break;
            case KvDtype::kInt8:
              bound = sv * 0.5f * 1.0001f;
              break;
            case KvDtype::kFp8:
              bound = std::max(ax * 0.0625f, sv * std::ldexp(1.f, -10)) * 1.0001f;
              break;
          }
          ASSERT_LE(std::fabs(y[i] - x[i]), bound)
              << KvDtypeName(d) << " hd " << hd << " seed " << seed << " i " << i;
        }
        if (d == KvDtype::kInt8) {
          // amax / 127 rounded up: at most one mantissa step (12.5 %) more.
          EXPECT_EQ(s, KvScaleCeil(amax / 127.f));
          EXPECT_GE(sv, amax / 127.f);
          EXPECT_LE(sv, amax / 127.f * 1.125f);
        } else if (d == KvDtype::kFp8) {
          // Within an octave above amax / 448 rounded up (Fp8ScaleForMax).
          EXPECT_GE(s, KvScaleCeil(amax / 448.f));
          EXPECT_LT(s, KvScaleCeil(amax / 448.f) + 8);
        } else {
          EXPECT_EQ(s, kKvScaleOne);
        }
      }
    }
    // A zero head stays zero (no division by a zero scale).
    std::vector<float> zero(64, 0.f), y(64, 1.f);
    std::vector<char> q(64 * KvElementBytes(d));
    const KvScale s = QuantizeKvHead(d, zero.data(), 64, q.data());
    DequantizeKvHead(d, q.data(), s, 64, y.data());
    for (float v : y) EXPECT_EQ(v, 0.f) << KvDtypeName(d);
    if (KvHasScales(d)) {
      // A non-finite value makes the head NaN (kKvScaleNan), not a silent clamp.
      std::vector<float> bad(64, 0.5f);
      bad[7] = (d == KvDtype::kInt8) ? INFINITY : NAN;
      EXPECT_EQ(QuantizeKvHead(d, bad.data(), 64, q.data()), kKvScaleNan) << KvDtypeName(d);
      DequantizeKvHead(d, q.data(), kKvScaleNan, 64, y.data());
      EXPECT_TRUE(std::isnan(y[0])) << KvDtypeName(d);
      // The largest finite value a code can hold: 127 x 1.75 x 2^16, and
      // beyond it the values clamp to +-127 steps of that scale.
      std::vector<float> huge(64, 1e9f);
      huge[1] = -1e9f;
      EXPECT_EQ(QuantizeKvHead(d, huge.data(), 64, q.data()), 254) << KvDtypeName(d);
      DequantizeKvHead(d, q.data(), 254, 64, y.data());
      const float top = (d == KvDtype::kInt8 ? 127.f : 448.f) * std::ldexp(1.75f, 16);
      EXPECT_EQ(y[0], top) << KvDtypeName(d);
      EXPECT_EQ(y[1], -top) << KvDtypeName(d);
    }
  }
}

// The vectorized row quantizers (AVX-512 f16 and fp8) equal the scalar
// element coders bit for bit, subnormals, ties and the saturation included.
TEST(KvDtypeTest, RowQuantizersEqualTheElementCoders) {
  std::vector<float> x = RandomVec(4096, 41, -1.f, 1.f);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-4f;  // fp8 subnormals after scaling
  x[5] = 0.f;
  x[6] = -0.f;
  x[9] = -1.f;  // amax
  for (int64_t off = 0; off + 69 <= int64_t(x.size()); off += 69) {
    const float* h = x.data() + off;
    std::vector<uint8_t> q8(69);
    const KvScale s = QuantizeKvHead(KvDtype::kFp8, h, 69, q8.data());
    float amax = 0;
    for (int i = 0; i < 69; ++i) amax = std::max(amax, std::fabs(h[i]));
    const float inv = 1.f / KvScaleToFp32(s);
    for (int i = 0; i < 69; ++i) {
      ASSERT_EQ(q8[i], Fp32ToFp8E4m3(h[i] * inv)) << off << " " << i;
    }
    std::vector<uint16_t> q16(69);
    QuantizeKvHead(KvDtype::kF16, h, 69, q16.data());
    for (int i = 0; i < 69; ++i) ASSERT_EQ(q16[i], Fp32ToFp16(h[i])) << off << " " << i;
  }
}

// fp8 picks, among the 8 scale codes from amax / 448 rounded up, the one
// that stores the head's largest |value| most exactly (the first of equals):
// checked against a brute-force search, and that choice halves the largest
// value's mean error against the plain round-up.
TEST(KvDtypeTest, Fp8ScaleStoresTheLargestValueBest) {
  const auto max_err = [](float amax, int c) {
    const float v = amax / KvScaleToFp32(KvScale(c));
    return std::fabs(Fp8E4m3ToFp32(Fp32ToFp8E4m3(v)) * KvScaleToFp32(KvScale(c)) - amax) / amax;
  };
  double chosen_sum = 0, ceil_sum = 0;
  const std::vector<float> e = RandomVec(2000, 17, -12.f, 12.f);
  for (size_t t = 0; t < e.size(); ++t) {
    std::vector<float> x = RandomVec(64, uint32_t(100 + t), -1.f, 1.f);
    const float amax = std::exp2(e[t]);
    for (float& v : x) v *= 0.9f * amax;
    x[t % 64] = (t % 2 ? -1.f : 1.f) * amax;
    std::vector<uint8_t> q(64);
    const KvScale s = QuantizeKvHead(KvDtype::kFp8, x.data(), 64, q.data());
    const int first = KvScaleCeil(amax / 448.f);
    int best = first;
    for (int c = first; c < first + 8 && c < kKvScaleNan; ++c) {
      const float v = amax * (1.f / KvScaleToFp32(KvScale(c)));
      const float b = amax * (1.f / KvScaleToFp32(KvScale(best)));
      if (std::fabs(Fp8E4m3ToFp32(Fp32ToFp8E4m3(v)) - v) / v <
          std::fabs(Fp8E4m3ToFp32(Fp32ToFp8E4m3(b)) - b) / b) {
        best = c;
      }
    }
    ASSERT_EQ(s, best) << amax;
    // The stored largest value is its rounding at that scale.
    EXPECT_EQ(Fp8E4m3ToFp32(q[t % 64] & 0x7f) * KvScaleToFp32(s),
              Fp8E4m3ToFp32(Fp32ToFp8E4m3(amax * (1.f / KvScaleToFp32(s)))) * KvScaleToFp32(s));
    chosen_sum += max_err(amax, s);
    ceil_sum += max_err(amax, first);
  }
  EXPECT_LT(chosen_sum, 0.5 * ceil_sum);
}

// One layer's cache of any dtype, filled from f32 rows.
struct DtypeCache {
  DtypeCache(KvDtype d, const PagedKvLayout& L) : dtype(d) {
    const int64_t rows = L.num_blocks * L.block_size * L.num_kv_heads;
    k.assign(rows * L.head_dim * KvElementBytes(d), 0);
    v = k;
    if (KvHasScales(d)) ks.assign(rows, 0), vs.assign(rows, 0);
  }
  KvCacheView view() {
    return {dtype, k.data(), v.data(), ks.empty() ? nullptr : ks.data(),
            vs.empty() ? nullptr : vs.data()};
  }
  KvDtype dtype;
  std::vector<char> k, v;
  std::vector<KvScale> ks, vs;
};

struct AttnCase {
  int64_t head_dim, num_kv_heads, group, block_size;
};

// Max |a - b| over max |b|.
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return e / std::max(m, 1e-30);
}

TEST(KvDtypeAttentionTest, EachDtypeMatchesTheReferences) {
  // AttendGroup's head dims (64, 80, 96, 128, 256; groups of 1 to 8 and
  // wider, split in parts) and AttendOne's (20, 48).
  const AttnCase cases[] = {{64, 3, 3, 16},  {64, 2, 1, 32},  {64, 1, 8, 16},   {64, 1, 12, 16},
                            {128, 2, 4, 16}, {128, 1, 3, 32}, {128, 1, 16, 16}, {80, 2, 2, 16},
                            {96, 1, 3, 32},  {256, 2, 2, 16}, {20, 2, 3, 16},   {48, 1, 9, 32}};
  ThreadPool pool(3);
  for (const AttnCase& c : cases) {
    const int64_t num_blocks = 24;
    const PagedKvLayout L{num_blocks, c.block_size, c.num_kv_heads, c.head_dim};
    const int64_t slots = num_blocks * c.block_size;
    const int64_t width = c.num_kv_heads * c.head_dim;
    // K with a wider spread than V so scores are not flat.
    const std::vector<float> kf = RandomVec(slots * width, 21, -3.f, 3.f);
    const std::vector<float> vf = RandomVec(slots * width, 22);
    std::vector<int64_t> all(slots);
    std::iota(all.begin(), all.end(), 0);
    // Three sequences, contexts not multiples of the block size: seq 0
    // decodes its 37th (or 71st) token, seq 1 prefills 5 tokens ending at
    // 3 blocks + 1, seq 2 has a single token.
    const int32_t len0 = int32_t(2 * c.block_size + 5), len1 = int32_t(3 * c.block_size + 1);
    const std::vector<int32_t> query_start = {0, 1, 6, 7};
    std::vector<int32_t> positions = {len0 - 1};
    for (int32_t p = len1 - 5; p < len1; ++p) positions.push_back(p);
    positions.push_back(0);
    const std::vector<int32_t> context_lens = {len0, len1, 1};
    const int64_t max_blocks = 4;
    const std::vector<int32_t> tables = {17, 3,  9, 0,   //
                                         5,  22, 1, 12,  //
                                         8,  0,  0, 0};
    const int64_t num_heads = c.num_kv_heads * c.group;
    PagedAttentionArgs args{L,
                            num_heads,
                            1.f / std::sqrt(float(c.head_dim)),
                            3,
                            query_start.data(),
                            positions.data(),
                            context_lens.data(),
                            tables.data(),
                            max_blocks};
    const int64_t T = 7, qw = num_heads * c.head_dim;
    const std::vector<float> q = RandomVec(T * qw, 23);
    std::vector<float> exact(T * qw);
    ref::PagedAttention(args, q.data(), kf.data(), vf.data(), exact.data());
    for (KvDtype d : kAll) {
      SCOPED_TRACE(testing::Message()
                   << KvDtypeName(d) << " hd " << c.head_dim << " kvh " << c.num_kv_heads
                   << " group " << c.group << " bs " << c.block_size);
      DtypeCache fast(d, L), slow(d, L);
      WriteKv(L, kf.data(), vf.data(), all.data(), slots, fast.view());
      ref::WriteKv(L, kf.data(), vf.data(), all.data(), slots, slow.view());
      EXPECT_EQ(fast.k, slow.k);
      EXPECT_EQ(fast.v, slow.v);
      EXPECT_EQ(fast.ks, slow.ks);
      EXPECT_EQ(fast.vs, slow.vs);
      std::vector<float> got(T * qw), want(T * qw);
      PagedAttention(args, q.data(), fast.view(), got.data(), &pool);
      ref::PagedAttention(args, q.data(), fast.view(), want.data());
      // Same quantized cache: only f32 summation order differs.
      EXPECT_LT(RelErr(got, want), 2e-5);
      // Against the f32 cache: the dtype's rounding.
      // (Measured: f16 2.5e-4, bf16 2e-3, int8 4e-3, fp8 3.6e-2.)
      const double bound = d == KvDtype::kF32    ? 2e-5
                           : d == KvDtype::kF16  ? 1e-3
                           : d == KvDtype::kBf16 ? 6e-3
                           : d == KvDtype::kInt8 ? 1e-2
                                                 : 6e-2;
      const double err = RelErr(got, exact);
      std::printf("%-4s hd %3lld group %lld bs %lld: rel err vs f32 %.2e, vs same-cache ref %.2e\n",
                  KvDtypeName(d), (long long)c.head_dim, (long long)c.group,
                  (long long)c.block_size, err, RelErr(got, want));
      EXPECT_LT(err, bound);
      if (d != KvDtype::kF32) {
        EXPECT_GT(err, 0.0);  // the cache really is not f32
      }
      // Single-threaded and alone in its batch: bit-identical rows.
      std::vector<float> single(T * qw);
      PagedAttention(args, q.data(), fast.view(), single.data(), nullptr);
      EXPECT_EQ(0, std::memcmp(single.data(), got.data(), got.size() * sizeof(float)));
    }
  }
}

// The f32 view runs exactly the f32 pointer API.
TEST(KvDtypeAttentionTest, F32ViewIsTheF32Path) {
  const PagedKvLayout L{6, 16, 2, 64};
  const int64_t width = 2 * 64, slots = 96;
  std::vector<float> kf = RandomVec(slots * width, 31), vf = RandomVec(slots * width, 32);
  const std::vector<int32_t> qs = {0, 1}, pos = {40}, ctx = {41}, table = {4, 0, 2};
  PagedAttentionArgs args{L, 6, 0.125f, 1, qs.data(), pos.data(), ctx.data(), table.data(), 3};
  const std::vector<float> q = RandomVec(6 * 64, 33);
  std::vector<float> a(6 * 64), b(6 * 64);
  PagedAttention(args, q.data(), kf.data(), vf.data(), a.data(), nullptr);
  KvCacheView view;
  view.k = kf.data();
  view.v = vf.data();
  PagedAttention(args, q.data(), view, b.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// Prefill and verification chunks run as tiles of several tokens sharing one
// conversion of their KV head's rows (kernels/cpu/attention.cc); a token's
// output must not depend on that: every token of a batch of chunks (tiles of
// 8, a ragged last tile, a chunk past kMaxTileFloats / head_dim keys that reads in
// place, a single decode token) is bit-identical to the same token alone in
// its batch, single-threaded and on 3 threads (a long context's partitions
// spread over the threads), for every dtype; and 3 threads give the rows 1
// thread gives.
class TilesTest : public testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(TilesTest, TokensInTilesEqualTokensAlone) {
  const auto [hd, group] = GetParam();  // head dim, GQA group
  const int64_t kvh = 2, bs = 16, num_blocks = 270;
  const PagedKvLayout L{num_blocks, bs, kvh, hd};
  const int64_t slots = num_blocks * bs, width = kvh * hd, num_heads = kvh * group;
  const std::vector<float> kf = RandomVec(slots * width, 41, -3.f, 3.f);
  const std::vector<float> vf = RandomVec(slots * width, 42);
  std::vector<int64_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  // Seq 0: 19 tokens at 40..58; seq 1: 6 tokens at 4100..4105 (more keys than
  // a tile converts); seq 2: one token at 300; seq 3: 5 tokens at 0..4; seq
  // 4: 9 tokens at 600..608 (a converted tile whose tokens have 3 partitions
  // each, then a ragged one).
  const std::vector<int32_t> query_start = {0, 19, 25, 26, 31, 40};
  std::vector<int32_t> positions;
  for (int32_t p = 40; p < 59; ++p) positions.push_back(p);
  for (int32_t p = 4100; p < 4106; ++p) positions.push_back(p);
  positions.push_back(300);
  for (int32_t p = 0; p < 5; ++p) positions.push_back(p);
  for (int32_t p = 600; p < 609; ++p) positions.push_back(p);
  const std::vector<int32_t> context_lens = {59, 4106, 301, 5, 609};
  const int64_t max_blocks = 257, T = 40, qw = num_heads * hd;
  std::vector<int32_t> tables(5 * max_blocks);
  std::mt19937 rng(43);
  for (int32_t& b : tables) b = int32_t(rng() % num_blocks);  // shuffled, shared blocks
  PagedAttentionArgs args{L,
                          num_heads,
                          0.125f,
                          5,
                          query_start.data(),
                          positions.data(),
                          context_lens.data(),
                          tables.data(),
                          max_blocks};
  const std::vector<float> q = RandomVec(T * qw, 44);
  ThreadPool pool(3);
  for (KvDtype d : kAll) {
    SCOPED_TRACE(KvDtypeName(d));
    DtypeCache cache(d, L);
    WriteKv(L, kf.data(), vf.data(), all.data(), slots, cache.view());
    std::vector<float> batched(T * qw), inline_run(T * qw), want(T * qw);
    PagedAttention(args, q.data(), cache.view(), batched.data(), &pool);
    PagedAttention(args, q.data(), cache.view(), inline_run.data(), nullptr);
    EXPECT_EQ(0, std::memcmp(batched.data(), inline_run.data(), batched.size() * sizeof(float)));
    ref::PagedAttention(args, q.data(), cache.view(), want.data());
    EXPECT_LT(RelErr(batched, want), 2e-5);
    for (int64_t s = 0; s < 5; ++s) {
      for (int64_t t = query_start[s]; t < query_start[s + 1]; ++t) {
        const int32_t qs1[2] = {0, 1};
        PagedAttentionArgs alone = args;
        alone.num_seqs = 1;
        alone.query_start = qs1;
        alone.positions = positions.data() + t;
        alone.context_lens = context_lens.data() + s;
        alone.block_tables = tables.data() + s * max_blocks;
        std::vector<float> one(qw), one_pooled(qw);
        PagedAttention(alone, q.data() + t * qw, cache.view(), one.data(), nullptr);
        ASSERT_EQ(0, std::memcmp(one.data(), batched.data() + t * qw, qw * sizeof(float)))
            << "token " << t << " of sequence " << s;
        // Alone on 3 threads: a long context's partitions run as items of
        // their own and are merged afterwards; still the same bits.
        PagedAttention(alone, q.data() + t * qw, cache.view(), one_pooled.data(), &pool);
        ASSERT_EQ(0, std::memcmp(one_pooled.data(), one.data(), qw * sizeof(float)))
            << "token " << t << " of sequence " << s << " on 3 threads";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadDims, TilesTest,
    testing::Values(std::pair<int64_t, int64_t>{64, 3}, std::pair<int64_t, int64_t>{128, 4},
                    std::pair<int64_t, int64_t>{128, 12}, std::pair<int64_t, int64_t>{96, 2},
                    // V passes of 2, 2 and 1 heads; of 1; of 4 and 4.
                    std::pair<int64_t, int64_t>{80, 5}, std::pair<int64_t, int64_t>{256, 2},
                    std::pair<int64_t, int64_t>{64, 8}));

}  // namespace
}  // namespace tandem::kernels
