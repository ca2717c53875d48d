// Dispatched CPU kernels vs the scalar references, on random inputs of
// awkward sizes, plus the determinism rule (bit-identical results whatever the
// batch size, batch composition or thread count).
#include "kernels/kernels.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/simd.h"
#include "kernels/quant.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct QuantMatrix {
  std::string bytes;
  WeightView view;
};

QuantMatrix MakeMatrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  QuantMatrix m;
  const int64_t row_bytes = static_cast<int64_t>(*gguf::RowBytes(type, cols));
  m.bytes.resize(rows * row_bytes);
  const std::vector<float> v = Random(rows * cols, seed);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(type, v.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
  }
  m.view = WeightView{type, m.bytes.data(), rows, cols, row_bytes};
  return m;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.f + std::fabs(want[i]))) << "at " << i;
  }
}

TEST(ThreadPoolTest, EveryIndexOnceForAnySize) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 3, 7, 1000}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int h : hits) EXPECT_EQ(h, 1);
  }
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 200; ++rep) {
    pool.ParallelFor(10, [&](int64_t b, int64_t e) { sum += e - b; });
  }
  EXPECT_EQ(sum.load(), 2000);
}

class MatMulTest : public ::testing::TestWithParam<TensorType> {};

TEST_P(MatMulTest, MatchesReference) {
  const TensorType type = GetParam();
  const int64_t block = gguf::GetTypeTraits(type)->block_size;
  for (int64_t cols : {block * 3, block * 18 + (block == 1 ? 5 : 0)}) {
    for (int64_t rows : {1, 13, 37}) {
      for (int64_t n : {1, 2, 5}) {
        QuantMatrix m = MakeMatrix(type, rows, cols, uint32_t(rows * 7 + cols));
        const std::vector<float> x = Random(n * cols, 99);
        std::vector<float> got(n * rows), want(n * rows);
        ThreadPool pool(2);
        MatMul(m.view, x.data(), n, got.data(), &pool);
        ref::MatMul(m.view, x.data(), n, want.data());
        ExpectClose(got, want, 2e-5f * std::sqrt(float(cols)));
      }
    }
  }
}

// The dot for (token t, row r) is bit-identical whether the batch has 1 or 37
// tokens, what the other tokens are, and how many threads run it.
TEST_P(MatMulTest, DeterministicAcrossBatchAndThreads) {
  const TensorType type = GetParam();
  const int64_t block = gguf::GetTypeTraits(type)->block_size;
  const int64_t rows = 45, cols = block * (block == 1 ? 99 : 6);
  QuantMatrix m = MakeMatrix(type, rows, cols, 5);
  const int64_t n = 37;
  const std::vector<float> x = Random(n * cols, 6);
  std::vector<float> batched(n * rows);
  ThreadPool pool3(3);
  MatMul(m.view, x.data(), n, batched.data(), &pool3);
  for (int64_t t : {0, 17, 36}) {
    std::vector<float> single(rows);
    MatMul(m.view, x.data() + t * cols, 1, single.data(), nullptr);
    EXPECT_EQ(0, std::memcmp(single.data(), batched.data() + t * rows, rows * sizeof(float)));
  }
  std::vector<float> other(n * rows);
  ThreadPool pool2(2);
  MatMul(m.view, x.data(), n, other.data(), &pool2);
  EXPECT_EQ(batched, other);
}

// The GEMM path (3-4 tokens: 8-row tiles, Dot4Rows per token; 5 or more:
// 32-row blocks, 4 rows x up to 6 tokens per DotTile4, even and odd chunks
// in two passes) gives every (token, row) exactly DotF32 of the dequantized
// row: chunk counts odd and even, with and without a tail, below one chunk,
// token counts that take both forms and leave every tile width, rows that
// leave short row groups and blocks.
TEST_P(MatMulTest, GemmPathIsDotF32OfEveryRow) {
  const TensorType type = GetParam();
  const int64_t block = gguf::GetTypeTraits(type)->block_size;
  const std::vector<int64_t> cols_list = block == 1
                                             ? std::vector<int64_t>{5, 16, 31, 32, 48, 99, 581}
                                             : std::vector<int64_t>{block, block * 3, block * 18};
  for (int64_t cols : cols_list) {
    for (int64_t rows : {3, 45, 70}) {
      QuantMatrix m = MakeMatrix(type, rows, cols, uint32_t(rows + cols));
      std::vector<float> deq(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(type, m.view.row(r), deq.data() + r * cols, cols);
      }
      for (int64_t n : {3, 4, 5, 6, 7, 13}) {
        const std::vector<float> x = Random(n * cols, uint32_t(n * 31 + cols), 2.f);
        std::vector<float> got(n * rows);
        ThreadPool pool(2);
        MatMul(m.view, x.data(), n, got.data(), &pool);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            const float want = cpu::DotF32(deq.data() + r * cols, x.data() + t * cols, cols);
            ASSERT_EQ(0, std::memcmp(&want, &got[t * rows + r], sizeof(float)))
                << "cols " << cols << " rows " << rows << " n " << n << " t " << t << " r " << r;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatMulTest,
                         ::testing::Values(TensorType::kF32, TensorType::kF16, TensorType::kBF16,
                                           TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1,
                                           TensorType::kQ5_0, TensorType::kQ5_1),
                         [](const auto& info) {
                           return std::string(gguf::GetTypeTraits(info.param)->name);
                         });

// One dispatch for several matrices sharing x (mixed types, rows that are
// not a multiple of the tile) gives each matrix's MatMul bit for bit.
TEST(MatMulSharedTest, EqualsSeparateMatMuls) {
  const int64_t cols = 96;
  const QuantMatrix a = MakeMatrix(TensorType::kF16, 37, cols, 1);
  const QuantMatrix b = MakeMatrix(TensorType::kQ8_0, 5, cols, 2);
  const QuantMatrix c = MakeMatrix(TensorType::kBF16, 64, cols, 3);
  const WeightView ws[3] = {a.view, b.view, c.view};
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7}) {
    const std::vector<float> x = Random(n * cols, uint32_t(n));
    std::vector<float> y[3], want[3];
    float* ys[3];
    for (int i = 0; i < 3; ++i) {
      y[i].assign(n * ws[i].rows, -1.f);
      want[i].assign(n * ws[i].rows, -2.f);
      ys[i] = y[i].data();
      MatMul(ws[i], x.data(), n, want[i].data(), nullptr);
    }
    MatMulShared(ws, ys, 3, x.data(), n, &pool);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], want[i]) << "matrix " << i << " n " << n;
  }
}

#if TANDEM_KERNELS_AVX512
// The transposed reduction is 16 Reduce16 calls bit for bit, on values whose
// sum depends on the order (magnitudes from 1e-8 to 1e8, both signs).
TEST(SimdTest, Reduce16x16IsReduce16OfEachVector) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> expo(-27, 27);
  for (int rep = 0; rep < 200; ++rep) {
    alignas(64) float in[16][16];
    for (auto& row : in) {
      for (float& x : row) x = std::ldexp(mant(rng), expo(rng));
    }
    __m512 v[16];
    for (int j = 0; j < 16; ++j) v[j] = _mm512_load_ps(in[j]);
    alignas(64) float got[16];
    _mm512_store_ps(got, cpu::Reduce16x16(v));
    for (int j = 0; j < 16; ++j) {
      const float want = cpu::Reduce16(v[j]);
      ASSERT_EQ(0, std::memcmp(&want, &got[4 * (j % 4) + j / 4], sizeof(float))) << "vector " << j;
    }
  }
}
#endif

TEST(DequantTest, FastPathMatchesReference) {
  for (TensorType type : {TensorType::kF16, TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0,
                          TensorType::kQ4_1, TensorType::kQ5_1}) {
    QuantMatrix m = MakeMatrix(type, 1, 32 * 7, 3);
    std::vector<float> fast(32 * 7), want(32 * 7);
    cpu::DequantizeRowFast(type, m.view.data, fast.data(), 32 * 7);
    DequantizeRow(type, m.view.data, want.data(), 32 * 7);
    ExpectClose(fast, want, 1e-6f);
  }
  // f16 / bf16 widen exactly, tails included.
  for (TensorType type : {TensorType::kF16, TensorType::kBF16}) {
    QuantMatrix m = MakeMatrix(type, 1, 37, 4);
    std::vector<float> fast(37), want(37);
    cpu::DequantizeRowFast(type, m.view.data, fast.data(), 37);
    DequantizeRow(type, m.view.data, want.data(), 37);
    EXPECT_EQ(fast, want);
  }
}

TEST(EmbeddingTest, MatchesReference) {
  QuantMatrix m = MakeMatrix(TensorType::kQ8_0, 50, 64, 1);
  const std::vector<int32_t> ids = {3, 0, 49, 3};
  std::vector<float> got(4 * 64), want(4 * 64);
  EmbeddingLookup(m.view, ids.data(), 4, got.data());
  ref::EmbeddingLookup(m.view, ids.data(), 4, want.data());
  EXPECT_EQ(got, want);
}

// The vector RmsNorm computes the reference's double arithmetic in its order
// (8 lanes, fixed tree): bit-identical for every width, including the masked
// tails, and for rows with a wide spread of magnitudes. (A different double
// sum order would almost never show after the rounding to f32, so this
// checks the loads, tails and conversions; the order is kept by construction.)
TEST(ElementwiseTest, RmsNormBitIdenticalToReference) {
  for (int64_t dim : {1, 7, 8, 9, 64, 77, 576, 1537}) {
    for (float scale : {1e-3f, 1.f, 3e4f}) {
      const int64_t n = 3;
      std::vector<float> a = Random(n * dim, uint32_t(dim), scale);
      for (int64_t i = 0; i < n * dim; i += 5) a[size_t(i)] *= 1e5f;  // outliers
      const std::vector<float> w = Random(dim, 4);
      std::vector<float> got(n * dim), want(n * dim);
      RmsNorm(a.data(), w.data(), n, dim, 1e-5f, got.data());
      ref::RmsNorm(a.data(), w.data(), n, dim, 1e-5f, want.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "dim " << dim << " scale " << scale;
    }
  }
}

TEST(ElementwiseTest, MatchReferences) {
  const int64_t n = 3, dim = 77;
  const std::vector<float> a = Random(n * dim, 1, 3.f), b = Random(n * dim, 2, 3.f);
  const std::vector<float> w = Random(dim, 3);
  std::vector<float> got(n * dim), want(n * dim);
  RmsNorm(a.data(), w.data(), n, dim, 1e-5f, got.data());
  ref::RmsNorm(a.data(), w.data(), n, dim, 1e-5f, want.data());
  ExpectClose(got, want, 1e-6f);
  SiluMul(a.data(), b.data(), n * dim, got.data());
  ref::SiluMul(a.data(), b.data(), n * dim, want.data());
  ExpectClose(got, want, 1e-6f);
  Add(a.data(), b.data(), n * dim, got.data());
  ref::Add(a.data(), b.data(), n * dim, want.data());
  EXPECT_EQ(got, want);
  got = a;
  want = a;
  Softmax(got.data(), n, dim);
  ref::Softmax(want.data(), n, dim);
  ExpectClose(got, want, 1e-6f);
  EXPECT_NEAR(std::accumulate(got.begin(), got.begin() + dim, 0.0), 1.0, 1e-5);
}

TEST(RopeTest, MatchesReferenceAndRotates) {
  const int64_t n = 4, heads = 3, hd = 10;
  const std::vector<int32_t> pos = {0, 1, 7, 300};
  const std::vector<float> ff = {1.f, 2.f, 4.f, 1.5f};
  for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kNeox}) {
    for (const float* factors : {static_cast<const float*>(nullptr), ff.data()}) {
      RopeParams p{style, 8, 10000.f, 0.5f, factors};
      std::vector<float> got = Random(n * heads * hd, 4), want = got, orig = got;
      Rope(got.data(), pos.data(), n, heads, hd, p);
      ref::Rope(want.data(), pos.data(), n, heads, hd, p);
      EXPECT_EQ(got, want);
      // Position 0 is the identity; dims past rot_dim are untouched.
      for (int64_t i = 0; i < heads * hd; ++i) EXPECT_EQ(got[i], orig[i]);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t d = 8; d < hd; ++d) {
            EXPECT_EQ(got[(t * heads + h) * hd + d], orig[(t * heads + h) * hd + d]);
          }
        }
      }
    }
  }
  // Adjacent pairs: (x0, x1) at position 1, pair 0 rotates by exactly 1 radian.
  std::vector<float> v = {1.f, 0.f};
  const int32_t one = 1;
  Rope(v.data(), &one, 1, 1, 2, RopeParams{RopeStyle::kAdjacentPairs, 2, 10000.f, 1.f, nullptr});
  EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(v[1], std::sin(1.0), 1e-6);
}

struct AttnFixture {
  PagedKvLayout layout{12, 5, 2, 20};  // awkward block size and head dim
  int64_t num_heads = 6;
  std::vector<float> k_cache, v_cache;
  AttnFixture() {
    const int64_t floats =
        layout.num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim;
    k_cache = Random(floats, 11);
    v_cache = Random(floats, 12);
  }
};

TEST(PagedAttentionTest, MatchesReferenceAndIsBatchInvariant) {
  AttnFixture f;
  // Three sequences with scrambled block tables: seq 0 decodes 1 token at
  // position 11, seq 1 prefills 4 tokens at positions 3..6, seq 2 has 2
  // tokens at 20 and 21.
  const std::vector<int32_t> query_start = {0, 1, 5, 7};
  const std::vector<int32_t> positions = {11, 3, 4, 5, 6, 20, 21};
  const std::vector<int32_t> context_lens = {12, 7, 22};
  const int64_t max_blocks = 5;
  const std::vector<int32_t> tables = {7, 2,  9, 0, 0,  //
                                       4, 11, 0, 0, 0,  //
                                       1, 3,  5, 6, 10};
  PagedAttentionArgs args{
      f.layout,         f.num_heads,         1.f / std::sqrt(20.f), 3,         query_start.data(),
      positions.data(), context_lens.data(), tables.data(),         max_blocks};
  const int64_t T = 7, width = f.num_heads * f.layout.head_dim;
  const std::vector<float> q = Random(T * width, 13);
  std::vector<float> got(T * width), want(T * width);
  ThreadPool pool(3);
  PagedAttention(args, q.data(), f.k_cache.data(), f.v_cache.data(), got.data(), &pool);
  ref::PagedAttention(args, q.data(), f.k_cache.data(), f.v_cache.data(), want.data());
  ExpectClose(got, want, 1e-5f);

  // Sequence 1 alone (single-threaded) gives bit-identical rows.
  const std::vector<int32_t> qs1 = {0, 4};
  PagedAttentionArgs alone = args;
  alone.num_seqs = 1;
  alone.query_start = qs1.data();
  alone.positions = positions.data() + 1;
  alone.context_lens = context_lens.data() + 1;
  alone.block_tables = tables.data() + max_blocks;
  std::vector<float> single(4 * width);
  PagedAttention(alone, q.data() + width, f.k_cache.data(), f.v_cache.data(), single.data(),
                 nullptr);
  EXPECT_EQ(0, std::memcmp(single.data(), got.data() + width, 4 * width * sizeof(float)));
}

// The builds of the kernels (kernels/cpu/variant.h) this CPU runs: the
// dispatch really switches code (FusedRowDot exists only in the AVX-512
// build), and f32 / f16 / bf16 / Q4_1 MatMul, RmsNorm and GQA attention
// (head dims 64 and 128, groups of 3, 5 and 12, the last in parts; contexts of
// one and of several partitions) over f16 and int8 caches (tiles and single
// tokens) give the same bits.
TEST(SimdVariantTest, EveryBuildGivesTheSameBits) {
  const std::string was = SimdKernelsVariant();
  struct Out {
    bool fused;
    std::vector<float> mm, norm, silu, attn;
  };
  const int64_t rows = 37, cols = 96;
  std::vector<QuantMatrix> ms;
  ms.push_back(MakeMatrix(TensorType::kQ4_1, rows, cols, 5));
  // Row lengths with every tail shape of the 32-element steps: none (96),
  // 16 + 3 (83: the odd accumulator), 13 (45: the even one).
  for (int64_t c : {cols, int64_t(83), int64_t(45)}) {
    for (TensorType t : {TensorType::kF32, TensorType::kF16, TensorType::kBF16}) {
      ms.push_back(MakeMatrix(t, rows, c, uint32_t(5 + c)));
    }
  }
  const std::vector<float> x = Random(7 * cols, 6, 2.f), w = Random(cols, 7);
  // One cache of 384 values per slot, block size 16, read as 6 KV heads of
  // dim 64 under 18 query heads (groups of 3) and as 3 KV heads of dim 128
  // under 36 (groups of 12, split in parts); one sequence of 5 tokens at
  // positions 30..34 (a tile) and one of 1 at 40.
  const PagedKvLayout layout{6, 16, 6, 64}, layout128{6, 16, 3, 128};
  const int64_t width = 384, slots = 6 * 16, qwidth = 18 * 64, qwidth128 = 36 * 128;
  const std::vector<float> kv = Random(2 * slots * width, 8, 3.f);
  std::vector<uint16_t> kc(slots * width), vc(slots * width);
  std::vector<int8_t> k8(slots * width), v8(slots * width);
  // Scale codes of 2^-10 .. 2^-2 (kernels/kv_dtype.h: ue5m3).
  std::vector<KvScale> ksc(slots * 6), vsc(slots * 6);
  {
    const std::vector<float> r = Random(2 * slots * 6, 10, 4.f);
    for (int64_t i = 0; i < slots * 6; ++i) {
      ksc[i] = KvScaleCeil(std::exp2(r[i] - 6.f));
      vsc[i] = KvScaleCeil(std::exp2(r[slots * 6 + i] - 6.f));
    }
  }
  for (int64_t i = 0; i < slots * width; ++i) {
    kc[i] = Fp32ToFp16(kv[i]);
    vc[i] = Fp32ToFp16(kv[slots * width + i]);
    k8[i] = int8_t(std::lround(kv[i] * 40));
    v8[i] = int8_t(std::lround(kv[slots * width + i] * 40));
  }
  const KvCacheView f16{KvDtype::kF16, kc.data(), vc.data(), nullptr, nullptr};
  const KvCacheView i8{KvDtype::kInt8, k8.data(), v8.data(), ksc.data(), vsc.data()};
  const std::vector<int32_t> query_start = {0, 5, 6}, positions = {30, 31, 32, 33, 34, 40};
  const std::vector<int32_t> context_lens = {35, 41}, tables = {4, 1, 5, 0, 3, 2};
  const PagedAttentionArgs args{
      layout,        18, 0.125f, 2, query_start.data(), positions.data(), context_lens.data(),
      tables.data(), 3};
  PagedAttentionArgs args128 = args;
  args128.layout = layout128;
  args128.num_heads = 36;
  // Groups of 5 at dim 64: the V sums run as passes of 4 heads and 1.
  PagedAttentionArgs args5 = args;
  args5.num_heads = 30;
  // Contexts past one partition (kPartKeys): one token at 299 (2
  // partitions, spread over the threads) and 5 at 560..564 (3, merged in
  // their item), the 6 blocks reused along 36-block tables.
  const std::vector<int32_t> long_start = {0, 1, 6}, long_pos = {299, 560, 561, 562, 563, 564};
  const std::vector<int32_t> long_lens = {300, 565};
  std::vector<int32_t> long_tables(2 * 36);
  for (size_t i = 0; i < long_tables.size(); ++i) long_tables[i] = int32_t((i * 5 + i / 7) % 6);
  PagedAttentionArgs args_long = args;
  args_long.query_start = long_start.data();
  args_long.positions = long_pos.data();
  args_long.context_lens = long_lens.data();
  args_long.block_tables = long_tables.data();
  args_long.max_blocks_per_seq = 36;
  const std::vector<float> q = Random(6 * qwidth128, 9);
  ThreadPool pool(2);
  auto run = [&](const std::string& variant) {
    EXPECT_EQ(variant, SimdKernelsVariant());
    Out o;
    float unused;
    o.fused = cpu::FusedRowDot(TensorType::kQ4_1, ms[0].view.row(0), x.data(), cols, &unused);
    for (const QuantMatrix& m : ms) {
      for (int64_t n : {1, 2, 3, 7}) {
        std::vector<float> y(n * rows);
        MatMul(m.view, x.data(), n, y.data(), &pool);
        o.mm.insert(o.mm.end(), y.begin(), y.end());
      }
    }
    o.norm.resize(7 * cols);
    RmsNorm(x.data(), w.data(), 7, cols, 1e-5f, o.norm.data());
    for (const KvCacheView* cache : {&f16, &i8}) {
      std::vector<float> y(6 * qwidth), y128(6 * qwidth128);
      PagedAttention(args, q.data(), *cache, y.data(), &pool);
      PagedAttention(args128, q.data(), *cache, y128.data(), &pool);
      o.attn.insert(o.attn.end(), y.begin(), y.end());
      o.attn.insert(o.attn.end(), y128.begin(), y128.end());
      std::vector<float> y5(6 * 30 * 64);
      PagedAttention(args5, q.data(), *cache, y5.data(), &pool);
      o.attn.insert(o.attn.end(), y5.begin(), y5.end());
      std::vector<float> yl(6 * qwidth);
      PagedAttention(args_long, q.data(), *cache, yl.data(), &pool);
      o.attn.insert(o.attn.end(), yl.begin(), yl.end());
    }
    return o;
  };
  std::vector<std::pair<std::string, Out>> outs;
  for (const char* v : {"avx512", "avx2", "base"}) {
    if (SetSimdKernelsVariantForTesting(v)) outs.emplace_back(v, run(v));
  }
  EXPECT_TRUE(SetSimdKernelsVariantForTesting(was));
  ASSERT_FALSE(outs.empty());
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const auto& [name, o] : outs) {
    EXPECT_EQ(o.fused, name == "avx512") << name;
    EXPECT_TRUE(same(o.mm, outs[0].second.mm)) << name;
    EXPECT_TRUE(same(o.norm, outs[0].second.norm)) << name;
    EXPECT_TRUE(same(o.attn, outs[0].second.attn)) << name;
  }
  // And the attention is right, not only the same (the scalar reference).
  const PagedAttentionArgs* const all_args[] = {&args, &args5, &args128, &args_long};
  for (const PagedAttentionArgs* a : all_args) {
    for (const KvCacheView* cache : {&f16, &i8}) {
      std::vector<float> want(6 * qwidth128), got(6 * qwidth128);
      ref::PagedAttention(*a, q.data(), *cache, want.data());
      PagedAttention(*a, q.data(), *cache, got.data(), &pool);
      ExpectClose(got, want, 1e-5f);
    }
  }
}

TEST(WriteKvTest, StoresAtSlots) {
  AttnFixture f;
  const int64_t width = f.layout.num_kv_heads * f.layout.head_dim;
  const std::vector<float> k = Random(3 * width, 1), v = Random(3 * width, 2);
  const std::vector<int64_t> slots = {59, 0, 17};
  std::vector<float> kc = f.k_cache, vc = f.v_cache, kr = kc, vr = vc;
  WriteKv(f.layout, k.data(), v.data(), slots.data(), 3, kc.data(), vc.data());
  ref::WriteKv(f.layout, k.data(), v.data(), slots.data(), 3, kr.data(), vr.data());
  EXPECT_EQ(kc, kr);
  EXPECT_EQ(vc, vr);
  EXPECT_EQ(0, std::memcmp(kc.data() + 59 * width, k.data(), width * sizeof(float)));
}

}  // namespace
}  // namespace tandem::kernels
