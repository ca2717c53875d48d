// Per-kernel microbenchmarks: QGemm (GEMV and GEMM shapes of SmolLM2-135M),
// activation quantization, the exact f32 MatMul for comparison, and paged
// attention. Counters: GB/s of weight bytes streamed and GOPS (2 ops per
// multiply-add). Threads: TANDEM_BENCH_THREADS (default 1).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/kv_dtype.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"

namespace tandem::kernels {
namespace {

using gguf::TensorType;

ThreadPool* Pool() {
  static ThreadPool* pool = [] {
    const char* env = std::getenv("TANDEM_BENCH_THREADS");
    return new ThreadPool(env != nullptr ? std::atoi(env) : 1);
  }();
  return pool;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Matrix {
  std::string bytes;
  WeightView view;
  PackedWeight packed;
};

Matrix Make(TensorType type, int64_t rows, int64_t cols) {
  Matrix m;
  const int64_t rb = int64_t(*gguf::RowBytes(type, cols));
  m.bytes.resize(rows * rb);
  const std::vector<float> row = Random(cols, 1);
  QuantizeRow(type, row.data(), m.bytes.data(), cols);  // every row the same
  for (int64_t r = 1; r < rows; ++r) std::memcpy(m.bytes.data() + r * rb, m.bytes.data(), rb);
  m.view = WeightView{type, m.bytes.data(), rows, cols, rb};
  if (IsPackable(type)) m.packed = PackedWeight::Pack(m.view, Pool());
  return m;
}

void Counters(benchmark::State& state, int64_t bytes, int64_t macs) {
  state.counters["GB/s"] =
      benchmark::Counter(double(bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GOPS"] =
      benchmark::Counter(2.0 * double(macs) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// args: type, rows, cols, tokens, activation levels
void BM_QGemm(benchmark::State& state) {
  const TensorType type = TensorType(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n = state.range(3);
  const Matrix m = Make(type, rows, cols);
  const std::vector<float> x = Random(n * cols, 2);
  QuantizedActs acts;
  QuantizeActs(x.data(), n, cols, &acts, int(state.range(4)));
  std::vector<float> y(n * rows);
  for (auto _ : state) {
    QGemm(m.packed, acts, y.data(), rows, false, Pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(QGemmIsa());
  Counters(state, m.packed.bytes(), rows * cols * n);
}

void BM_MatMulF32Path(benchmark::State& state) {
  const TensorType type = TensorType(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n = state.range(3);
  const Matrix m = Make(type, rows, cols);
  const std::vector<float> x = Random(n * cols, 2);
  std::vector<float> y(n * rows);
  for (auto _ : state) {
    MatMul(m.view, x.data(), n, y.data(), Pool());
    benchmark::DoNotOptimize(y.data());
  }
  Counters(state, rows * m.view.row_bytes, rows * cols * n);
}

void BM_QuantizeActs(benchmark::State& state) {
  const int64_t cols = state.range(0), n = state.range(1);
  const std::vector<float> x = Random(n * cols, 3);
  QuantizedActs acts;
  for (auto _ : state) {
    QuantizeActs(x.data(), n, cols, &acts, int(state.range(2)));
    benchmark::DoNotOptimize(acts.qs.data());
  }
  Counters(state, n * cols * 4, 0);
}

// SmolLM2's attention shape (9 query / 3 KV heads of 64, blocks of 16), or
// with dim 128 Llama 3 8B's (32 query / 8 KV heads of 128): the last `n`
// tokens of one `ctx`-token sequence in one step, each attending to its own
// prefix; the block table in order or scrambled. Not copyable: args points
// into it.
struct OneSequence {
  static constexpr int64_t kBlock = 16;
  OneSequence(int64_t n, int64_t ctx, bool scrambled, int64_t head_dim = 64)
      : kv_heads(head_dim == 64 ? 3 : 8),
        heads(head_dim == 64 ? 9 : 32),
        dim(head_dim),
        blocks((ctx + kBlock - 1) / kBlock),
        table(blocks),
        pos(n),
        len(int32_t(ctx)) {
    for (int64_t i = 0; i < blocks; ++i) table[i] = int32_t(scrambled ? blocks - 1 - i : i);
    for (int64_t i = 0; i < n; ++i) pos[i] = int32_t(ctx - n + i);
    qs[1] = int32_t(n);
    args.layout = {blocks, kBlock, kv_heads, dim};
    args.num_heads = heads;
    args.scale = 0.125f;
    args.num_seqs = 1;
    args.query_start = qs;
    args.positions = pos.data();
    args.context_lens = &len;
    args.block_tables = table.data();
    args.max_blocks_per_seq = blocks;
  }
  OneSequence(const OneSequence&) = delete;
  OneSequence& operator=(const OneSequence&) = delete;
  int64_t slots() const { return blocks * kBlock; }

  const int64_t kv_heads, heads, dim;
  int64_t blocks;
  std::vector<int32_t> table, pos;
  int32_t qs[2] = {0, 0};
  int32_t len;
  PagedAttentionArgs args;
};

void BM_PagedAttention(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  const OneSequence s(1, ctx, /*scrambled=*/false);
  const int64_t width = s.kv_heads * s.dim;
  const std::vector<float> k = Random(s.slots() * width, 4), v = Random(k.size(), 5);
  const std::vector<float> q = Random(s.heads * s.dim, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    PagedAttention(s.args, q.data(), k.data(), v.data(), out.data(), Pool());
    benchmark::DoNotOptimize(out.data());
  }
  Counters(state, 2 * ctx * width * 4, 2 * ctx * int64_t(q.size()));
}

// A KV cache of `dtype` over every slot of `layout`, written from random
// K / V (seeds 4 and 5) by WriteKv, as the engine stores it.
struct FilledCache {
  FilledCache(const PagedKvLayout& layout, KvDtype dtype) : dtype(dtype) {
    const int64_t slots = layout.num_blocks * layout.block_size;
    const int64_t width = layout.num_kv_heads * layout.head_dim;
    const std::vector<float> kf = Random(slots * width, 4), vf = Random(kf.size(), 5);
    k.resize(kf.size() * KvElementBytes(dtype));
    v.resize(k.size());
    ks.resize(slots * layout.num_kv_heads);
    vs.resize(ks.size());
    std::vector<int64_t> all(slots);
    for (int64_t i = 0; i < slots; ++i) all[i] = i;
    WriteKv(layout, kf.data(), vf.data(), all.data(), slots, View());
  }
  KvCacheView View() { return {dtype, k.data(), v.data(), ks.data(), vs.data()}; }
  KvDtype dtype;
  std::vector<char> k, v;
  std::vector<KvScale> ks, vs;
};

// A decode step of `seqs` sequences (SmolLM2's heads), one query each at
// context ctx, each in its own blocks (sequence s owns blocks [s * b,
// (s + 1) * b)): the attention of a batched decode step.
struct DecodeBatch {
  static constexpr int64_t kBlock = 16;
  DecodeBatch(int64_t seqs, int64_t ctx)
      : per_seq((ctx + kBlock - 1) / kBlock),
        table(seqs * per_seq),
        pos(seqs, int32_t(ctx - 1)),
        lens(seqs, int32_t(ctx)),
        qs(seqs + 1) {
    for (int64_t i = 0; i < seqs * per_seq; ++i) table[i] = int32_t(i);
    for (int64_t s = 0; s <= seqs; ++s) qs[s] = int32_t(s);
    args.layout = {seqs * per_seq, kBlock, kKvHeads, kDim};
    args.num_heads = kHeads;
    args.scale = 0.125f;
    args.num_seqs = seqs;
    args.query_start = qs.data();
    args.positions = pos.data();
    args.context_lens = lens.data();
    args.block_tables = table.data();
    args.max_blocks_per_seq = per_seq;
  }
  DecodeBatch(const DecodeBatch&) = delete;
  DecodeBatch& operator=(const DecodeBatch&) = delete;
  static constexpr int64_t kKvHeads = 3, kHeads = 9, kDim = 64;
  int64_t per_seq;
  std::vector<int32_t> table, pos, lens, qs;
  PagedAttentionArgs args;
};

void BM_PagedAttentionDecodeBatch(benchmark::State& state) {
  const int64_t seqs = state.range(0), ctx = state.range(1);
  const KvDtype dtype = KvDtype(state.range(2));
  const DecodeBatch b(seqs, ctx);
  const int64_t width = DecodeBatch::kKvHeads * DecodeBatch::kDim;
  FilledCache filled(b.args.layout, dtype);
  const KvCacheView cache = filled.View();
  const std::vector<float> q = Random(seqs * DecodeBatch::kHeads * DecodeBatch::kDim, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    PagedAttention(b.args, q.data(), cache, out.data(), Pool());
    benchmark::DoNotOptimize(out.data());
  }
  Counters(state, seqs * 2 * ctx * width * KvElementBytes(dtype),
           2 * seqs * ctx * DecodeBatch::kHeads * DecodeBatch::kDim);
}

// OneSequence's n tokens at ctx over a KV cache of `dtype` (KvDtype; 1 =
// f16, the CPU engine's default), head dim `hd`: n = ctx is a pp<n>
// prefill's attention, n = 5 at ctx 300 a speculative verification, n = 1 a
// decode step.
void BM_PagedAttentionChunk(benchmark::State& state) {
  const int64_t n = state.range(0), ctx = state.range(1);
  const KvDtype dtype = KvDtype(state.range(2));
  const OneSequence s(n, ctx, /*scrambled=*/true, state.range(3));
  const int64_t width = s.kv_heads * s.dim;
  FilledCache filled(s.args.layout, dtype);
  const KvCacheView cache = filled.View();
  const std::vector<float> q = Random(n * s.heads * s.dim, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    PagedAttention(s.args, q.data(), cache, out.data(), Pool());
    benchmark::DoNotOptimize(out.data());
  }
  // (query, key) pairs: sum over the n queries of their context lengths.
  const int64_t pairs = n * (ctx - n) + n * (n + 1) / 2;
  Counters(state, 2 * ctx * width * KvElementBytes(dtype), 2 * pairs * s.heads * s.dim);
}

constexpr int64_t kQ41 = int64_t(TensorType::kQ4_1), kQ80 = int64_t(TensorType::kQ8_0),
                  kQ40 = int64_t(TensorType::kQ4_0), kQ4K = int64_t(TensorType::kQ4_K),
                  kQ6K = int64_t(TensorType::kQ6_K), kQ50 = int64_t(TensorType::kQ5_0),
                  kF16 = int64_t(TensorType::kF16), kBF16 = int64_t(TensorType::kBF16),
                  kF32 = int64_t(TensorType::kF32);

BENCHMARK(BM_QGemm)
    ->ArgNames({"type", "rows", "cols", "n", "levels"})
    ->Args({kQ41, 960, 576, 1, 2})   // Q|K|V decode
    ->Args({kQ41, 3072, 576, 1, 1})  // gate|up decode
    ->Args({kQ41, 3072, 576, 1, 2})
    ->Args({kQ41, 576, 1536, 1, 2})  // down decode
    ->Args({kQ40, 3072, 576, 1, 2})
    ->Args({kQ80, 49152, 576, 1, 2})   // LM head decode (out of cache)
    ->Args({kQ4K, 16384, 4096, 1, 2})  // a 7B-class Q4_K / Q6_K matrix (out of cache)
    ->Args({kQ6K, 16384, 4096, 1, 2})
    ->Args({kQ41, 3072, 576, 2, 2})  // speculative verification (k + 1 tokens)
    ->Args({kQ41, 3072, 576, 5, 2})
    ->Args({kQ80, 49152, 576, 5, 2})
    ->Args({kQ41, 3072, 576, 8, 2})
    ->Args({kQ41, 3072, 576, 32, 2})  // batched decode
    ->Args({kQ80, 49152, 576, 32, 2})
    ->Args({kQ50, 3072, 576, 32, 2})   // the Q4_K_M file's fallback rows
    ->Args({kQ41, 3072, 576, 512, 1})  // prefill
    ->Args({kQ41, 3072, 576, 512, 2})
    ->Args({kQ41, 576, 1536, 512, 2})
    ->Args({kQ50, 3072, 576, 512, 2})
    ->UseRealTime();
BENCHMARK(BM_MatMulF32Path)
    ->ArgNames({"type", "rows", "cols", "n"})
    ->Args({kQ41, 3072, 576, 1})
    ->Args({kQ80, 49152, 576, 1})
    ->Args({kF16, 3072, 576, 3})  // an F16 file's batched decode / verification
    ->Args({kF16, 3072, 576, 4})
    ->Args({kF16, 3072, 576, 5})
    ->Args({kF16, 49152, 576, 3})   // ... and its LM head
    ->Args({kF16, 3072, 576, 512})  // prefill of an F16 / BF16 file: gate|up, down
    ->Args({kF16, 576, 1536, 512})
    ->Args({kBF16, 3072, 576, 512})
    ->Args({kF32, 576, 576, 512})
    ->Args({kQ41, 3072, 576, 512})  // --kernels reference prefill
    ->UseRealTime();
BENCHMARK(BM_QuantizeActs)
    ->ArgNames({"cols", "n", "levels"})
    ->Args({576, 1, 1})
    ->Args({576, 1, 2})
    ->Args({576, 16, 2})  // one thread's half of a batch of 32
    ->Args({1536, 512, 1})
    ->Args({1536, 512, 2});
BENCHMARK(BM_PagedAttention)->ArgNames({"ctx"})->Arg(128)->Arg(1024)->UseRealTime();
// A batched decode step: 32 sequences at short and longer contexts, f16 /
// int8 KV (the batch-32 rows of tandem_bench decode from position 0 to 32).
BENCHMARK(BM_PagedAttentionDecodeBatch)
    ->ArgNames({"seqs", "ctx", "dtype"})
    ->Args({32, 24, int64_t(KvDtype::kF16)})
    ->Args({32, 200, int64_t(KvDtype::kF16)})
    ->Args({32, 200, int64_t(KvDtype::kInt8)})
    ->UseRealTime();
BENCHMARK(BM_PagedAttentionChunk)
    ->ArgNames({"n", "ctx", "dtype", "hd"})
    ->Args({5, 300, int64_t(KvDtype::kF16), 64})
    ->Args({1, 1000, int64_t(KvDtype::kF16), 64})  // long-context decode / verification
    ->Args({5, 3000, int64_t(KvDtype::kF16), 64})
    ->Args({512, 512, int64_t(KvDtype::kF16), 64})
    ->Args({512, 512, int64_t(KvDtype::kF32), 64})
    ->Args({512, 512, int64_t(KvDtype::kInt8), 64})
    ->Args({1, 2048, int64_t(KvDtype::kF16), 128})
    ->Args({512, 512, int64_t(KvDtype::kF16), 128})
    ->UseRealTime();

}  // namespace
}  // namespace tandem::kernels

BENCHMARK_MAIN();
