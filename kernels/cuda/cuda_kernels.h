// CUDA kernels behind a host API with no CUDA types (DESIGN.md: kernels.h
// stays backend-neutral). Built only when CMake finds nvcc (TANDEM_CUDA=AUTO
// or ON); every function reports a missing device as Unavailable, so callers
// and tests can skip cleanly on a CPU-only machine.
#ifndef TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_
#define TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// Number of visible CUDA devices (0 when there is no driver or device).
int DeviceCount();

// RMSNorm of host arrays on device 0, the CUDA twin of kernels::RmsNorm:
// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight.
// x, y: [n, dim]; weight: [dim]. Unavailable without a device.
absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     float* y);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_
