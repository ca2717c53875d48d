// AMX-INT8 QGemm (Sapphire Rapids and later): the integer block dots of
// 16 tokens x 16 rows (8 tokens when a call has fewer than 16) come from one
// TDPBSUD per block and level (signed int8 activations as the A tile, the
// packed unsigned weight block as the B tile: our 16-row interleave is
// exactly AMX's B layout; TDPBSSD on the signed q - offset for the types
// without a min), then the f32 steps of ref::QGemm run on AVX-512
// per token, so every output is bit-identical to the reference and to the
// VNNI path (int32 block sums are exact).
//
// Loop order: per row group its weight blocks are unpacked once (4-bit:
// nibbles and bit planes to bytes, UnpackChunk) into a thread-local buffer with their f32 scales,
// then every token tile runs over all blocks with its accumulators in registers. Fewer than
// kAmxMinTokens tokens go to the VNNI kernel (decode GEMV is bandwidth-bound; a mostly empty tile
// wastes the f32 work).
//
// Where the time goes (SmolLM2 gate|up, 512 tokens, two levels, one core):
// the tile instructions alone (loads, dots, the stores of the int32 sums)
// take about 70% of the kernel's time, so a full 16-row A tile (twice the
// work per tile load / dot / store of 8 rows) made the kernel 1.35x faster.
//
// Needs the OS to grant the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM,
// Linux >= 5.16); Avx512AmxImpl() is null where CPUID, XCR0 or the kernel
// say no. Compiled with the AVX-512 flags plus -mamx-tile -mamx-int8
// (kernels/CMakeLists.txt).
#include "kernels/cpu/qgemm_impl.h"
#include "kernels/cpu/qgemm_unpack_avx512.h"

#if defined(__x86_64__) && defined(__AMX_INT8__) && defined(__AMX_TILE__) && \
    defined(__AVX512BW__) && defined(__linux__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kAmxMinTokens = 8;
constexpr int64_t kPrefetchBlocks = 8;

// Tiles: A = activations (kTok tokens x 32 int8), A2 = their level-2
// quants, B = one packed weight block (8 x 64 bytes: 4 quants of each of 16
// rows per 64-byte row), C / C2 = kTok tokens x 16 rows int32.
// tmm0 = A, tmm1 = A2, tmm2 / tmm7 = B of even / odd blocks, tmm3 / tmm4 =
// C / C2 of even blocks, tmm5 / tmm6 of odd ones. Own asm instead of the
// _tile_* intrinsics so that the compiler sees exactly which bytes a tile
// load reads and a store writes (the intrinsics' loads declare no memory,
// their stores clobber all of it).
#define TANDEM_TILE_LOAD(tmm, ptr, stride, bytes)                                 \
  __asm__ volatile("tileloadd (%1,%2,1), %%tmm" #tmm                              \
                   :                                                              \
                   : "m"(*reinterpret_cast<const char(*)[bytes]>(ptr)), "r"(ptr), \
                     "r"(static_cast<long>(stride)))
#define TANDEM_TILE_STORE(tmm, ptr, stride, bytes)                \
  __asm__ volatile("tilestored %%tmm" #tmm ", (%1,%2,1)"          \
                   : "=m"(*reinterpret_cast<char(*)[bytes]>(ptr)) \
                   : "r"(ptr), "r"(static_cast<long>(stride)))
// C = A . B from zero (tilezero + tdpbsud: signed A, unsigned B; tdpbssd:
// both signed).
#define TANDEM_TILE_DP_SU(c, a, b) \
  __asm__ volatile("tilezero %%tmm" #c "\n\ttdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TANDEM_TILE_DP_SS(c, a, b) \
  __asm__ volatile("tilezero %%tmm" #c "\n\ttdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TANDEM_TILE_DP(c, a, b)   \
  do {                            \
    if constexpr (kSigned) {      \
      TANDEM_TILE_DP_SS(c, a, b); \
    } else {                      \
      TANDEM_TILE_DP_SU(c, a, b); \
    }                             \
  } while (0)

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig MakeConfig(int kTok) {
  TileConfig c;
  c.colsb[0] = c.colsb[1] = 32;  // A, A2
  c.rows[0] = c.rows[1] = kTok;
  c.colsb[2] = c.colsb[7] = 64;  // B of even / odd blocks
  c.rows[2] = c.rows[7] = 8;
  for (int i = 3; i <= 6; ++i) {  // C tiles
    c.colsb[i] = 64;
    c.rows[i] = kTok;
  }
  return c;
}

// Per-thread unpacked weights of one row group: nb blocks of 512 quant bytes,
// then nb x (d[16], m[16]) as f32.
struct GroupBuffer {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> mem;
  int64_t capacity = 0;
  uint8_t* Reserve(int64_t bytes) {
    if (bytes > capacity) {
      capacity = (bytes + 4095) / 4096 * 4096;
      mem.reset(static_cast<uint8_t*>(std::aligned_alloc(64, capacity)));
    }
    return mem.get();
  }
};

// kTok: the A / C tile rows, tokens per tile: a QuantizedActs tile (16),
// or half of one (8) when fewer than 16 tokens would leave a full tile
// mostly empty.
template <int kTok, int kBits, bool kHasMin, ScaleFormat kFmt, bool kTwo>
void GemmT(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  static_assert(kActTile % kTok == 0);
  static const TileConfig config = MakeConfig(kTok);
  thread_local GroupBuffer buffer;
  const int64_t nb = w.num_blocks(), cb = w.chunk_bytes();
  // Types without a min run on signed weights q - offset (TDPBSSD), so the
  // sums come out with the offset applied; nibble-packed (4-, 5-bit) and
  // signed weights are unpacked to bytes once per row group (UnpackChunk,
  // shared with the VNNI path), 8-bit unsigned ones read in place.
  constexpr bool kSigned = !kHasMin;
  constexpr bool kUnpack = kBits != 8 || kSigned;
  const int64_t quant_bytes = kUnpack ? nb * 512 : 0;
  uint8_t* buf = buffer.Reserve(quant_bytes + nb * 128);
  float* scales = reinterpret_cast<float*>(buf + quant_bytes);
  const __m512i off8 = _mm512_set1_epi8(static_cast<char>(w.offset()));
  const int64_t tiles = (a.n + kTok - 1) / kTok;
  constexpr int64_t kStep = kActTile * kQBlock;  // bytes of one tile-block of quants
  alignas(64) int32_t cbuf[2][kTok * 16];
  alignas(64) int32_t cbuf2[2][kTok * 16];
  _tile_loadconfig(&config);
  // The unpacked weights below are read by tile loads (declared to the
  // compiler through their "m" operands).
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* c = w.chunk(g, 0);
    for (int64_t b = 0; b < nb; ++b, c += cb) {
      // The weights stream once: fetch kPrefetchBlocks chunks ahead (into
      // the next group at the end, usually this thread's).
      for (int64_t off = 0; off < cb; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetchBlocks * cb + off), _MM_HINT_T0);
      }
      // Unsigned q to the stored form: q - offset when signed (mod 256).
      auto form = [&](__m512i q) { return kSigned ? _mm512_sub_epi8(q, off8) : q; };
      if constexpr (kUnpack) {
        uint8_t* dst = buf + b * 512;
        __m512i wq[8];
        UnpackChunk<kBits>(c, wq);
        for (int j = 0; j < 8; ++j) _mm512_store_si512(dst + 64 * j, form(wq[j]));
      }
      __m512 dv, mv;
      ChunkScales<kFmt, kHasMin>(c + kBits * 64, w.super_scales(g, b), &dv, &mv);
      _mm512_store_ps(scales + b * 32, dv);
      if constexpr (kHasMin) _mm512_store_ps(scales + b * 32 + 16, mv);
    }
    const int64_t valid_rows = std::min<int64_t>(kGroupRows, w.rows() - g * kGroupRows);
    const __mmask16 rmask = static_cast<__mmask16>((1u << valid_rows) - 1u);
    const uint8_t* wb = kUnpack ? buf : w.chunk(g, 0);
    const int64_t wstride = kUnpack ? 512 : cb;
    for (int64_t tt = 0; tt < tiles; ++tt) {
      __m512 acc[kTok];
#pragma GCC unroll 16
      for (int t = 0; t < kTok; ++t) acc[t] = _mm512_setzero_ps();
      const int64_t i0 = a.Index(tt * kTok, 0);
      const int8_t* xq = a.qs.data() + i0 * kQBlock;
      const int8_t* xq2 = kTwo ? a.qs2.data() + i0 * kQBlock : nullptr;
      const float* xd = a.d.data() + i0;
      const float* xsd = a.sd.data() + i0;
      // Block b's integer dots go to tile set b % 2 and are stored to
      // cbuf[b % 2] after block b + 1's dots are issued (tile ops run in
      // order: a store right after its own dot would wait for it); then the
      // f32 steps of block b run while the tiles compute block b + 1.
      auto issue = [&](int64_t b) {
        TANDEM_TILE_LOAD(0, xq + b * kStep, kQBlock, kTok * kQBlock);
        if (b % 2 == 0) {
          TANDEM_TILE_LOAD(2, wb + b * wstride, 64, 512);
          TANDEM_TILE_DP(3, 0, 2);
        } else {
          TANDEM_TILE_LOAD(7, wb + b * wstride, 64, 512);
          TANDEM_TILE_DP(5, 0, 7);
        }
        if constexpr (kTwo) {
          TANDEM_TILE_LOAD(1, xq2 + b * kStep, kQBlock, kTok * kQBlock);
          if (b % 2 == 0) {
            TANDEM_TILE_DP(4, 1, 2);
          } else {
            TANDEM_TILE_DP(6, 1, 7);
          }
        }
      };
      auto store = [&](int64_t b) {
        int32_t* m1 = cbuf[b % 2];
        int32_t* m2 = cbuf2[b % 2];
        if (b % 2 == 0) {
          TANDEM_TILE_STORE(3, m1, 64, kTok * 64);
          if constexpr (kTwo) TANDEM_TILE_STORE(4, m2, 64, kTok * 64);
        } else {
          TANDEM_TILE_STORE(5, m1, 64, kTok * 64);
          if constexpr (kTwo) TANDEM_TILE_STORE(6, m2, 64, kTok * 64);
        }
      };
      issue(0);
      for (int64_t b = 0; b < nb; ++b) {
        if (b + 1 < nb) issue(b + 1);
        store(b);
        const int32_t* c1 = cbuf[b % 2];
        const int32_t* c2 = cbuf2[b % 2];
        const __m512 dv = _mm512_load_ps(scales + b * 32);
        const __m512 mv = kHasMin ? _mm512_load_ps(scales + b * 32 + 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int t = 0; t < kTok; ++t) {
          const int64_t k = b * kActTile + t;
          const __m512 ddx = _mm512_mul_ps(dv, _mm512_set1_ps(xd[k]));
          __m512i is = _mm512_load_si512(c1 + 16 * t);
          if constexpr (kTwo) {
            is = _mm512_add_epi32(_mm512_slli_epi32(is, 8), _mm512_load_si512(c2 + 16 * t));
          }
          if constexpr (kHasMin) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsd[k]), acc[t]);
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), ddx, acc[t]);
        }
      }
      const int64_t valid = std::min<int64_t>(kTok, a.n - tt * kTok);
      // Constant indices keep acc[] in registers.
#pragma GCC unroll 16
      for (int t = 0; t < kTok; ++t) {
        if (t >= valid) break;
        float* out = y + (tt * kTok + t) * ldy + g * kGroupRows;
        __m512 v = acc[t];
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(rmask, out), v);
        _mm512_mask_storeu_ps(out, rmask, v);
      }
    }
  }
  _tile_release();
}

// GemmT for w's quant width (4, 5 or 8 bits; the 6-bit Q6_K runs on VNNI).
template <int kTok, bool kHasMin, ScaleFormat kFmt, bool kTwo>
void GemmB(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  switch (w.bits()) {
    case 4:
      GemmT<kTok, 4, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    case 5:
      GemmT<kTok, 5, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    default:
      GemmT<kTok, 8, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
  }
}

template <int kTok, bool kTwo>
void GemmL(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  constexpr ScaleFormat kF16 = ScaleFormat::kF16, kF32 = ScaleFormat::kF32;
  if (w.scale_format() == kF32) {  // Q4_K, Q5_K
    GemmB<kTok, true, kF32, kTwo>(w, a, g0, g1, y, ldy, accumulate);
  } else {
    (w.has_min() ? GemmB<kTok, true, kF16, kTwo> : GemmB<kTok, false, kF16, kTwo>)(w, a, g0, g1, y,
                                                                                   ldy, accumulate);
  }
}

void Gemm(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
          int64_t ldy, bool accumulate) {
  // Q6_K's two scales per block (kF32Halves) need half-block dots: VNNI,
  // bit-identical, for every batch size.
  if (a.n < kAmxMinTokens || w.scale_format() == ScaleFormat::kF32Halves) {
    Avx512VnniImpl()->gemm(w, a, g0, g1, y, ldy, accumulate);
    return;
  }
  if (a.n < kActTile) {
    (a.levels == 2 ? GemmL<8, true> : GemmL<8, false>)(w, a, g0, g1, y, ldy, accumulate);
  } else {
    (a.levels == 2 ? GemmL<16, true> : GemmL<16, false>)(w, a, g0, g1, y, ldy, accumulate);
  }
}

// CPUID AMX-TILE + AMX-INT8, XCR0 tile state enabled, and the kernel's
// permission for this process to use the tile data state.
bool AmxUsable() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 24)) || !(edx & (1u << 25))) return false;  // AMX-TILE, AMX-INT8
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0x60000u) != 0x60000u) return false;  // XTILECFG, XTILEDATA
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

QGemmImpl MakeImpl() {
  QGemmImpl impl = *Avx512VnniImpl();
  impl.name = "amx";
  impl.gemm = Gemm;
  return impl;
}

}  // namespace

const QGemmImpl* Avx512AmxImpl() {
  static const bool usable = Avx512VnniImpl() != nullptr && AmxUsable();
  if (!usable) return nullptr;
  static const QGemmImpl impl = MakeImpl();
  return &impl;
}

}  // namespace tandem::kernels::cpu

#else

namespace tandem::kernels::cpu {
const QGemmImpl* Avx512AmxImpl() { return nullptr; }
}  // namespace tandem::kernels::cpu

#endif
