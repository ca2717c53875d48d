// Per-ISA variants of the kernels whose fast paths are AVX-512 code under
// TANDEM_KERNELS_AVX512 (attention.cc, matmul.cc, ops.cc, dequant_fast.cc,
// and kv_dtype.cc's row coders).
//
// On x86-64 those files are compiled three times (kernels/CMakeLists.txt):
// with the AVX-512 flags of qgemm_avx512.cc into namespace `avx512`, with
// AVX2 + FMA + F16C into `avx2`, and with the build's own flags minus
// AVX-512 into `base`. simd_dispatch.cc defines the public functions and
// calls one variant, chosen once per process from CPUID (and
// TANDEM_KERNEL_ISA), so a portable build (-DTANDEM_NATIVE=OFF: the Docker
// image) runs the AVX-512 attention and GEMM paths on a CPU that has them,
// and the portable forms elsewhere. Other targets compile the files once,
// without a namespace.
#ifndef TANDEM_KERNELS_CPU_VARIANT_H_
#define TANDEM_KERNELS_CPU_VARIANT_H_

#if defined(TANDEM_KERNELS_VARIANT)
#define TANDEM_KERNELS_VARIANT_BEGIN namespace TANDEM_KERNELS_VARIANT {
#define TANDEM_KERNELS_VARIANT_END }
#else
#define TANDEM_KERNELS_VARIANT_BEGIN
#define TANDEM_KERNELS_VARIANT_END
#define TANDEM_KERNELS_VARIANT_PRIMARY 1
#endif

// TANDEM_KERNELS_VARIANT_PRIMARY (set for `base` and when there are no
// variants): the compilation that also defines a file's ISA-independent
// functions, once.

// Inline helpers in headers (simd.h, qgemm_impl.h) compile differently under
// each TU's ISA flags (the avx512 variant, qgemm_avx512.cc, qgemm_avx2.cc,
// the base variant): TANDEM_KERNELS_ABI_BEGIN opens an inline namespace per
// flavour, so each has its own symbols and the linker can never merge an
// AVX-512 copy into code that runs on a CPU without it.
#if defined(__AVX512F__)
#define TANDEM_KERNELS_ABI_BEGIN inline namespace abi_avx512 {
#elif defined(__AVX2__)
#define TANDEM_KERNELS_ABI_BEGIN inline namespace abi_avx2 {
#else
#define TANDEM_KERNELS_ABI_BEGIN inline namespace abi_base {
#endif
#define TANDEM_KERNELS_ABI_END }

#endif  // TANDEM_KERNELS_CPU_VARIANT_H_
