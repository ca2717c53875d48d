// The CUDA RMSNorm against the CPU scalar reference; skipped without a device.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
namespace {

TEST(CudaRmsNormTest, MatchesCpuReference) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 7, dim = 577;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n * dim), w(dim), want(n * dim), got(n * dim);
  for (float& v : x) v = d(rng);
  for (float& v : w) v = d(rng);
  ref::RmsNorm(x.data(), w.data(), n, dim, 1e-5f, want.data());
  ASSERT_TRUE(cuda::RmsNorm(x.data(), w.data(), n, dim, 1e-5f, got.data()).ok());
  for (int64_t i = 0; i < n * dim; ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i])));
}

TEST(CudaRmsNormTest, NoDeviceIsUnavailableNotACrash) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a device is present";
  std::vector<float> x(4, 1.f), w(4, 1.f), y(4);
  EXPECT_EQ(cuda::RmsNorm(x.data(), w.data(), 1, 4, 1e-5f, y.data()).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kernels
