// Dequantize-on-the-fly matrix-vector products for small token counts, and
// the dequantization to bf16 that feeds the tensor-core GEMM.
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/int8_dot.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kGemvWarps = 4;   // rows per CTA (one warp per row)
constexpr int kGemvTokens = 8;  // tokens per pass over the weights

// Blocks a lane loads before it computes: bytes in flight per warp.
template <int kType>
constexpr int UnrollOf() {
  return kType == kTypeBF16 ? 2 : 4;
}

// The GGUF layout (and BF16 rows of cols % 8 != 0). One warp per output row:
// lane l takes blocks l, l + 32, ... of the row, loads kUnroll of them, then
// expands each once into registers and applies it to up to kTokens tokens.
// A fixed reduction order per row: results do not depend on the token count
// or on kTokens.
template <int kType, int kTokens>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvBlockKernel(MatView w, const float* x, int64_t n, float* y, int64_t ldy, bool accumulate) {
  constexpr int kUnroll = UnrollOf<kType>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (r >= w.rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  const int nt = static_cast<int>(Min64(kTokens, n - t0));
  const int64_t cols = w.cols;
  const bool vec = (cols % 4) == 0;  // x rows 16-byte aligned
  float acc[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.f;
  for (int64_t b0 = lane; b0 < w.nblk; b0 += 32 * kUnroll) {
    RawBlock<kType> raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b0 + 32 * u < w.nblk) LoadRaw<kType>(w, r, b0 + 32 * u, raw[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = b0 + 32 * u;
      if (b >= w.nblk) break;
      float wv[kQK];
      Expand<kType>(raw[u], wv);
      const int64_t c0 = b * kQK;
      const bool full = vec && c0 + kQK <= cols;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= nt) break;
        const float* xt = x + (t0 + t) * cols + c0;
        float s = 0.f;
        if (full) {
#pragma unroll
          for (int j = 0; j < kQK; j += 4) {
            const float4 xv = *reinterpret_cast<const float4*>(xt + j);
            s += wv[j] * xv.x + wv[j + 1] * xv.y + wv[j + 2] * xv.z + wv[j + 3] * xv.w;
          }
        } else {
          for (int j = 0; j < kQK && c0 + j < cols; ++j) s += wv[j] * xt[j];
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= nt) break;
    const float s = WarpSum(acc[t]);
    if (lane == 0) {
      float* out = y + (t0 + t) * ldy + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// The planar layout and BF16 (cols % 8 == 0). One warp per kRows output
// rows: lane l takes weights [8 l, 8 l + 8) of every 256-weight window of
// the rows, so a warp's loads of the matrix and of x are consecutive bytes,
// and each x load serves kRows rows; kUnroll windows are loaded before they
// are used (bytes in flight). Each (row, token) sums its windows in the same
// order whatever kRows, kTokens or the token count: batch invariant.
template <int kType, int kRows>
constexpr int Unroll8Of() {
  return kType == kTypeQ4_0 || kType == kTypeQ4_1 ? 8 : kRows == 1 ? 4 : 2;
}

template <int kType, int kTokens, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32)
    Gemv8Kernel(MatView w, const float* x, int64_t n, float* y, int64_t ldy, bool accumulate) {
  constexpr int kUnroll = Unroll8Of<kType, kRows>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kRows;
  if (r0 >= w.rows) return;
  const int nr = static_cast<int>(Min64(kRows, w.rows - r0));
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  const int nt = static_cast<int>(Min64(kTokens, n - t0));
  const int64_t cols = w.cols;
  float acc[kTokens][kRows];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) acc[t][q] = 0.f;
  }
  // One token: x is loaded with the weights, not after them (BF16: 97-102%
  // of the copy bandwidth against 66-95% on an H200; the quantized types
  // lose occupancy to the registers it takes: Q4_0 28% against 37% in an
  // earlier build without it). The kernel as measured; see docs/gpu.md.
  constexpr bool kXFirst = kTokens == 1;
  constexpr int kPrefetchX = kXFirst ? kUnroll : 1;
  for (int64_t base = int64_t(lane) * 8; base < cols; base += 256 * kUnroll) {
    Raw8<kType> raw[kUnroll][kRows];
    float4 xp[kPrefetchX][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        if (base + 256 * u < cols && q < nr) LoadRaw8<kType>(w, r0 + q, base + 256 * u, raw[u][q]);
      }
      if (kXFirst && base + 256 * u < cols) {
        const float4* xt = reinterpret_cast<const float4*>(x + t0 * cols + base + 256 * u);
        xp[kXFirst ? u : 0][0] = xt[0];
        xp[kXFirst ? u : 0][1] = xt[1];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t e0 = base + 256 * u;
      if (e0 >= cols) break;
      float wv[kRows][8];
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        if (q < nr) Expand8<kType>(raw[u][q], wv[q]);
      }
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= nt) break;
        float4 a, b;
        if (kXFirst) {
          a = xp[kXFirst ? u : 0][0], b = xp[kXFirst ? u : 0][1];
        } else {
          const float4* xt = reinterpret_cast<const float4*>(x + (t0 + t) * cols + e0);
          a = xt[0], b = xt[1];
        }
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          if (q >= nr) break;
          acc[t][q] += wv[q][0] * a.x + wv[q][1] * a.y + wv[q][2] * a.z + wv[q][3] * a.w +
                       wv[q][4] * b.x + wv[q][5] * b.y + wv[q][6] * b.z + wv[q][7] * b.w;
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= nt) break;
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      if (q >= nr) break;
      const float s = WarpSum(acc[t][q]);
      if (lane == 0) {
        float* out = y + (t0 + t) * ldy + r0 + q;
        *out = accumulate ? *out + s : s;
      }
    }
  }
}

// GemvInt8 (kernels/cuda/int8_dot.h): planar Q4_0 / Q4_1 / Q8_0 against
// two-level int8 activations. Each CTA first quantizes its kTok tokens' x
// into shared memory (one thread per 32-column block; the quants in the dp4a
// order of kType, [token][4 x 16 bytes][block] so that the lanes' 16-byte
// reads of consecutive blocks are conflict-free), then its warps stride over
// the rows: lane l takes blocks l, l + 32, ... of a row with one 16-byte
// (Q4) or two (Q8_0) loads per block, kI8Unroll blocks in flight, and 16
// dp4a per block and token. The grid is one wave of CTAs (GemvInt8Grid), so
// each CTA quantizes x once; the first weights of each warp are prefetched
// to L2 meanwhile. Each (row, token) sums its blocks in the same
// order whatever kTok or the token count: batch invariant.
static_assert(i8::kQ4_0 == kTypeQ4_0 && i8::kQ4_1 == kTypeQ4_1 && i8::kQ8_0 == kTypeQ8_0,
              "int8_dot.h's type ids are common.cuh's");
constexpr int kI8Warps = 8;
constexpr int kI8Unroll = 4;
// Shared memory of one CTA stays under the default 48 KiB (no opt-in).
constexpr int64_t kI8SmemBytes = 48 << 10;

template <int kType, int kTok>
__global__ void __launch_bounds__(kI8Warps * 32, kTok <= 2 ? 4 : 3)
    GemvInt8Kernel(MatView w, const float* x, int64_t n, float* y, int64_t ldy, bool accumulate) {
  extern __shared__ uint4 xs[];  // [kTok][4][nblk], then e [kTok][nblk], s [kTok][nblk]
  const int64_t nblk = w.nblk, cols = w.cols;
  float* es = reinterpret_cast<float*>(xs + kTok * 4 * nblk);
  int32_t* ss = reinterpret_cast<int32_t*>(es + kTok * nblk);
  const int64_t t0 = int64_t(blockIdx.y) * kTok;
  const int nt = static_cast<int>(Min64(kTok, n - t0));
  constexpr int kQb = i8::QuantWords<kType>() * 4;  // quant bytes per block
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  {
    // While x is quantized, the first blocks of each warp's first row
    // travel to L2 (no registers held across the barrier).
    const int64_t r = int64_t(blockIdx.x) * kI8Warps + warp;
#pragma unroll
    for (int u = 0; u < kI8Unroll; ++u) {
      const int64_t b = lane + 32 * u;
      if (r < w.rows && b < nblk) {
        asm volatile("prefetch.L2 [%0];" ::"l"(w.data + (r * nblk + b) * kQb));  // generic address
      }
    }
  }
  for (int64_t i = threadIdx.x; i < nt * nblk; i += blockDim.x) {
    const int64_t t = i / nblk, b = i % nblk;
    const float4* src = reinterpret_cast<const float4*>(x + (t0 + t) * cols + b * kQK);
    float v[kQK];
#pragma unroll
    for (int k = 0; k < kQK / 4; ++k) {
      const float4 f = src[k];
      v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
    i8::ActBlock a;
    i8::QuantizeBlock<kType>(v, &a);
    uint4* dst = xs + t * 4 * nblk + b;
    dst[0] = make_uint4(a.q1[0], a.q1[1], a.q1[2], a.q1[3]);
    dst[nblk] = make_uint4(a.q1[4], a.q1[5], a.q1[6], a.q1[7]);
    dst[2 * nblk] = make_uint4(a.q2[0], a.q2[1], a.q2[2], a.q2[3]);
    dst[3 * nblk] = make_uint4(a.q2[4], a.q2[5], a.q2[6], a.q2[7]);
    es[t * nblk + b] = a.e;
    ss[t * nblk + b] = a.s;
  }
  __syncthreads();
  constexpr int kWords = i8::QuantWords<kType>();
  constexpr bool kMin = kType == kTypeQ4_1;
  for (int64_t r = int64_t(blockIdx.x) * kI8Warps + warp; r < w.rows;
       r += int64_t(gridDim.x) * kI8Warps) {
    float acc[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[t] = 0.f;
    for (int64_t b0 = lane; b0 < nblk; b0 += 32 * kI8Unroll) {
      uint32_t wq[kI8Unroll][kWords];
      uint32_t sc[kI8Unroll];
#pragma unroll
      for (int u = 0; u < kI8Unroll; ++u) {
        const int64_t b = b0 + 32 * u;
        if (b >= nblk) break;
        const int64_t blk = r * nblk + b;
        const uint4* q = reinterpret_cast<const uint4*>(w.data + blk * kQb);
#pragma unroll
        for (int k = 0; k < kWords / 4; ++k) {
          const uint4 v = q[k];
          wq[u][4 * k] = v.x, wq[u][4 * k + 1] = v.y, wq[u][4 * k + 2] = v.z,
                    wq[u][4 * k + 3] = v.w;
        }
        sc[u] = kMin ? Ld32(w.scales + blk * 4) : Ld16(w.scales + blk * 2);
      }
#pragma unroll
      for (int u = 0; u < kI8Unroll; ++u) {
        const int64_t b = b0 + 32 * u;
        if (b >= nblk) break;
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t >= nt) break;
          const uint4* xt = xs + t * 4 * nblk + b;
          const uint4 a0 = xt[0], a1 = xt[nblk], c0 = xt[2 * nblk], c1 = xt[3 * nblk];
          const uint32_t x1[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
          const uint32_t x2[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
          const int32_t isum = i8::BlockDot<kType>(wq[u], x1, x2);
          acc[t] = i8::BlockStep<kType>(isum, sc[u], es[t * nblk + b], ss[t * nblk + b], acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      if (t >= nt) break;
      const float s = WarpSum(acc[t]);
      if (lane == 0) {
        float* out = y + (t0 + t) * ldy + r;
        *out = accumulate ? *out + s : s;
      }
    }
  }
}

int64_t Int8SmemBytes(int64_t cols, int tok) {
  return int64_t(tok) * (cols / kQK) * i8::kBytesPerBlock;
}

// One wave: as many CTAs as the device keeps resident at once (registers
// and shared memory), capped by the row groups.
template <int kType, int kTok>
unsigned GemvInt8Grid(int64_t rows, int64_t smem) {
  static const int sms = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 1;
    }
    return v;
  }();
  // CTAs per SM by shared memory size (a few distinct column counts).
  struct Cache {
    absl::Mutex mu;
    std::map<int64_t, int> per_sm_of ABSL_GUARDED_BY(mu);
  };
  static Cache* const cache = new Cache;
  int per_sm = 0;
  {
    absl::MutexLock lock(&cache->mu);
    auto& per_sm_of = cache->per_sm_of;
    auto it = per_sm_of.find(smem);
    if (it == per_sm_of.end()) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvInt8Kernel<kType, kTok>,
                                                        kI8Warps * 32, smem) != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky; clear it for LaunchStatus
        per_sm = 1;
      }
      it = per_sm_of.emplace(smem, per_sm < 1 ? 1 : per_sm).first;
    }
    per_sm = it->second;
  }
  return static_cast<unsigned>(Min64(int64_t(sms) * per_sm, Blocks(rows, kI8Warps)));
}

template <int kType, int kTok>
void LaunchGemvInt8(const DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy,
                    bool accumulate, cudaStream_t s) {
  const int64_t smem = Int8SmemBytes(w.cols, kTok);
  const dim3 grid(GemvInt8Grid<kType, kTok>(w.rows, smem), Blocks(n, kTok));
  GemvInt8Kernel<kType, kTok>
      <<<grid, kI8Warps * 32, smem, s>>>(ViewOf(w), x, n, y, ldy, accumulate);
}

bool UsesGemv8(const DeviceMatrix& w) {
  return w.scales != nullptr || (w.type == gguf::TensorType::kBF16 && w.cols % 8 == 0);
}

// One thread per block: 32 bf16 values, four 16-byte stores when whole.
template <int kType>
__global__ void DequantBf16Kernel(MatView w, int64_t row0, int64_t num_rows, uint16_t* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= num_rows * w.nblk) return;
  const int64_t r = i / w.nblk, b = i % w.nblk;
  RawBlock<kType> raw;
  LoadRaw<kType>(w, row0 + r, b, raw);
  float v[kQK];
  Expand<kType>(raw, v);
  uint16_t* dst = out + r * w.cols + b * kQK;
  if ((b + 1) * kQK <= w.cols && (w.cols % 8) == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[j] = uint32_t(FloatToBf16(v[8 * k + 2 * j])) |
               (uint32_t(FloatToBf16(v[8 * k + 2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(dst)[k] = make_uint4(p[0], p[1], p[2], p[3]);
    }
  } else {
    for (int j = 0; j < kQK && b * kQK + j < w.cols; ++j) dst[j] = FloatToBf16(v[j]);
  }
}

// Planar: one thread per 8 weights, one 16-byte store.
template <int kType>
__global__ void Dequant8Bf16Kernel(MatView w, int64_t row0, int64_t num_rows, uint16_t* out) {
  const int64_t per_row = w.cols / 8;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= num_rows * per_row) return;
  const int64_t r = i / per_row, e0 = (i % per_row) * 8;
  Raw8<kType> raw;
  LoadRaw8<kType>(w, row0 + r, e0, raw);
  float v[8];
  Expand8<kType>(raw, v);
  uint32_t p[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j] = uint32_t(FloatToBf16(v[2 * j])) | (uint32_t(FloatToBf16(v[2 * j + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(out + r * w.cols + e0) = make_uint4(p[0], p[1], p[2], p[3]);
}

// One thread per block: GGUF layout -> planar (Q4: weights 2i, 2i + 1 in
// byte i).
template <int kType>
__global__ void RepackPlanarKernel(MatView src, uint8_t* quants, uint8_t* scales) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= src.rows * src.nblk) return;
  RawBlock<kType> raw;
  LoadRaw<kType>(src, i / src.nblk, i % src.nblk, raw);
  constexpr int kQb = PlanarQuantBytes(kType);
  uint32_t out[kQb / 4];
  if constexpr (kType == kTypeQ8_0) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = raw.q[k];
  } else {
    // GGUF byte i: weight i (low nibble), weight i + 16 (high).
    auto nib = [&](int e) -> uint32_t {
      const uint32_t byte = (raw.q[(e % 16) / 4] >> (8 * (e % 4))) & 0xFF;
      return e < 16 ? (byte & 0x0F) : (byte >> 4);
    };
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) word |= nib(8 * k + j) << (4 * j);
      out[k] = word;
    }
  }
  uint4* q = reinterpret_cast<uint4*>(quants + i * kQb);
#pragma unroll
  for (int k = 0; k < kQb / 16; ++k)
    q[k] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
  if constexpr (PlanarScaleBytes(kType) == 4) {
    reinterpret_cast<uint32_t*>(scales)[i] = raw.s;
  } else {
    reinterpret_cast<uint16_t*>(scales)[i] = static_cast<uint16_t>(raw.s);
  }
}

int PlanarTypeOf(gguf::TensorType t) {
  switch (t) {
    case gguf::TensorType::kQ4_0:
      return kTypeQ4_0;
    case gguf::TensorType::kQ4_1:
      return kTypeQ4_1;
    case gguf::TensorType::kQ8_0:
      return kTypeQ8_0;
    default:
      return -1;
  }
}

template <int kType, int kTokens>
void LaunchGemv(const DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy,
                bool accumulate, cudaStream_t s) {
  const dim3 grid(Blocks(w.rows, kGemvWarps), Blocks(n, kTokens));
  if (UsesGemv8(w)) {
    // One row per warp at one token (warps enough to stream the matrix;
    // four rows measured slower there), four rows per warp above (x read
    // once for four rows).
    if (kTokens == 1) {
      Gemv8Kernel<kType, kTokens, 1>
          <<<grid, kGemvWarps * 32, 0, s>>>(ViewOf(w), x, n, y, ldy, accumulate);
    } else {
      const dim3 grid4(Blocks(w.rows, kGemvWarps * 4), Blocks(n, kTokens));
      Gemv8Kernel<kType, kTokens, 4>
          <<<grid4, kGemvWarps * 32, 0, s>>>(ViewOf(w), x, n, y, ldy, accumulate);
    }
  } else {
    GemvBlockKernel<kType, kTokens>
        <<<grid, kGemvWarps * 32, 0, s>>>(ViewOf(w), x, n, y, ldy, accumulate);
  }
}

}  // namespace

absl::Status Gemv(const DeviceMatrix& w, const float* d_x, int64_t n, float* d_y, int64_t ldy,
                  bool accumulate, Stream stream) {
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (n > int64_t(kGemvTokens) * 65535) return absl::InvalidArgumentError("cuda Gemv: n too large");
  const cudaStream_t s = AsStream(stream);
  const bool ok = DispatchType(w.type, /*tables_too=*/false, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    if (n == 1) {
      LaunchGemv<kType, 1>(w, d_x, n, d_y, ldy, accumulate, s);
    } else if (n == 2) {
      LaunchGemv<kType, 2>(w, d_x, n, d_y, ldy, accumulate, s);
    } else if (n <= 4) {
      LaunchGemv<kType, 4>(w, d_x, n, d_y, ldy, accumulate, s);
    } else {
      LaunchGemv<kType, kGemvTokens>(w, d_x, n, d_y, ldy, accumulate, s);
    }
  });
  if (!ok) return absl::InvalidArgumentError("cuda Gemv: unsupported matrix type");
  return LaunchStatus("Gemv");
}

bool GemvInt8Supports(const DeviceMatrix& w) {
  return w.scales != nullptr && PlanarTypeOf(w.type) >= 0 && w.cols % kQK == 0 &&
         Int8SmemBytes(w.cols, 1) <= kI8SmemBytes;
}

absl::Status GemvInt8(const DeviceMatrix& w, const float* d_x, int64_t n, float* d_y, int64_t ldy,
                      bool accumulate, Stream stream) {
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (!GemvInt8Supports(w)) {
    return absl::InvalidArgumentError(
        "cuda GemvInt8: needs a planar Q4_0/Q4_1/Q8_0 matrix of at most 21,845 columns");
  }
  if (n > int64_t(65535)) return absl::InvalidArgumentError("cuda GemvInt8: n too large");
  // Tokens per pass: the fewest passes over the weights whose x fits the
  // shared memory (a power of two up to kGemvTokens).
  int tok = 1;
  while (tok < kGemvTokens && tok < n && Int8SmemBytes(w.cols, 2 * tok) <= kI8SmemBytes) tok *= 2;
  const cudaStream_t s = AsStream(stream);
  DispatchType(w.type, /*tables_too=*/false, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    if constexpr (kType != kTypeBF16) {  // excluded by GemvInt8Supports
      switch (tok) {
        case 1:
          return LaunchGemvInt8<kType, 1>(w, d_x, n, d_y, ldy, accumulate, s);
        case 2:
          return LaunchGemvInt8<kType, 2>(w, d_x, n, d_y, ldy, accumulate, s);
        case 4:
          return LaunchGemvInt8<kType, 4>(w, d_x, n, d_y, ldy, accumulate, s);
        default:
          return LaunchGemvInt8<kType, kGemvTokens>(w, d_x, n, d_y, ldy, accumulate, s);
      }
    }
  });
  return LaunchStatus("GemvInt8");
}

absl::Status DequantizeToBf16(const DeviceMatrix& w, int64_t row0, int64_t num_rows,
                              uint16_t* d_out, Stream stream) {
  if (num_rows == 0) return absl::OkStatus();
  const int64_t nblk = (w.cols + kQK - 1) / kQK;
  const bool ok = DispatchType(w.type, /*tables_too=*/false, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    if (w.scales != nullptr) {
      Dequant8Bf16Kernel<kType><<<Blocks(num_rows * (w.cols / 8), 256), 256, 0, AsStream(stream)>>>(
          ViewOf(w), row0, num_rows, d_out);
    } else {
      DequantBf16Kernel<kType><<<Blocks(num_rows * nblk, 256), 256, 0, AsStream(stream)>>>(
          ViewOf(w), row0, num_rows, d_out);
    }
  });
  if (!ok) return absl::InvalidArgumentError("cuda DequantizeToBf16: unsupported type");
  return LaunchStatus("DequantizeToBf16");
}

int64_t PlanarBytes(const DeviceMatrix& w) {
  const int type = PlanarTypeOf(w.type);
  if (type < 0 || w.scales != nullptr) return 0;
  const int64_t blocks = w.rows * ((w.cols + kQK - 1) / kQK);
  return Align256(blocks * PlanarQuantBytes(type)) + Align256(blocks * PlanarScaleBytes(type));
}

absl::StatusOr<DeviceMatrix> RepackPlanar(const DeviceMatrix& src, void* d_dst, Stream stream) {
  const int type = PlanarTypeOf(src.type);
  if (type < 0) return absl::InvalidArgumentError("cuda RepackPlanar: not Q4_0/Q4_1/Q8_0");
  if (src.scales != nullptr) return absl::InvalidArgumentError("cuda RepackPlanar: already planar");
  if (src.cols % kQK != 0) return absl::InvalidArgumentError("cuda RepackPlanar: cols % 32 != 0");
  const int64_t blocks = src.rows * (src.cols / kQK);
  auto* quants = static_cast<uint8_t*>(d_dst);
  uint8_t* scales = quants + Align256(blocks * PlanarQuantBytes(type));
  DispatchType(src.type, /*tables_too=*/false, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    if constexpr (kType != kTypeBF16) {
      RepackPlanarKernel<kType>
          <<<Blocks(blocks, 256), 256, 0, AsStream(stream)>>>(ViewOf(src), quants, scales);
    }
  });
  if (absl::Status st = LaunchStatus("RepackPlanar"); !st.ok()) return st;
  DeviceMatrix out = src;
  out.data = quants;
  out.scales = scales;
  return out;
}

}  // namespace tandem::kernels::cuda
