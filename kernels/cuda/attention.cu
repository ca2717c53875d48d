// Paged attention: split-KV partials (one CTA per token, KV head and split
// of kAttentionSplit keys, the GQA group's query heads together) and a merge.
#include <cfloat>

#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;  // query heads per CTA
constexpr int kMaxHeadDim = 256;

// Partials of (token t, head h, split s) at index (t * H + h) * max_splits + s:
// running max m, sum l, and the unnormalized accumulator acc[head_dim].
struct Partials {
  float* m;
  float* l;
  float* acc;
  int64_t max_splits;
};

__device__ __forceinline__ int64_t SlotOf(const int32_t* table, int64_t j, int64_t bs) {
  return int64_t(table[j / bs]) * bs + j % bs;
}

// Scores: four lanes per key (lane c of a quad takes the key row's 16-byte
// chunks c, c + 4, ...: a quad reads 64 consecutive bytes, a warp eight keys
// at once), the quad's partial dot products summed by two shuffles. Then the
// tile's 32 scores per head go through shared memory to lane = key for the
// online softmax, and the probabilities back to shared memory, from which
// every lane reads them (broadcast) while it accumulates its own head dims
// of V (lane l owns dims 4 l .. 4 l + 3, and 128 further: coalesced 16-byte
// loads of each V row, eight rows loaded before they are used).
// Kv: the cache's element type (common.cuh: KvF32, KvF16, KvBf16), loaded 4
// elements at a time and widened to f32; everything after the load is f32.
template <typename Kv, int kChunks>  // V chunks of 4 dims per lane: head_dim <= 128 * kChunks
__global__ void __launch_bounds__(kWarps * 32, kChunks == 1 ? 4 : 2)
    AttnSplitKernel(DeviceAttentionArgs a, int64_t head_groups, Partials part) {
  __shared__ __align__(16) float q_s[kMaxGroup][kMaxHeadDim];
  __shared__ float m_s[kWarps][kMaxGroup], l_s[kWarps][kMaxGroup];
  __shared__ float p_s[kWarps][32][kMaxGroup];
  __shared__ int64_t slot_s[kWarps][32];
  __shared__ __align__(16) float acc_s[kWarps][kMaxGroup][kMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = lane / 4, qc = lane % 4;
  const int64_t t = blockIdx.y, split = blockIdx.z;
  const int64_t len = int64_t(a.d_positions[t]) + 1;
  const int64_t k0 = split * kAttentionSplit;
  if (k0 >= len) return;  // the merge reads only the splits below len
  const int64_t k1 = min(len, k0 + kAttentionSplit);
  const int64_t hd = a.layout.head_dim, kvh_count = a.layout.num_kv_heads;
  const int64_t group = a.num_heads / kvh_count;
  const int64_t kvh = blockIdx.x / head_groups;
  const int64_t g0 = (blockIdx.x % head_groups) * kMaxGroup;
  const int ng = static_cast<int>(Min64(kMaxGroup, group - g0));
  const int64_t h0 = kvh * group + g0;  // first query head of this CTA
  const int64_t row = kvh_count * hd, bs = a.layout.block_size;
  const int chunks = static_cast<int>(hd / 4);  // 16-byte chunks per row
  const int32_t* table = a.d_block_tables + int64_t(a.d_token_seq[t]) * a.max_blocks_per_seq;
  using T = typename Kv::T;
  const T* kc = static_cast<const T*>(a.d_k_cache) + kvh * hd;
  const T* vc = static_cast<const T*>(a.d_v_cache) + kvh * hd;

  for (int64_t i = threadIdx.x; i < ng * hd; i += blockDim.x) {
    q_s[i / hd][i % hd] = a.d_q[t * a.q_stride + (h0 + i / hd) * hd + i % hd] * a.scale;
  }
  __syncthreads();

  float m[kMaxGroup], l[kMaxGroup];
  float4 acc[kMaxGroup][kChunks];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) acc[g][i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int64_t tile = k0 + warp * 32; tile < k1; tile += kWarps * 32) {
    const int nk = static_cast<int>(Min64(32, k1 - tile));
    // Scores of the tile's keys, eight at a time (one per quad).
    for (int pass = 0; pass < 4; ++pass) {
      const int kk = pass * 8 + quad;
      const bool valid = kk < nk;
      const int64_t j = tile + kk;
      const int64_t slot = valid ? SlotOf(table, j, bs) : 0;
      float sc[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) sc[g] = 0.f;
      if (valid) {  // the row's chunks loaded first, then used
        const T* kr = kc + slot * row;
        float4 kv[8 * kChunks];
#pragma unroll
        for (int i = 0; i < 8 * kChunks; ++i) {
          const int ci = qc + 4 * i;
          kv[i] = ci < chunks ? Kv::Load4(kr + 4 * ci) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < 8 * kChunks; ++i) {
          const int ci = qc + 4 * i;
          if (ci >= chunks) break;
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g) {
            if (g < ng) {
              const float4 qv = reinterpret_cast<const float4*>(q_s[g])[ci];
              sc[g] += qv.x * kv[i].x + qv.y * kv[i].y + qv.z * kv[i].z + qv.w * kv[i].w;
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        sc[g] += __shfl_xor_sync(0xFFFFFFFFu, sc[g], 1);
        sc[g] += __shfl_xor_sync(0xFFFFFFFFu, sc[g], 2);
      }
      if (qc == 0) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) p_s[warp][kk][g] = sc[g];
        slot_s[warp][kk] = slot;
      }
    }
    __syncwarp();
    // Online softmax with lane = key.
    const bool valid = lane < nk;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= ng) continue;
      const float sg = valid ? p_s[warp][lane][g] : -INFINITY;
      const float new_m = fmaxf(m[g], WarpMax(sg));  // finite: key 0 is valid
      const float corr = expf(m[g] - new_m);         // 0 when m[g] is -inf
      const float pg = valid ? expf(sg - new_m) : 0.f;
      l[g] = l[g] * corr + WarpSum(pg);
      m[g] = new_m;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        acc[g][i].x *= corr, acc[g][i].y *= corr, acc[g][i].z *= corr, acc[g][i].w *= corr;
      }
      __syncwarp();
      p_s[warp][lane][g] = pg;
    }
    __syncwarp();
    // V: kVRows rows loaded, then accumulated.
    constexpr int kVRows = 4;
    for (int kb = 0; kb < nk; kb += kVRows) {
      float4 v[kVRows][kChunks];
#pragma unroll
      for (int u = 0; u < kVRows; ++u) {
        if (kb + u < nk) {
          const T* vr = vc + slot_s[warp][kb + u] * row;
#pragma unroll
          for (int i = 0; i < kChunks; ++i) {
            const int ci = lane + 32 * i;
            v[u][i] = ci < chunks ? Kv::Load4(vr + 4 * ci) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kVRows; ++u) {
        if (kb + u >= nk) break;
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= ng) continue;
          const float pk = p_s[warp][kb + u][g];
#pragma unroll
          for (int i = 0; i < kChunks; ++i) {
            acc[g][i].x += pk * v[u][i].x, acc[g][i].y += pk * v[u][i].y;
            acc[g][i].z += pk * v[u][i].z, acc[g][i].w += pk * v[u][i].w;
          }
        }
      }
    }
    __syncwarp();
  }
  // Merge the warps' states, then write this split's partials.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) continue;
    if (lane == 0) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int ci = lane + 32 * i;
      if (ci < chunks) reinterpret_cast<float4*>(acc_s[warp][g])[ci] = acc[g][i];
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < ng * hd; i += blockDim.x) {
    const int g = static_cast<int>(i / hd);
    const int64_t d = i % hd;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][g]);
    float sum = 0.f, out = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w][g] == -INFINITY) continue;  // a warp without keys in this split
      const float f = expf(m_s[w][g] - mx);
      sum += l_s[w][g] * f;
      out += acc_s[w][g][d] * f;
    }
    const int64_t idx = (t * a.num_heads + h0 + g) * part.max_splits + split;
    part.acc[idx * hd + d] = out;
    if (d == 0) {
      part.m[idx] = mx;
      part.l[idx] = sum;
    }
  }
}

// One CTA per (token, head): combines the token's splits into out.
__global__ void AttnMergeKernel(DeviceAttentionArgs a, Partials part) {
  const int64_t t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads;
  const int64_t hd = a.layout.head_dim;
  const int64_t splits = (int64_t(a.d_positions[t]) + kAttentionSplit) / kAttentionSplit;
  const int64_t base = (t * a.num_heads + h) * part.max_splits;
  float mx = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part.m[base + s]);
  float sum = 0.f;
  for (int64_t s = 0; s < splits; ++s) sum += part.l[base + s] * expf(part.m[base + s] - mx);
  const float inv = 1.f / sum;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int64_t s = 0; s < splits; ++s) {
      o += part.acc[(base + s) * hd + d] * expf(part.m[base + s] - mx);
    }
    a.d_out[(t * a.num_heads + h) * hd + d] = o * inv;
  }
}

int64_t MaxSplits(int64_t max_position) { return max_position / kAttentionSplit + 1; }

}  // namespace

int64_t PagedAttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                      int64_t max_position) {
  return num_tokens * num_heads * MaxSplits(max_position) * (head_dim + 2);
}

absl::Status PagedAttention(const DeviceAttentionArgs& a, Stream stream) {
  if (a.num_tokens == 0) return absl::OkStatus();
  const int64_t hd = a.layout.head_dim;
  if (hd % 4 != 0 || hd > kMaxHeadDim || hd <= 0 || a.layout.block_size <= 0 ||
      a.layout.num_kv_heads <= 0 || a.num_heads % a.layout.num_kv_heads != 0) {
    return absl::InvalidArgumentError("cuda PagedAttention: unsupported geometry");
  }
  if (a.workspace_floats <
      PagedAttentionWorkspaceFloats(a.num_tokens, a.num_heads, hd, a.max_position)) {
    return absl::InvalidArgumentError("cuda PagedAttention: workspace too small");
  }
  if (a.num_tokens > 65535)
    return absl::InvalidArgumentError("cuda PagedAttention: too many tokens");
  const int64_t splits = MaxSplits(a.max_position);
  const int64_t n = a.num_tokens * a.num_heads * splits;
  Partials part{a.d_workspace, a.d_workspace + n, a.d_workspace + 2 * n, splits};
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  const int64_t head_groups = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(static_cast<unsigned>(a.layout.num_kv_heads * head_groups),
                  static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(splits));
  const cudaStream_t s = AsStream(stream);
  absl::Status st = DispatchKvDtype(a.kv_dtype, "cuda PagedAttention", [&](auto kv) {
    using Kv = decltype(kv);
    if (hd <= 128) {
      AttnSplitKernel<Kv, 1><<<grid, kWarps * 32, 0, s>>>(a, head_groups, part);
    } else {
      AttnSplitKernel<Kv, 2><<<grid, kWarps * 32, 0, s>>>(a, head_groups, part);
    }
    return LaunchStatus("PagedAttention split");
  });
  if (!st.ok()) return st;
  AttnMergeKernel<<<static_cast<unsigned>(a.num_tokens * a.num_heads), 128, 0, s>>>(a, part);
  return LaunchStatus("PagedAttention merge");
}

}  // namespace tandem::kernels::cuda
