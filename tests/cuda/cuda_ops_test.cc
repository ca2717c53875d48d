// The CUDA kernels of kernels/cuda against the CPU references of
// kernels/kernels.h on random data; every test skips without a device
// (tests/gpu/run.sh treats such a skip on a GPU machine as a failure).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/int8_emulation.h"

namespace tandem::kernels::cuda {
namespace {

using gguf::TensorType;
using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomFloats;

// A random [rows, cols] matrix stored as `type` on the host (GGUF bytes).
struct HostMatrix {
  TensorType type;
  int64_t rows, cols, row_bytes;
  std::vector<uint8_t> bytes;
  WeightView view() const { return {type, bytes.data(), rows, cols, row_bytes}; }
};

HostMatrix MakeMatrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  HostMatrix m{type, rows, cols, int64_t(*gguf::RowBytes(type, cols)), {}};
  m.bytes.resize(rows * m.row_bytes);
  const std::vector<float> v = RandomFloats(rows * cols, seed, 0.5f);
  for (int64_t r = 0; r < rows; ++r)
    QuantizeRow(type, v.data() + r * cols, &m.bytes[r * m.row_bytes], cols);
  return m;
}

DeviceMatrix OnDevice(const HostMatrix& m, const DeviceBuffer& buf) {
  return {m.type, buf.get<void>(), m.rows, m.cols, m.row_bytes};
}

TEST(CudaOpsTest, EmbeddingGatherMatchesReferenceForEveryTableType) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  for (TensorType type : {TensorType::kF32, TensorType::kF16, TensorType::kBF16, TensorType::kQ4_0,
                          TensorType::kQ4_1, TensorType::kQ8_0}) {
    const HostMatrix m = MakeMatrix(type, 50, 96, 1);
    const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
    std::vector<float> want(ids.size() * m.cols);
    ref::EmbeddingLookup(m.view(), ids.data(), ids.size(), want.data());
    DeviceBuffer dm(m.bytes), did(ids), dout(int64_t(want.size() * 4));
    ASSERT_TRUE(
        EmbeddingGather(OnDevice(m, dm), did.get<int32_t>(), ids.size(), dout.get(), nullptr).ok());
    ExpectClose(dout.ToHost<float>(), want, 0.f, 0.f, "embedding");  // exact
  }
}

TEST(CudaOpsTest, RmsNormAndFusedAddMatchReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t n = 5, dim = 576;
  const auto x = RandomFloats(n * dim, 2), d = RandomFloats(n * dim, 3), w = RandomFloats(dim, 4);
  std::vector<float> want(n * dim), sum(n * dim);
  ref::RmsNorm(x.data(), w.data(), n, dim, 1e-5f, want.data());
  DeviceBuffer dx(x), dd(d), dw(w), dy(n * dim * 4);
  ASSERT_TRUE(RmsNorm(dx.get(), dw.get(), n, dim, 1e-5f, dy.get(), nullptr).ok());
  ExpectClose(dy.ToHost<float>(), want, 1e-5f, 1e-4f, "rmsnorm");
  ref::Add(x.data(), d.data(), n * dim, sum.data());
  ref::RmsNorm(sum.data(), w.data(), n, dim, 1e-5f, want.data());
  ASSERT_TRUE(AddRmsNorm(dx.get(), dd.get(), dw.get(), n, dim, 1e-5f, dy.get(), nullptr).ok());
  ExpectClose(dx.ToHost<float>(), sum, 0.f, 0.f, "residual sum");
  ExpectClose(dy.ToHost<float>(), want, 1e-5f, 1e-4f, "add+rmsnorm");
}

TEST(CudaOpsTest, SiluMulMatchesReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t n = 3, ffn = 100;
  const auto gu = RandomFloats(n * 2 * ffn, 5, 3.f);
  std::vector<float> want(n * ffn);
  for (int64_t t = 0; t < n; ++t) {
    ref::SiluMul(&gu[t * 2 * ffn], &gu[t * 2 * ffn + ffn], ffn, &want[t * ffn]);
  }
  DeviceBuffer dgu(gu), dout(n * ffn * 4);
  ASSERT_TRUE(SiluMul(dgu.get(), n, ffn, dout.get(), nullptr).ok());
  ExpectClose(dout.ToHost<float>(), want, 1e-6f, 1e-5f, "silu");
}

// MatMul on the Gemv (exact f32 math) and on the bf16 GEMM (bf16
// activations, so a looser bound), writing with a row stride and
// accumulating; in the GGUF and the planar layout; BlasMatMul (the GEMM) for
// every n > 8.
TEST(CudaOpsTest, MatMulMatchesReferenceForEveryMatrixType) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  auto blas = CreateBlasHandle();
  ASSERT_TRUE(blas.ok()) << blas.status();
  struct Case {
    TensorType type;
    int64_t cols;
  };
  for (const Case c : {Case{TensorType::kQ4_0, 320}, Case{TensorType::kQ4_1, 320},
                       Case{TensorType::kQ8_0, 320}, Case{TensorType::kBF16, 320},
                       Case{TensorType::kBF16, 100}, Case{TensorType::kQ4_0, 4096}}) {
    const HostMatrix m = MakeMatrix(c.type, 200, c.cols, 6);
    DeviceBuffer dm(m.bytes);
    const DeviceMatrix gguf_layout = OnDevice(m, dm);
    const int64_t planar_bytes = PlanarBytes(gguf_layout);
    DeviceBuffer dp(std::max<int64_t>(1, planar_bytes));
    DeviceMatrix planar = gguf_layout;
    if (planar_bytes > 0) {
      auto p = RepackPlanar(gguf_layout, dp.get<void>(), nullptr);
      ASSERT_TRUE(p.ok()) << p.status();
      planar = *p;
    }
    if (planar_bytes > 0) {  // the repack keeps every value: dequantized bits equal
      DeviceBuffer a(m.rows * m.cols * 2), b(m.rows * m.cols * 2);
      ASSERT_TRUE(DequantizeToBf16(gguf_layout, 0, m.rows, a.get<uint16_t>(), nullptr).ok());
      ASSERT_TRUE(DequantizeToBf16(planar, 0, m.rows, b.get<uint16_t>(), nullptr).ok());
      EXPECT_EQ(a.ToHost<uint16_t>(), b.ToHost<uint16_t>())
          << "planar repack, type " << int(c.type);
    }
    for (int64_t n : {1, 2, 3, 8, 9, 40, 70}) {
      const auto x = RandomFloats(n * m.cols, 7 + n);
      const int64_t ldy = m.rows + 5;
      const auto y0 = RandomFloats(n * ldy, 8);
      std::vector<float> prod(n * m.rows), want = y0;
      ref::MatMul(m.view(), x.data(), n, prod.data());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < m.rows; ++r) want[t * ldy + r] += prod[t * m.rows + r];
      const int64_t ws_bytes = MatMulWorkspaceBytes(n, m.cols);
      DeviceBuffer dx(x), dy(y0), dy_planar(y0), ws(std::max<int64_t>(1, ws_bytes));
      const GemmContext ctx{*blas, ws.get<void>(), ws_bytes};
      ASSERT_TRUE(MatMul(ctx, gguf_layout, dx.get(), n, dy.get(), ldy, true, nullptr).ok());
      ASSERT_TRUE(MatMul(ctx, planar, dx.get(), n, dy_planar.get(), ldy, true, nullptr).ok());
      const bool gemv = MatMulUsesGemv(ctx, n);
      // bf16 activations: an error growing with sqrt(cols) (0.15 at 320).
      const float gemm_atol = 0.15f * std::sqrt(float(m.cols) / 320.f);
      const std::string what = std::string(gemv ? "gemv " : "bf16 gemm ") +
                               std::to_string(int(c.type)) + " n=" + std::to_string(n);
      const std::vector<float> got = dy.ToHost<float>();
      ExpectClose(got, want, gemv ? 1e-4f : gemm_atol, gemv ? 1e-4f : 0.02f, what.c_str());
      ExpectClose(dy_planar.ToHost<float>(), want, gemv ? 1e-4f : gemm_atol, gemv ? 1e-4f : 0.02f,
                  ("planar " + what).c_str());
      if (n > kGemvMaxTokens) {
        DeviceBuffer dy_blas(y0);
        ASSERT_TRUE(BlasMatMul(ctx, planar, dx.get(), n, dy_blas.get(), ldy, true, nullptr).ok());
        ExpectClose(dy_blas.ToHost<float>(), want, gemm_atol, 0.02f,
                    ("BlasMatMul " + what).c_str());
      }
    }
  }
  DestroyBlasHandle(*blas);
}

// The Gemv's result for a token does not depend on how many tokens share the
// call: bit-identical rows for n = 1 and n = 37 (the batch-invariant mode).
TEST(CudaOpsTest, GemvIsBatchInvariant) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  for (TensorType type : {TensorType::kQ4_1, TensorType::kBF16, TensorType::kQ8_0}) {
    const HostMatrix m = MakeMatrix(type, 130, 640, 9);
    DeviceBuffer dm(m.bytes), dp(std::max<int64_t>(1, PlanarBytes(OnDevice(m, dm))));
    const DeviceMatrix w = type == TensorType::kQ8_0
                               ? *RepackPlanar(OnDevice(m, dm), dp.get<void>(), nullptr)
                               : OnDevice(m, dm);
    const int64_t n = 37;
    const auto x = RandomFloats(n * m.cols, 10);
    DeviceBuffer dx(x), dy_all(std::vector<float>(n * m.rows)), dy_one(std::vector<float>(m.rows));
    ASSERT_TRUE(Gemv(w, dx.get(), n, dy_all.get(), m.rows, false, nullptr).ok());
    const std::vector<float> all = dy_all.ToHost<float>();
    for (int64_t t : {0, 8, 36}) {
      ASSERT_TRUE(Gemv(w, dx.get() + t * m.cols, 1, dy_one.get(), m.rows, false, nullptr).ok());
      EXPECT_EQ(dy_one.ToHost<float>(),
                std::vector<float>(all.begin() + t * m.rows, all.begin() + (t + 1) * m.rows))
          << "token " << t;
    }
  }
}

// A planar copy of a host matrix on the device (the buffers must outlive it).
DeviceMatrix PlanarOnDevice(const HostMatrix& m, const DeviceBuffer& gguf_buf,
                            const DeviceBuffer& planar_buf) {
  auto p = RepackPlanar(OnDevice(m, gguf_buf), planar_buf.get<void>(), nullptr);
  TANDEM_CHECK(p.ok());
  return *p;
}

// GemvInt8 against the CPU's QGemm on two-level activations: the same block
// terms (kernels/cuda/int8_dot.h, bit-equal on the host in
// cuda_int8_math_test) summed in another order, so equal up to f32 rounding
// of the sum; with accumulate, ldy > rows and awkward sizes.
TEST(CudaOpsTest, GemvInt8MatchesCpuQGemm) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  struct Case {
    TensorType type;
    int64_t rows, cols;
  };
  for (const Case& c : {Case{TensorType::kQ4_0, 200, 4096}, Case{TensorType::kQ4_1, 37, 96},
                        Case{TensorType::kQ8_0, 130, 640}, Case{TensorType::kQ4_0, 9, 14336},
                        Case{TensorType::kQ4_1, 1000, 576}, Case{TensorType::kQ8_0, 3, 32}}) {
    const HostMatrix m = MakeMatrix(c.type, c.rows, c.cols, 31);
    DeviceBuffer dm(m.bytes), dp(PlanarBytes(OnDevice(m, dm)));
    const DeviceMatrix w = PlanarOnDevice(m, dm, dp);
    ASSERT_TRUE(GemvInt8Supports(w));
    const PackedWeight packed = PackedWeight::Pack(m.view(), nullptr);
    for (int64_t n : {1, 2, 3, 5, 8, 9, 20}) {
      const auto x = RandomFloats(n * m.cols, 32 + n);
      const int64_t ldy = m.rows + 3;
      const auto y0 = RandomFloats(n * ldy, 33);
      QuantizedActs acts;
      QuantizeActs(x.data(), n, m.cols, &acts, /*levels=*/2);
      std::vector<float> want = y0;
      QGemm(packed, acts, want.data(), ldy, /*accumulate=*/true, nullptr);
      DeviceBuffer dx(x), dy(y0);
      ASSERT_TRUE(GemvInt8(w, dx.get(), n, dy.get(), ldy, true, nullptr).ok());
      const std::string what = "GemvInt8 type " + std::to_string(int(c.type)) + " [" +
                               std::to_string(c.rows) + " x " + std::to_string(c.cols) +
                               "] n=" + std::to_string(n);
      // f32 sums of the same terms in two orders: ~1e-6 of the magnitude.
      const std::vector<float> got = dy.ToHost<float>();
      ExpectClose(got, want, 2e-5f * std::sqrt(float(m.cols)), 1e-5f, what.c_str());
      // In the kernel's own order (lane-strided, then WarpSum's butterfly)
      // the host emulation predicts every bit.
      int differ = 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < m.rows; ++r) {
          const float exact =
              y0[t * ldy + r] + testing::HostRowDot(m.type, &m.bytes[r * m.row_bytes], m.cols,
                                                    &x[t * m.cols], testing::SumOrder::kWarp);
          differ += std::memcmp(&exact, &got[t * ldy + r], 4) != 0;
        }
      }
      EXPECT_EQ(differ, 0) << what << ": results not bit-equal to the host emulation";
    }
  }
}

// GemvInt8 for a token does not depend on the other tokens of the call, and
// MatMul with int8_acts runs it (bit-equal) where it applies and the f32
// Gemv elsewhere (GGUF layout, more columns than its shared memory holds).
TEST(CudaOpsTest, GemvInt8IsBatchInvariantAndMatMulRoutesToIt) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const HostMatrix m = MakeMatrix(TensorType::kQ4_1, 130, 640, 41);
  DeviceBuffer dm(m.bytes), dp(PlanarBytes(OnDevice(m, dm)));
  const DeviceMatrix w = PlanarOnDevice(m, dm, dp);
  const int64_t n = 37;
  const auto x = RandomFloats(n * m.cols, 42);
  DeviceBuffer dx(x), dy_all(n * m.rows * 4), dy_one(m.rows * 4);
  ASSERT_TRUE(GemvInt8(w, dx.get(), n, dy_all.get(), m.rows, false, nullptr).ok());
  const std::vector<float> all = dy_all.ToHost<float>();
  for (int64_t t : {0, 7, 8, 36}) {
    ASSERT_TRUE(GemvInt8(w, dx.get() + t * m.cols, 1, dy_one.get(), m.rows, false, nullptr).ok());
    EXPECT_EQ(dy_one.ToHost<float>(),
              std::vector<float>(all.begin() + t * m.rows, all.begin() + (t + 1) * m.rows))
        << "token " << t;
  }
  GemmContext ctx;
  ctx.int8_acts = true;
  ASSERT_TRUE(MatMulUsesGemv(ctx, 5));
  DeviceBuffer dy_mm(5 * m.rows * 4), dy_i8(5 * m.rows * 4);
  ASSERT_TRUE(MatMul(ctx, w, dx.get(), 5, dy_mm.get(), m.rows, false, nullptr).ok());
  ASSERT_TRUE(GemvInt8(w, dx.get(), 5, dy_i8.get(), m.rows, false, nullptr).ok());
  EXPECT_EQ(dy_mm.ToHost<float>(), dy_i8.ToHost<float>());
  // Not supported: the GGUF layout and 21,888 columns; MatMul uses the f32 Gemv.
  const HostMatrix wide = MakeMatrix(TensorType::kQ8_0, 3, 21888, 43);
  DeviceBuffer dw(wide.bytes), dwp(PlanarBytes(OnDevice(wide, dw)));
  for (const DeviceMatrix& u : {OnDevice(m, dm), PlanarOnDevice(wide, dw, dwp)}) {
    EXPECT_FALSE(GemvInt8Supports(u));
    const auto xu = RandomFloats(u.cols, 44);
    DeviceBuffer dxu(xu), got(u.rows * 4), f32(u.rows * 4);
    EXPECT_EQ(GemvInt8(u, dxu.get(), 1, got.get(), u.rows, false, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(MatMul(ctx, u, dxu.get(), 1, got.get(), u.rows, false, nullptr).ok());
    ASSERT_TRUE(Gemv(u, dxu.get(), 1, f32.get(), u.rows, false, nullptr).ok());
    EXPECT_EQ(got.ToHost<float>(), f32.ToHost<float>());
  }
}

// The geometry fields of a QkvRopeKvWrite over n tokens of `qkv`.
QkvRopeArgs RopeArgs(const DeviceBuffer& qkv, const DeviceBuffer& pos, const DeviceBuffer& slots,
                     int64_t n, int64_t stride, int64_t heads, int64_t kv_heads, int64_t hd) {
  QkvRopeArgs a;
  a.d_qkv = qkv.get();
  a.num_tokens = n;
  a.stride = stride;
  a.num_heads = heads;
  a.num_kv_heads = kv_heads;
  a.head_dim = hd;
  a.d_positions = pos.get<int32_t>();
  a.d_slots = slots.get<int64_t>();
  return a;
}

TEST(CudaOpsTest, QkvRopeKvWriteMatchesReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  struct Case {
    RopeStyle style;
    int64_t head_dim, rot_dim;
    bool bias, factors;
  };
  for (const Case& c :
       {Case{RopeStyle::kAdjacentPairs, 64, 64, false, false},
        Case{RopeStyle::kNeox, 128, 128, true, false}, Case{RopeStyle::kNeox, 64, 32, false, true},
        Case{RopeStyle::kAdjacentPairs, 128, 96, true, true}}) {
    const int64_t n = 6, H = 6, KVH = 2, hd = c.head_dim, qd = H * hd, kvd = KVH * hd;
    const int64_t width = qd + 2 * kvd, stride = width + 3;
    auto qkv = RandomFloats(n * stride, 9);
    const auto bias = RandomFloats(width, 10);
    std::vector<float> factors(c.rot_dim / 2);
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.f + 0.5f * i;
    const std::vector<int32_t> pos = {0, 1, 7, 100, 4095, 8191};
    const std::vector<int64_t> slots = {5, 0, 9, 2, 15, 11};
    const PagedKvLayout layout{4, 4, KVH, hd};
    // Reference: bias, RopeQK, WriteKv.
    std::vector<float> q(n * qd), k(n * kvd), v(n * kvd);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < width; ++i) {
        const float x = qkv[t * stride + i] + (c.bias ? bias[i] : 0.f);
        (i < qd         ? q[t * qd + i]
         : i < qd + kvd ? k[t * kvd + i - qd]
                        : v[t * kvd + i - qd - kvd]) = x;
      }
    }
    RopeParams p{c.style, c.rot_dim, 500000.f, 0.5f, c.factors ? factors.data() : nullptr};
    ref::RopeQK(q.data(), k.data(), pos.data(), n, H, KVH, hd, p);
    std::vector<float> kc(16 * kvd, 0.f), vc(16 * kvd, 0.f);
    ref::WriteKv(layout, k.data(), v.data(), slots.data(), n, kc.data(), vc.data());

    DeviceBuffer dqkv(qkv), dbias(bias), dfac(factors), dpos(pos), dslots(slots),
        dkc(std::vector<float>(16 * kvd, 0.f)), dvc(std::vector<float>(16 * kvd, 0.f));
    QkvRopeArgs a = RopeArgs(dqkv, dpos, dslots, n, stride, H, KVH, hd);
    a.d_bias = c.bias ? dbias.get() : nullptr;
    a.style = c.style;
    a.rot_dim = c.rot_dim;
    a.freq_base = 500000.f;
    a.freq_scale = 0.5f;
    a.d_freq_factors = c.factors ? dfac.get() : nullptr;
    a.d_k_cache = dkc.get();
    a.d_v_cache = dvc.get();
    ASSERT_TRUE(QkvRopeKvWrite(a, nullptr).ok());
    const auto got = dqkv.ToHost<float>();
    std::vector<float> got_q(n * qd);
    for (int64_t t = 0; t < n; ++t) std::copy_n(&got[t * stride], qd, &got_q[t * qd]);
    ExpectClose(got_q, q, 1e-5f, 1e-5f, "rope q");
    ExpectClose(dkc.ToHost<float>(), kc, 1e-5f, 1e-5f, "k cache");
    ExpectClose(dvc.ToHost<float>(), vc, 0.f, 0.f, "v cache");
  }
}

// f16 / bf16 caches: the stored bytes are the rotated K (and V) of the qkv
// buffer rounded as kernels::QuantizeKvHead rounds them, bit for bit.
TEST(CudaOpsTest, QkvRopeKvWriteRoundsLikeTheCpuForF16AndBf16) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t n = 5, H = 4, KVH = 2, hd = 64, qd = H * hd, kvd = KVH * hd, stride = qd + 2 * kvd;
  const std::vector<int32_t> pos = {0, 3, 64, 1000, 8000};
  const std::vector<int64_t> slots = {7, 0, 12, 3, 15};
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBf16}) {
    SCOPED_TRACE(KvDtypeName(d));
    auto qkv = RandomFloats(n * stride, 21);
    for (size_t i = 0; i < qkv.size(); i += 13) qkv[i] *= 1e4f;  // some large values
    const int64_t eb = KvElementBytes(d);
    DeviceBuffer dqkv(qkv), dpos(pos), dslots(slots), dkc(16 * kvd * eb), dvc(16 * kvd * eb);
    QkvRopeArgs a = RopeArgs(dqkv, dpos, dslots, n, stride, H, KVH, hd);
    a.rot_dim = hd;
    a.d_k_cache = dkc.get();
    a.d_v_cache = dvc.get();
    a.kv_dtype = d;
    ASSERT_TRUE(QkvRopeKvWrite(a, nullptr).ok());
    const auto rotated = dqkv.ToHost<float>();
    const auto kbytes = dkc.ToHost<char>(), vbytes = dvc.ToHost<char>();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < KVH; ++h) {
        std::vector<char> wk(hd * eb), wv(hd * eb);
        QuantizeKvHead(d, &rotated[t * stride + qd + h * hd], hd, wk.data());
        QuantizeKvHead(d, &rotated[t * stride + qd + kvd + h * hd], hd, wv.data());
        const int64_t off = (slots[t] * kvd + h * hd) * eb;
        EXPECT_EQ(std::memcmp(wk.data(), &kbytes[off], hd * eb), 0) << "token " << t << " K " << h;
        EXPECT_EQ(std::memcmp(wv.data(), &vbytes[off], hd * eb), 0) << "token " << t << " V " << h;
      }
    }
  }
  // int8 / fp8 have no device path: refused, nothing launched.
  QkvRopeArgs bad;
  bad.num_tokens = 1;
  bad.head_dim = 64;
  bad.rot_dim = 64;
  bad.kv_dtype = KvDtype::kInt8;
  EXPECT_EQ(QkvRopeKvWrite(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The gather / scatter / copy kernels move native bytes: an f16 cache (2
// bytes an element) moves as exactly as an f32 one.
TEST(CudaOpsTest, KvSlotGatherScatterMoveF16Bytes) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t layers = 2, row_bytes = 2 * 64 * 2;
  const PagedKvLayout layout{5, 16, 2, 64};
  const int64_t layer_bytes = layout.num_blocks * layout.block_size * row_bytes;
  std::vector<char> cache(2 * layers * layer_bytes);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = char((i * 131 + 7) % 251);
  DeviceBuffer dcache(cache);
  const DeviceKvCache kv{dcache.get(), layers, layout, KvDtype::kF16};
  ASSERT_EQ(kv.row_bytes(), row_bytes);
  const std::vector<int64_t> slots = {79, 0, 33};
  DeviceBuffer dslots(slots), dbuf(int64_t(slots.size() * 2 * layers * row_bytes));
  ASSERT_TRUE(GatherSlots(kv, dslots.get<int64_t>(), slots.size(), dbuf.get(), nullptr).ok());
  const auto got = dbuf.ToHost<char>();
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int64_t l = 0; l < 2 * layers; ++l) {
      ASSERT_EQ(std::memcmp(&got[(i * 2 * layers + l) * row_bytes],
                            &cache[l * layer_bytes + slots[i] * row_bytes], row_bytes),
                0)
          << i << " " << l;
    }
  }
  const std::vector<int64_t> dst = {1, 2, 64};
  DeviceBuffer ddst(dst);
  ASSERT_TRUE(ScatterSlots(kv, ddst.get<int64_t>(), dst.size(), dbuf.get(), nullptr).ok());
  ASSERT_TRUE(CopyBlock(kv, 0, 3, nullptr).ok());
  auto want = cache;
  for (size_t i = 0; i < dst.size(); ++i) {
    for (int64_t l = 0; l < 2 * layers; ++l) {
      std::memcpy(&want[l * layer_bytes + dst[i] * row_bytes],
                  &got[(i * 2 * layers + l) * row_bytes], row_bytes);
    }
  }
  const int64_t block_bytes = layout.block_size * row_bytes;
  for (int64_t l = 0; l < 2 * layers; ++l) {
    std::memcpy(&want[l * layer_bytes + 3 * block_bytes], &want[l * layer_bytes], block_bytes);
  }
  EXPECT_EQ(dcache.ToHost<char>(), want);
}

TEST(CudaOpsTest, KvSlotGatherScatterAndBlockCopy) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t layers = 3, row = 2 * 64;
  const PagedKvLayout layout{6, 16, 2, 64};
  const int64_t layer_floats = layout.num_blocks * layout.block_size * row;
  const auto cache = RandomFloats(2 * layers * layer_floats, 11);
  DeviceBuffer dcache(cache);
  const DeviceKvCache kv{dcache.get(), layers, layout};
  const std::vector<int64_t> slots = {95, 0, 17, 40};
  DeviceBuffer dslots(slots), dbuf(int64_t(slots.size() * 2 * layers * row * 4));
  ASSERT_TRUE(GatherSlots(kv, dslots.get<int64_t>(), slots.size(), dbuf.get(), nullptr).ok());
  const auto got = dbuf.ToHost<float>();
  for (size_t i = 0; i < slots.size(); ++i)
    for (int64_t l = 0; l < 2 * layers; ++l)
      for (int64_t d = 0; d < row; ++d)
        ASSERT_EQ(got[(i * 2 * layers + l) * row + d],
                  cache[l * layer_floats + slots[i] * row + d]);
  // Scatter a modified copy to other slots, then copy block 1 -> 4.
  auto changed = got;
  for (float& x : changed) x += 1.f;
  const std::vector<int64_t> dst = {1, 2, 3, 90};
  DeviceBuffer ddst(dst), dchanged(changed);
  ASSERT_TRUE(ScatterSlots(kv, ddst.get<int64_t>(), dst.size(), dchanged.get(), nullptr).ok());
  ASSERT_TRUE(CopyBlock(kv, 0, 4, nullptr).ok());
  auto want = cache;
  for (size_t i = 0; i < dst.size(); ++i)
    for (int64_t l = 0; l < 2 * layers; ++l)
      for (int64_t d = 0; d < row; ++d)
        want[l * layer_floats + dst[i] * row + d] = changed[(i * 2 * layers + l) * row + d];
  const int64_t bf = layout.block_size * row;
  for (int64_t l = 0; l < 2 * layers; ++l)
    std::copy_n(&want[l * layer_floats], bf, &want[l * layer_floats + 4 * bf]);
  ExpectClose(dcache.ToHost<float>(), want, 0.f, 0.f, "cache after scatter + copy");
}

TEST(CudaOpsTest, ArgmaxTakesTheFirstLargest) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  const int64_t n = 3, dim = 49152;
  auto x = RandomFloats(n * dim, 12);
  x[0 * dim + 777] = 100.f;
  x[1 * dim + 5] = 50.f;
  x[1 * dim + 40000] = 50.f;  // tie: the smaller index wins
  x[2 * dim + dim - 1] = 9.f;
  DeviceBuffer dx(x), dout(n * 4);
  ASSERT_TRUE(Argmax(dx.get(), n, dim, dout.get<int32_t>(), nullptr).ok());
  EXPECT_EQ(dout.ToHost<int32_t>(), (std::vector<int32_t>{777, 5, int32_t(dim - 1)}));
}

TEST(CudaOpsTest, NoDeviceIsUnavailableNotACrash) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a device is present (NoDevice case)";
  std::string error;
  EXPECT_EQ(DeviceCount(&error), 0);
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(Malloc(1024).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
