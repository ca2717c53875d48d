// The public entry points of the kernels built per ISA (kernels/cpu/variant.h):
// each calls the avx512, avx2 or base variant, chosen once per process.
//
// avx512 needs what qgemm_avx512.cc needs (AVX-512 F/BW/VL/DQ/VNNI, FMA,
// F16C), avx2 what qgemm_avx2.cc needs (AVX2, FMA, F16C). TANDEM_KERNEL_ISA
// (avx2 | scalar), which forces QGemm's lesser paths, also caps the variant
// here (avx2 | base), so a forced run is what a CPU without AVX-512 runs.
// The variants' attention and DotF32-based matmuls give the same bits
// (kernels_test SimdVariantTest).
#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/kv_dtype.h"

#if defined(TANDEM_KERNELS_HAVE_VARIANTS)
#include <cpuid.h>
#endif

namespace tandem::kernels {

#if !defined(TANDEM_KERNELS_HAVE_VARIANTS)
// One build of the kernels (not x86-64): nothing to choose.
std::string SimdKernelsVariant() { return "base"; }
bool SetSimdKernelsVariantForTesting(const std::string& variant) { return variant == "base"; }
#else

#define TANDEM_VARIANT_DECLARATIONS                                                                \
  void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool);         \
  void MatMulShared(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n,  \
                    ThreadPool* pool);                                                             \
  void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out);        \
  void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);  \
  void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,    \
            const RopeParams& params);                                                             \
  void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,          \
              int64_t num_kv_heads, int64_t head_dim, const RopeParams& params);                   \
  void RopeQKAngles(float* q, float* k, const float* cs, int64_t n, int64_t num_heads,             \
                    int64_t num_kv_heads, int64_t head_dim, const RopeParams& params);             \
  void SiluMul(const float* gate, const float* up, int64_t n, float* out);                         \
  void Add(const float* a, const float* b, int64_t n, float* out);                                 \
  void Softmax(float* x, int64_t n, int64_t dim);                                                  \
  void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,                        \
               const int64_t* slot_mapping, int64_t n, const KvCacheView& cache);                  \
  void PagedAttention(const PagedAttentionArgs& args, const float* q, const KvCacheView& cache,    \
                      float* out, ThreadPool* pool);                                               \
  KvScale QuantizeKvHead(KvDtype dtype, const float* x, int64_t n, void* dst);                     \
  void DequantizeKvHead(KvDtype dtype, const void* src, KvScale scale, int64_t n, float* dst);     \
  namespace cpu {                                                                                  \
  bool FusedRowDot(gguf::TensorType type, const void* row, const float* x, int64_t n, float* out); \
  void DequantizeRowFast(gguf::TensorType type, const void* src, float* dst, int64_t n);           \
  }

namespace avx512 {
TANDEM_VARIANT_DECLARATIONS
}  // namespace avx512
namespace avx2 {
TANDEM_VARIANT_DECLARATIONS
}  // namespace avx2
namespace base {
TANDEM_VARIANT_DECLARATIONS
}  // namespace base

#undef TANDEM_VARIANT_DECLARATIONS

namespace {

enum Variant { kBase = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr const char* kVariantNames[] = {"base", "avx2", "avx512"};

bool CpuRuns(Variant v) {
  if (v == kBase) return true;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  const bool avx2 = f16c && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  if (v == kAvx2) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

Variant Detect() {
  const char* env = std::getenv("TANDEM_KERNEL_ISA");
  const std::string forced = env != nullptr ? env : "";
  if (forced == "scalar") return kBase;
  if (forced != "avx2" && CpuRuns(kAvx512)) return kAvx512;
  return CpuRuns(kAvx2) ? kAvx2 : kBase;
}

// -1: not chosen yet; else a Variant.
std::atomic<int> g_variant{-1};

Variant Chosen() {
  int v = g_variant.load(std::memory_order_relaxed);
  if (v < 0) {
    v = Detect();
    g_variant.store(v, std::memory_order_relaxed);
  }
  return static_cast<Variant>(v);
}

}  // namespace

// Returns fn of the chosen variant (Chosen() read once).
#define TANDEM_DISPATCH(fn, ...)      \
  switch (Chosen()) {                 \
    case kAvx512:                     \
      return avx512::fn(__VA_ARGS__); \
    case kAvx2:                       \
      return avx2::fn(__VA_ARGS__);   \
    default:                          \
      return base::fn(__VA_ARGS__);   \
  }

std::string SimdKernelsVariant() { return kVariantNames[Chosen()]; }

bool SetSimdKernelsVariantForTesting(const std::string& variant) {
  for (int v = kBase; v <= kAvx512; ++v) {
    if (variant == kVariantNames[v] && CpuRuns(static_cast<Variant>(v))) {
      g_variant.store(v, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  TANDEM_DISPATCH(MatMul, w, x, n, y, pool);
}
void MatMulShared(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n,
                  ThreadPool* pool) {
  TANDEM_DISPATCH(MatMulShared, ws, ys, count, x, n, pool);
}
void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  TANDEM_DISPATCH(EmbeddingLookup, table, ids, n, out);
}
void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  TANDEM_DISPATCH(RmsNorm, x, weight, n, dim, eps, y);
}
void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,
          const RopeParams& params) {
  TANDEM_DISPATCH(Rope, x, positions, n, num_heads, head_dim, params);
}
void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,
            int64_t num_kv_heads, int64_t head_dim, const RopeParams& params) {
  TANDEM_DISPATCH(RopeQK, q, k, positions, n, num_heads, num_kv_heads, head_dim, params);
}
void RopeQKAngles(float* q, float* k, const float* cs, int64_t n, int64_t num_heads,
                  int64_t num_kv_heads, int64_t head_dim, const RopeParams& params) {
  TANDEM_DISPATCH(RopeQKAngles, q, k, cs, n, num_heads, num_kv_heads, head_dim, params);
}
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  TANDEM_DISPATCH(SiluMul, gate, up, n, out);
}
void Add(const float* a, const float* b, int64_t n, float* out) {
  TANDEM_DISPATCH(Add, a, b, n, out);
}
void Softmax(float* x, int64_t n, int64_t dim) { TANDEM_DISPATCH(Softmax, x, n, dim); }
void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, const KvCacheView& cache) {
  TANDEM_DISPATCH(WriteKv, layout, k, v, slot_mapping, n, cache);
}
void PagedAttention(const PagedAttentionArgs& args, const float* q, const KvCacheView& cache,
                    float* out, ThreadPool* pool) {
  TANDEM_DISPATCH(PagedAttention, args, q, cache, out, pool);
}
KvScale QuantizeKvHead(KvDtype dtype, const float* x, int64_t n, void* dst) {
  TANDEM_DISPATCH(QuantizeKvHead, dtype, x, n, dst);
}
void DequantizeKvHead(KvDtype dtype, const void* src, KvScale scale, int64_t n, float* dst) {
  TANDEM_DISPATCH(DequantizeKvHead, dtype, src, scale, n, dst);
}

namespace cpu {
bool FusedRowDot(gguf::TensorType type, const void* row, const float* x, int64_t n, float* out) {
  TANDEM_DISPATCH(cpu::FusedRowDot, type, row, x, n, out);
}
void DequantizeRowFast(gguf::TensorType type, const void* src, float* dst, int64_t n) {
  TANDEM_DISPATCH(cpu::DequantizeRowFast, type, src, dst, n);
}
}  // namespace cpu

#undef TANDEM_DISPATCH
#endif  // TANDEM_KERNELS_HAVE_VARIANTS

}  // namespace tandem::kernels
