// Device buffers for the CUDA kernel tests (no CUDA types: the kernels'
// host API does the allocation and copies).
#ifndef TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem::kernels::cuda::testing {

// Skips the test (named in the message) when no device is visible.
#define TANDEM_REQUIRE_CUDA_DEVICE() \
  if (::tandem::kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) : bytes_(bytes) {
    auto p = Malloc(bytes);
    TANDEM_CHECK(p.ok());
    ptr_ = *p;
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host)
      : DeviceBuffer(int64_t(host.size() * sizeof(T))) {
    TANDEM_CHECK(CopyToDevice(ptr_, host.data(), bytes_, nullptr).ok());
    TANDEM_CHECK(StreamSync(nullptr).ok());
  }
  ~DeviceBuffer() { Free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = float>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> ToHost() const {
    std::vector<T> out(bytes_ / sizeof(T));
    TANDEM_CHECK(StreamSync(nullptr).ok());
    TANDEM_CHECK(CopyToHost(out.data(), ptr_, bytes_, nullptr).ok());
    TANDEM_CHECK(StreamSync(nullptr).ok());
    return out;
  }

 private:
  int64_t bytes_;
  void* ptr_ = nullptr;
};

inline std::vector<float> RandomFloats(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// |got - want| <= atol + rtol * |want| for every element.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float atol,
                        float rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace tandem::kernels::cuda::testing

#endif  // TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_
