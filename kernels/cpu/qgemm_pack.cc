// PackedWeight::Pack (ggml blocks -> interleaved row groups) and the scalar
// references of activation quantization and QGemm (see kernels/qgemm.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/qgemm_impl.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

struct Format {
  int bits;
  bool has_min;
  int32_t offset;
  ScaleFormat scales = ScaleFormat::kF16;
  int block_size = 32;  // of the ggml type
  int type_size = 0;    // bytes of one ggml block (K types)
};

Format FormatOf(TensorType t) {
  switch (t) {
    case TensorType::kQ4_0:
      return {4, false, 8};
    case TensorType::kQ4_1:
      return {4, true, 0};
    case TensorType::kQ5_0:
      return {5, false, 16};
    case TensorType::kQ5_1:
      return {5, true, 0};
    case TensorType::kQ8_0:
      return {8, false, 128};
    case TensorType::kQ4_K:
      return {4, true, 0, ScaleFormat::kF32, 256, 144};
    case TensorType::kQ5_K:
      return {5, true, 0, ScaleFormat::kF32, 256, 176};
    case TensorType::kQ6_K:
      return {6, false, 32, ScaleFormat::kF32Halves, 256, 210};
    default:
      return {0, false, 0};
  }
}

int64_t ChunkBytes(const Format& f) {
  if (f.scales != ScaleFormat::kF16) return f.bits * 64 + 32;
  return f.bits * 64 + 32 + (f.has_min ? 32 : 0);
}

// Bytes of one group's super-block scales (K types; see kernels/qgemm.h).
int64_t SuperBytes(const Format& f) {
  switch (f.scales) {
    case ScaleFormat::kF32:
      return 128;
    case ScaleFormat::kF32Halves:
      return 64;
    case ScaleFormat::kF16:
      break;
  }
  return 0;
}

// One ggml block as unsigned quants q[32] and f16 bits of d and m.
void DecodeBlock(TensorType t, const uint8_t* b, uint8_t* q, uint16_t* d, uint16_t* m) {
  std::memcpy(d, b, 2);
  *m = 0;
  switch (t) {
    case TensorType::kQ4_0:
    case TensorType::kQ4_1: {
      const uint8_t* qs = b + (t == TensorType::kQ4_1 ? 4 : 2);
      if (t == TensorType::kQ4_1) std::memcpy(m, b + 2, 2);
      for (int j = 0; j < 16; ++j) {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
      }
      return;
    }
    case TensorType::kQ5_0:
    case TensorType::kQ5_1: {
      const int off = t == TensorType::kQ5_1 ? 4 : 2;
      if (t == TensorType::kQ5_1) std::memcpy(m, b + 2, 2);
      uint32_t qh;
      std::memcpy(&qh, b + off, 4);
      const uint8_t* qs = b + off + 4;
      for (int j = 0; j < 16; ++j) {
        q[j] = uint8_t((qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
        q[j + 16] = uint8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
      return;
    }
    case TensorType::kQ8_0:
      for (int j = 0; j < 32; ++j) q[j] = uint8_t(int(int8_t(b[2 + j])) + 128);
      return;
    default:
      TANDEM_CHECK(false);
  }
}

// The 6-bit (scale, min) pair j of Q4_K / Q5_K (ggml's get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Sub-block j (0..7, 32 columns) of a K-quant super-block `sb` as unsigned
// quants q[32], its two small scales (sc, m for Q4_K / Q5_K; sc_lo, sc_hi
// for Q6_K) and the super-block's f32 d and nmin = -dmin (0 for Q6_K).
struct KScales {
  int s0 = 0, s1 = 0;
  float d = 0.f, nmin = 0.f;
};
KScales DecodeKBlock(TensorType t, const uint8_t* sb, int j, uint8_t* q) {
  KScales k;
  if (t == TensorType::kQ6_K) {
    const uint8_t* ql = sb;
    const uint8_t* qh = sb + 128;
    const auto* scales = reinterpret_cast<const int8_t*>(sb + 192);
    uint16_t hd;
    std::memcpy(&hd, sb + 208, 2);
    k.d = Fp16ToFp32(hd);
    for (int l = 0; l < 32; ++l) {
      const int i = 32 * j + l, h = i / 128, s = (i / 32) % 4;
      const int low = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
      const int high = (qh[32 * h + l] >> (2 * s)) & 3;
      q[l] = uint8_t(low | (high << 4));
    }
    k.s0 = scales[2 * j];
    k.s1 = scales[2 * j + 1];
    return k;
  }
  uint16_t hd, hm;
  std::memcpy(&hd, sb, 2);
  std::memcpy(&hm, sb + 2, 2);
  ScaleMinK4(j, sb + 4, &k.s0, &k.s1);
  k.d = Fp16ToFp32(hd);
  k.nmin = -Fp16ToFp32(hm);
  const bool q5 = t == TensorType::kQ5_K;
  const uint8_t* qs = sb + (q5 ? 48 : 16) + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) {
    q[l] = uint8_t((qs[l] >> shift) & 0x0F);
    if (q5) q[l] |= uint8_t(((sb[16 + l] >> j) & 1) << 4);
  }
  return k;
}

}  // namespace

// Unsigned quant k (0..31) of row r (0..15) in a packed chunk (the layout
// of kernels/qgemm.h: byte i = 4 r + k % 4 of register j = k / 4).
int PackedQuantAt(const uint8_t* chunk, int bits, int r, int k) {
  const int j = k / 4, i = r * 4 + k % 4;
  if (bits == 8) return chunk[64 * j + i];
  const uint8_t byte = chunk[64 * (j % 4) + i];
  int q = j < 4 ? (byte & 0x0F) : (byte >> 4);
  for (int p = 0; p < bits - 4; ++p) {
    uint64_t plane;
    std::memcpy(&plane, chunk + 256 + 64 * p + 8 * j, 8);
    q |= int((plane >> i) & 1) << (4 + p);
  }
  return q;
}

float PackedScaleAt(const PackedWeight& w, int64_t g, int64_t b, int i, int r) {
  const uint8_t* sc = w.chunk(g, b) + w.bits() * 64;
  if (w.scale_format() == ScaleFormat::kF16) {
    uint16_t h;
    std::memcpy(&h, sc + 32 * i + r * 2, 2);
    return Fp16ToFp32(h);
  }
  // D = d * sc, M = nmin * m (kF32); D_lo / D_hi = d * sc_lo / sc_hi (Q6_K).
  const float* sup = w.super_scales(g, b);
  if (w.scale_format() == ScaleFormat::kF32) {
    return sup[16 * i + r] * float(sc[16 * i + r]);
  }
  return sup[r] * float(int8_t(sc[16 * i + r]));
}

namespace {

// Stores unsigned quant q (< 2^bits) as k of row r in a zeroed chunk.
void PutQuant(uint8_t* chunk, int bits, int r, int k, int q) {
  const int j = k / 4, i = r * 4 + k % 4;
  if (bits == 8) {
    chunk[64 * j + i] = uint8_t(q);
    return;
  }
  chunk[64 * (j % 4) + i] |= uint8_t(j < 4 ? (q & 0x0F) : (q & 0x0F) << 4);
  for (int p = 0; p < bits - 4; ++p) {
    if (((q >> (4 + p)) & 1) == 0) continue;
    uint64_t plane;
    std::memcpy(&plane, chunk + 256 + 64 * p + 8 * j, 8);
    plane |= uint64_t{1} << i;
    std::memcpy(chunk + 256 + 64 * p + 8 * j, &plane, 8);
  }
}

// q = round(x * id) clamped to [-127, 127]; returns sum(q), the sum of
// q[0..15] in *lo, quants as floats in qf.
int32_t QuantizeBlockRef(const float* x, float id, int8_t* q, float* qf, int32_t* lo) {
  int32_t sum = 0;
  for (int i = 0; i < kQBlock; ++i) {
    float v = std::nearbyint(x[i] * id);
    v = std::fmin(127.f, std::fmax(-127.f, v));
    q[i] = int8_t(v);
    qf[i] = v;
    sum += int8_t(v);
    if (i == 15) *lo = sum;
  }
  return sum;
}

void QuantizeRowRef(const float* x, int64_t cols, const cpu::ActRow& o) {
  float qf[kQBlock], r[kQBlock];
  for (int64_t b = 0; b < cols / kQBlock; ++b) {
    const int64_t k = b * kActTile;
    const float* xb = x + b * kQBlock;
    float amax = 0.f;
    for (int i = 0; i < kQBlock; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    if (o.row_amax >= 0.f) amax = o.row_amax;
    const float dx = amax / 127.f;
    const float id = dx != 0.f ? 1.f / dx : 0.f;
    int32_t lo = 0, lo2 = 0, sum2 = 0;
    const int32_t sum = QuantizeBlockRef(xb, id, o.q + k * kQBlock, qf, &lo);
    if (o.q2 != nullptr) {
      for (int i = 0; i < kQBlock; ++i) r[i] = std::fma(-dx, qf[i], xb[i]);
      sum2 = QuantizeBlockRef(r, id * 256.f, o.q2 + k * kQBlock, qf, &lo2);
    }
    cpu::StoreActBlock(o, k, dx, sum, lo, o.q2 != nullptr, sum2, lo2);
  }
}

// Integer dot of quants k in [k0, k1) of row rr with one token's block
// (both levels combined as in kernels/qgemm.h).
int32_t IntDotRef(const uint8_t* c, int bits, int rr, const QuantizedActs& a, int64_t t, int64_t b,
                  int k0, int k1) {
  int32_t isum = 0, isum2 = 0;
  const int8_t* xq = a.q(t, b);
  for (int k = k0; k < k1; ++k) isum += PackedQuantAt(c, bits, rr, k) * xq[k];
  if (a.levels == 2) {
    const int8_t* xq2 = a.q2(t, b);
    for (int k = k0; k < k1; ++k) isum2 += PackedQuantAt(c, bits, rr, k) * xq2[k];
    isum = isum * 256 + isum2;
  }
  return isum;
}

void GemmGroupsRef(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
                   int64_t ldy, bool accumulate) {
  const int64_t nb = w.num_blocks();
  const bool halves = w.scale_format() == ScaleFormat::kF32Halves;
  for (int64_t r = g0 * kGroupRows; r < std::min(w.rows(), g1 * kGroupRows); ++r) {
    const int64_t g = r / kGroupRows;
    const int rr = int(r % kGroupRows);
    for (int64_t t = 0; t < a.n; ++t) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* c = w.chunk(g, b);
        const int64_t i = a.Index(t, b);
        const float d = PackedScaleAt(w, g, b, 0, rr);
        if (halves) {
          const int32_t lo = IntDotRef(c, w.bits(), rr, a, t, b, 0, 16) - 32 * a.s_lo[i];
          const int32_t hi =
              IntDotRef(c, w.bits(), rr, a, t, b, 16, 32) - 32 * (a.s[i] - a.s_lo[i]);
          const float ddx_lo = d * a.d[i];
          const float ddx_hi = PackedScaleAt(w, g, b, 1, rr) * a.d[i];
          acc = acc + std::fma(float(lo), ddx_lo, float(hi) * ddx_hi);
          continue;
        }
        const int32_t isum = IntDotRef(c, w.bits(), rr, a, t, b, 0, 32);
        const float ddx = d * a.d[i];
        if (w.has_min()) {
          acc = std::fma(float(isum), ddx, std::fma(PackedScaleAt(w, g, b, 1, rr), a.sd[i], acc));
        } else {
          acc = std::fma(float(isum - w.offset() * a.s[i]), ddx, acc);
        }
      }
      float* out = y + t * ldy + r;
      *out = accumulate ? *out + acc : acc;
    }
  }
}

void SiluMulRef(const float* gate, const float* up, int64_t n, float* out) {
  ref::SiluMul(gate, up, n, out);
}

const cpu::QGemmImpl kScalarImpl = {"scalar", GemmGroupsRef, QuantizeRowRef, SiluMulRef};

}  // namespace

bool IsPackable(TensorType type) { return FormatOf(type).bits != 0; }

void PackedWeight::Free::operator()(uint8_t* p) const { std::free(p); }

int64_t PackedWeight::PackedBytes(const WeightView* views, int num_views) {
  const Format f = FormatOf(views[0].type);
  int64_t rows = 0;
  for (int v = 0; v < num_views; ++v) rows += views[v].rows;
  const int64_t groups = (rows + kGroupRows - 1) / kGroupRows, nb = views[0].cols / kQBlock;
  return groups * (nb * ChunkBytes(f) + nb / PackedWeight::kSuperBlocks * SuperBytes(f));
}

PackedWeight PackedWeight::Pack(const WeightView* views, int num_views, ThreadPool* pool,
                                uint8_t* storage) {
  TANDEM_CHECK(num_views > 0);
  PackedWeight p;
  p.type_ = views[0].type;
  p.cols_ = views[0].cols;
  const Format f = FormatOf(p.type_);
  TANDEM_CHECK(f.bits != 0 && p.cols_ % f.block_size == 0);
  std::vector<std::pair<const WeightView*, int64_t>> row_src;  // global row -> (view, row)
  for (int v = 0; v < num_views; ++v) {
    TANDEM_CHECK(views[v].type == p.type_ && views[v].cols == p.cols_);
    for (int64_t r = 0; r < views[v].rows; ++r) row_src.push_back({&views[v], r});
  }
  p.rows_ = int64_t(row_src.size());
  p.bits_ = f.bits;
  p.has_min_ = f.has_min;
  p.offset_ = f.offset;
  p.scales_ = f.scales;
  p.chunk_bytes_ = ChunkBytes(f);
  p.super_bytes_ = SuperBytes(f);
  const size_t total = size_t(p.bytes());
  TANDEM_CHECK(int64_t(total) == PackedBytes(views, num_views));
  if (storage == nullptr) {
    p.owned_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64)));
    storage = p.owned_.get();
  }
  TANDEM_CHECK(storage != nullptr && reinterpret_cast<uintptr_t>(storage) % 64 == 0);
  p.data_ = storage;
  std::memset(p.data_, 0, total);
  const int64_t nb = p.num_blocks();
  ThreadPool::Run(pool, p.num_groups(), [&](int64_t g0, int64_t g1) {
    uint8_t q[32];
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t rr = 0; rr < kGroupRows && g * kGroupRows + rr < p.rows_; ++rr) {
        const auto& [view, r] = row_src[g * kGroupRows + rr];
        const int64_t src_block_bytes = view->row_bytes / nb;
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* c = p.data_ + (g * nb + b) * p.chunk_bytes_;
          uint8_t* sc = c + f.bits * 64;
          if (f.scales == ScaleFormat::kF16) {
            uint16_t d, m;
            DecodeBlock(p.type_, view->row(r) + b * src_block_bytes, q, &d, &m);
            std::memcpy(sc + rr * 2, &d, 2);
            if (f.has_min) std::memcpy(sc + 32 + rr * 2, &m, 2);
          } else {
            const KScales k = DecodeKBlock(p.type_, view->row(r) + (b / kSuperBlocks) * f.type_size,
                                           int(b % kSuperBlocks), q);
            sc[rr] = uint8_t(k.s0);  // s8 for Q6_K
            sc[16 + rr] = uint8_t(k.s1);
            if (b % kSuperBlocks == 0) {  // once per super-block
              auto* sup = const_cast<float*>(p.super_scales(g, b));
              sup[rr] = k.d;
              if (f.scales == ScaleFormat::kF32) sup[16 + rr] = k.nmin;
            }
          }
          for (int k = 0; k < 32; ++k) PutQuant(c, f.bits, int(rr), k, q[k]);
        }
      }
    }
  });
  return p;
}

void QuantizedActs::Resize(int64_t num_tokens, int64_t num_cols, int num_levels) {
  n = num_tokens;
  cols = num_cols;
  levels = num_levels;
  const int64_t slots = (n + kActTile - 1) / kActTile * kActTile * (num_cols / kQBlock);
  if (int64_t(qs.size()) < slots * kQBlock) qs.resize(slots * kQBlock);
  if (int64_t(d.size()) < slots) {
    d.resize(slots);
    sd.resize(slots);
    s.resize(slots);
    s_lo.resize(slots);
  }
  if (levels == 2 && int64_t(qs2.size()) < slots * kQBlock) qs2.resize(slots * kQBlock);
}

namespace ref {

void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels,
                  ActScale scale) {
  TANDEM_CHECK(cols % kQBlock == 0 && (levels == 1 || levels == 2));
  out->Resize(n, cols, levels);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * cols;
    QuantizeRowRef(row, cols, cpu::RowOf(out, t, row, scale == ActScale::kPerToken));
  }
}

void QGemm(const PackedWeight& w, const QuantizedActs& a, float* y, int64_t ldy, bool accumulate) {
  TANDEM_CHECK(a.cols == w.cols());
  cpu::ScalarImpl()->gemm(w, a, 0, w.num_groups(), y, ldy, accumulate);
}

}  // namespace ref

const cpu::QGemmImpl* cpu::ScalarImpl() { return &kScalarImpl; }

}  // namespace tandem::kernels
