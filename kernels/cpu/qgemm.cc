// Run-time ISA dispatch for QGemm and the fused activation-quantizing ops.
//
// The path is chosen once from CPUID (__builtin_cpu_supports): AMX-INT8
// (with AVX-512 VNNI for small batches and the activation ops), else AVX-512
// VNNI, else AVX2 + FMA + F16C, else scalar. TANDEM_KERNEL_ISA=
// avx512vnni|avx2|scalar forces a lesser path (benchmarks, tests). QGemm and the activation quants
// are bit-identical on every path; SiLU uses a SIMD exp on AVX-512 and libm elsewhere
// (deterministic per machine, not across ISAs).
#include "kernels/qgemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/qgemm_impl.h"

namespace tandem::kernels {
namespace {

#if defined(__x86_64__)
// F16C (CPUID.1:ECX bit 29) read directly: clang's __builtin_cpu_supports
// does not know the "f16c" name.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

bool CpuHas(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "amx") return CpuHas("avx512vnni") && cpu::Avx512AmxImpl() != nullptr;
  if (isa == "avx512vnni") {
    return cpu::Avx512VnniImpl() != nullptr && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
  }
  if (isa == "avx2") {
    return cpu::Avx2Impl() != nullptr && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && HasF16c();
  }
#endif
  return isa == "scalar";
}

const cpu::QGemmImpl* ImplFor(const std::string& isa) {
  if (isa == "amx") return cpu::Avx512AmxImpl();
  if (isa == "avx512vnni") return cpu::Avx512VnniImpl();
  if (isa == "avx2") return cpu::Avx2Impl();
  return cpu::ScalarImpl();
}

const cpu::QGemmImpl* Detect() {
  const char* env = std::getenv("TANDEM_KERNEL_ISA");
  const std::string forced = env != nullptr ? env : "";
  // Best first; a forced ISA skips everything above it.
  static const char* const kOrder[] = {"amx", "avx512vnni", "avx2", "scalar"};
  bool skip = false;
  for (const char* isa : kOrder) skip = skip || forced == isa;
  for (const char* isa : kOrder) {
    if (skip && forced != isa) continue;
    skip = false;
    if (CpuHas(isa)) return ImplFor(isa);
  }
  return cpu::ScalarImpl();
}

std::atomic<const cpu::QGemmImpl*> g_impl{nullptr};

const cpu::QGemmImpl& Impl() {
  const cpu::QGemmImpl* impl = g_impl.load(std::memory_order_acquire);
  if (impl == nullptr) {
    impl = Detect();
    g_impl.store(impl, std::memory_order_release);
  }
  return *impl;
}

using QuantRowFn = void (*)(const float*, int64_t, const cpu::ActRow&);

QuantRowFn QuantRow() {
  QuantRowFn f = Impl().quantize_row;
  return f != nullptr ? f : cpu::ScalarImpl()->quantize_row;
}

void QuantizeOne(QuantRowFn f, const float* x, int64_t t, QuantizedActs* out, ActScale scale) {
  f(x, out->cols, cpu::RowOf(out, t, x, scale == ActScale::kPerToken));
}

}  // namespace

std::string QGemmIsa() { return Impl().name; }

bool SetQGemmIsaForTesting(const std::string& isa) {
  if (!CpuHas(isa)) return false;
  g_impl.store(ImplFor(isa), std::memory_order_release);
  return true;
}

namespace {

// Tokens are independent, so the split over the pool never changes a result;
// below kMinParallelTokens per chunk the dispatch costs more than it saves.
constexpr int64_t kMinParallelTokens = 4;

void ForTokens(ThreadPool* pool, int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  ThreadPool::Run(pool, n, fn, kMinParallelTokens);
}

}  // namespace

void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels,
                  ThreadPool* pool, ActScale scale) {
  TANDEM_CHECK(cols % kQBlock == 0 && (levels == 1 || levels == 2));
  out->Resize(n, cols, levels);
  const QuantRowFn f = QuantRow();
  ForTokens(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) QuantizeOne(f, x + t * cols, t, out, scale);
  });
}

void RmsNormQuantize(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     QuantizedActs* out, int levels, ThreadPool* pool, ActScale scale) {
  TANDEM_CHECK(dim % kQBlock == 0 && (levels == 1 || levels == 2));
  out->Resize(n, dim, levels);
  const QuantRowFn f = QuantRow();
  ForTokens(pool, n, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(dim);  // one normed row, still in L1 when quantized
    for (int64_t t = t0; t < t1; ++t) {
      RmsNorm(x + t * dim, weight, 1, dim, eps, row.data());
      QuantizeOne(f, row.data(), t, out, scale);
    }
  });
}

void SiluMulQuantize(const float* gu, int64_t n, int64_t ffn, QuantizedActs* out, int levels,
                     ThreadPool* pool, ActScale scale) {
  TANDEM_CHECK(ffn % kQBlock == 0 && (levels == 1 || levels == 2));
  out->Resize(n, ffn, levels);
  const QuantRowFn f = QuantRow();
  auto silu = Impl().silu_mul != nullptr ? Impl().silu_mul : cpu::ScalarImpl()->silu_mul;
  ForTokens(pool, n, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(ffn);
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = gu + t * 2 * ffn;
      silu(g, g + ffn, ffn, row.data());
      QuantizeOne(f, row.data(), t, out, scale);
    }
  });
}

void QGemm(const PackedWeight& w, const QuantizedActs& acts, float* y, int64_t ldy, bool accumulate,
           ThreadPool* pool) {
  TANDEM_CHECK(acts.cols == w.cols() && ldy >= w.rows());
  if (acts.n <= 0 || w.rows() <= 0) return;
  const auto gemm = Impl().gemm;
  // Row groups are the unit of work: each (token, row) output belongs to one
  // group, so the split never changes what is computed.
  ThreadPool::Run(pool, w.num_groups(),
                  [&](int64_t g0, int64_t g1) { gemm(w, acts, g0, g1, y, ldy, accumulate); });
}

}  // namespace tandem::kernels
