// The CUDA paged attention against kernels::ref::PagedAttention: decode and
// (chunked) prefill tokens over random block tables, block sizes 16 / 32 /
// 48, context lengths that are not multiples of the block size or of the
// split size, GQA ratios 1 / 3 / 4 / 12, head_dim 64 and 128, KV caches of
// f32, f16 and bf16 (the reference reads the same stored values through a
// KvCacheView). Skips without a device.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomFloats;

struct Seq {
  int64_t context;  // tokens in the cache after the step
  int64_t queries;  // the last `queries` positions are this step's tokens
};

struct Geometry {
  int64_t block_size, num_kv_heads, group, head_dim;
};

// The f32 rows as `dtype` bytes, head by head as kernels::WriteKv stores them.
std::vector<char> Store(const std::vector<float>& rows, KvDtype dtype, int64_t hd) {
  std::vector<char> out(rows.size() * KvElementBytes(dtype));
  for (size_t h = 0; h * hd < rows.size(); ++h) {
    QuantizeKvHead(dtype, rows.data() + h * hd, hd, out.data() + h * hd * KvElementBytes(dtype));
  }
  return out;
}

void CheckAttention(const Geometry& g, const std::vector<Seq>& seqs, uint32_t seed,
                    KvDtype dtype = KvDtype::kF32) {
  const int64_t bs = g.block_size, hd = g.head_dim, H = g.num_kv_heads * g.group;
  int64_t max_blocks = 1, num_blocks = 0, T = 0;
  for (const Seq& s : seqs) {
    max_blocks = std::max(max_blocks, (s.context + bs - 1) / bs);
    num_blocks += (s.context + bs - 1) / bs;
    T += s.queries;
  }
  num_blocks += 3;  // unused blocks too
  const PagedKvLayout layout{num_blocks, bs, g.num_kv_heads, hd};
  // Random, disjoint block tables.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> tables(seqs.size() * max_blocks, 0), query_start = {0}, positions, token_seq,
                                                            context_lens;
  int64_t next = 0, max_pos = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t b = 0; b < (seqs[s].context + bs - 1) / bs; ++b)
      tables[s * max_blocks + b] = perm[next++];
    for (int64_t p = seqs[s].context - seqs[s].queries; p < seqs[s].context; ++p) {
      positions.push_back(static_cast<int32_t>(p));
      token_seq.push_back(static_cast<int32_t>(s));
      max_pos = std::max(max_pos, p);
    }
    query_start.push_back(static_cast<int32_t>(positions.size()));
    context_lens.push_back(static_cast<int32_t>(seqs[s].context));
  }
  const int64_t cache_floats = num_blocks * bs * g.num_kv_heads * hd;
  const auto kc = RandomFloats(cache_floats, seed + 1), vc = RandomFloats(cache_floats, seed + 2);
  // q with a row stride wider than the heads (as in the fused qkv buffer).
  const int64_t q_stride = H * hd + 2 * g.num_kv_heads * hd;
  const auto qwide = RandomFloats(T * q_stride, seed + 3);
  std::vector<float> q(T * H * hd);
  for (int64_t t = 0; t < T; ++t) std::copy_n(&qwide[t * q_stride], H * hd, &q[t * H * hd]);

  PagedAttentionArgs ra;
  ra.layout = layout;
  ra.num_heads = H;
  ra.scale = 1.f / std::sqrt(float(hd));
  ra.num_seqs = seqs.size();
  ra.query_start = query_start.data();
  ra.positions = positions.data();
  ra.context_lens = context_lens.data();
  ra.block_tables = tables.data();
  ra.max_blocks_per_seq = max_blocks;
  std::vector<char> ks = Store(kc, dtype, hd), vs = Store(vc, dtype, hd);
  KvCacheView view;
  view.dtype = dtype;
  view.k = ks.data();
  view.v = vs.data();
  std::vector<float> want(T * H * hd);
  ref::PagedAttention(ra, q.data(), view, want.data());

  DeviceBuffer dq(qwide), dk(ks), dv(vs), dpos(positions), dseq(token_seq), dtab(tables),
      dout(T * H * hd * 4);
  const int64_t ws = PagedAttentionWorkspaceFloats(T, H, hd, max_pos);
  DeviceBuffer dws(ws * 4);
  DeviceAttentionArgs a;
  a.layout = layout;
  a.num_heads = H;
  a.scale = ra.scale;
  a.num_tokens = T;
  a.d_q = dq.get();
  a.q_stride = q_stride;
  a.d_positions = dpos.get<int32_t>();
  a.d_token_seq = dseq.get<int32_t>();
  a.d_block_tables = dtab.get<int32_t>();
  a.max_blocks_per_seq = max_blocks;
  a.max_position = max_pos;
  a.d_k_cache = dk.get();
  a.d_v_cache = dv.get();
  a.kv_dtype = dtype;
  a.d_out = dout.get();
  a.d_workspace = dws.get();
  a.workspace_floats = ws;
  ASSERT_TRUE(PagedAttention(a, nullptr).ok());
  ExpectClose(dout.ToHost<float>(), want, 2e-5f, 1e-4f, "attention");
}

TEST(CudaAttentionTest, DecodeMatchesReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  // Contexts: 1 token, inside one block, not a multiple of the block size,
  // across several splits of kAttentionSplit keys.
  const std::vector<Seq> seqs = {{1, 1}, {17, 1}, {300, 1}, {257, 1}, {700, 1}};
  uint32_t seed = 1;
  for (int64_t bs : {16, 32, 48}) {
    for (int64_t group : {1, 3, 4}) {
      for (int64_t hd : {64, 128}) {
        SCOPED_TRACE(::testing::Message() << "bs " << bs << " group " << group << " hd " << hd);
        CheckAttention({bs, 2, group, hd}, seqs, seed++);
      }
    }
  }
}

TEST(CudaAttentionTest, PrefillAndChunkedPrefillMatchReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  // A fresh prompt, a chunk over a cached prefix, and a decode token together.
  const std::vector<Seq> seqs = {{33, 33}, {300, 45}, {90, 1}};
  uint32_t seed = 50;
  for (int64_t bs : {16, 32}) {
    for (int64_t group : {1, 4}) {
      for (int64_t hd : {64, 128}) {
        SCOPED_TRACE(::testing::Message() << "bs " << bs << " group " << group << " hd " << hd);
        CheckAttention({bs, 3, group, hd}, seqs, seed++);
      }
    }
  }
}

TEST(CudaAttentionTest, GroupsLargerThanOneCtaMatchReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  CheckAttention({16, 1, 12, 64}, {{40, 3}, {260, 1}}, 99);  // 12 heads per KV head: 2 CTAs
}

TEST(CudaAttentionTest, F16AndBf16CachesMatchReference) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 200;
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBf16}) {
    for (int64_t hd : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << KvDtypeName(d) << " hd " << hd);
      CheckAttention({16, 2, 4, hd}, {{1, 1}, {300, 1}, {700, 1}}, seed++, d);
      CheckAttention({32, 3, 1, hd}, {{33, 33}, {300, 45}, {90, 1}}, seed++, d);
      CheckAttention({16, 1, 12, hd}, {{40, 3}, {260, 1}}, seed++, d);
    }
  }
}

TEST(CudaAttentionTest, ScaledDtypesAreRefused) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  for (KvDtype d : {KvDtype::kInt8, KvDtype::kFp8}) {
    DeviceAttentionArgs a;
    a.layout = {4, 16, 1, 64};
    a.num_heads = 1;
    a.num_tokens = 1;
    a.kv_dtype = d;
    DeviceBuffer ws(PagedAttentionWorkspaceFloats(1, 1, 64, 0) * 4);
    a.d_workspace = ws.get();
    a.workspace_floats = PagedAttentionWorkspaceFloats(1, 1, 64, 0);
    const absl::Status st = PagedAttention(a, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << KvDtypeName(d);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
