// Q/K/V bias + RoPE + the K/V cache write, one CTA per token.
#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHalfRot = 512;  // rot_dim / 2 (head_dim <= 1024)

template <typename Kv>
__global__ void QkvRopeKvKernel(QkvRopeArgs a) {
  __shared__ float cs[kMaxHalfRot], sn[kMaxHalfRot];
  const int64_t t = blockIdx.x;
  const int64_t hd = a.head_dim, qd = a.num_heads * hd, kvd = a.num_kv_heads * hd;
  const int64_t half = a.rot_dim / 2;
  float* row = a.d_qkv + t * a.stride;
  const int32_t pos = a.d_positions[t];
  // Angles exactly as kernels::ref::Rope computes them (double, then float).
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    double theta = double(pos) * double(a.freq_scale) *
                   pow(double(a.freq_base), -2.0 * double(i) / double(a.rot_dim));
    if (a.d_freq_factors != nullptr) theta /= a.d_freq_factors[i];
    cs[i] = static_cast<float>(cos(theta));
    sn[i] = static_cast<float>(sin(theta));
  }
  if (a.d_bias != nullptr) {
    for (int64_t c = threadIdx.x; c < qd + 2 * kvd; c += blockDim.x) row[c] += a.d_bias[c];
  }
  __syncthreads();
  const int64_t heads = a.num_heads + a.num_kv_heads;
  for (int64_t p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int64_t h = p / half, i = p % half;
    float* v = row + h * hd;  // K heads follow the Q heads in the row
    const bool adjacent = a.style == RopeStyle::kAdjacentPairs;
    const int64_t i0 = adjacent ? 2 * i : i;
    const int64_t i1 = adjacent ? 2 * i + 1 : i + half;
    const float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * cs[i] - x1 * sn[i];
    v[i1] = x0 * sn[i] + x1 * cs[i];
  }
  __syncthreads();
  const int64_t slot = a.d_slots[t];
  auto* kc = static_cast<typename Kv::T*>(a.d_k_cache);
  auto* vc = static_cast<typename Kv::T*>(a.d_v_cache);
  for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
    kc[slot * kvd + c] = Kv::From(row[qd + c]);
    vc[slot * kvd + c] = Kv::From(row[qd + kvd + c]);
  }
}

}  // namespace

absl::Status QkvRopeKvWrite(const QkvRopeArgs& args, Stream stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.rot_dim < 0 || args.rot_dim % 2 != 0 || args.rot_dim > args.head_dim ||
      args.rot_dim / 2 > kMaxHalfRot) {
    return absl::InvalidArgumentError("cuda QkvRopeKvWrite: bad rot_dim");
  }
  return DispatchKvDtype(args.kv_dtype, "cuda QkvRopeKvWrite", [&](auto kv) {
    using Kv = decltype(kv);
    QkvRopeKvKernel<Kv><<<static_cast<unsigned>(args.num_tokens), 256, 0, AsStream(stream)>>>(args);
    return LaunchStatus("QkvRopeKvWrite");
  });
}

}  // namespace tandem::kernels::cuda
