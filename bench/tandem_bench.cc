// Offline model benchmark (llama-bench conventions): pp<N> (one N-token
// prompt in one Forward), tg<N> (N sequential single-token decodes from an
// empty context), aggregate decode tokens/s at several batch sizes (B
// sequences, one token each per Forward), each the median of --reps runs;
// plus a memory-bandwidth probe and the decode bound it implies. Prints one
// JSON object on stdout (tools/bench.sh formats it next to llama.cpp).
//
// Usage: tandem_bench [--model PATH] [--threads 2]
//                     [--kernels fast|fast-int8|fast-int8-token|reference]
//                     [--kv-cache-dtype f32|f16|bf16|int8|fp8] [--reps 5] [--pp 512]
//                     [--tg 128] [--batches 1,4,16,32,64] [--steps 32]
//                     [--verify 1,2,5 [--context 300]]  (speculative verify probe only)
// The KV cache dtype defaults to the engine's on the CPU (engine::DefaultKvDtype),
// what `tandem generate` and `tandem serve` use.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "kernels/kv_dtype.h"

#if defined(__AVX512F__)
// GCC 12's false positive inside its own AVX-512 headers (see kernels/cpu/simd.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Args {
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2, reps = 5, pp = 512, tg = 128, steps = 32;
  std::string kernels = "fast";
  std::string kv_dtype = kernels::KvDtypeName(engine::DefaultKvDtype(engine::Device::kCpu));
  std::vector<int> batches = {1, 4, 16, 32, 64};
  std::vector<int> verify;  // --verify 1,2,5: chunk sizes of the verify probe
  int context = 300;        // --context: tokens before a verify chunk
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      a->model = v;
    } else if (k == "--kernels") {
      a->kernels = v;
    } else if (k == "--kv-cache-dtype") {
      a->kv_dtype = v;
    } else if (k == "--threads" || k == "--reps" || k == "--pp" || k == "--tg" || k == "--steps" ||
               k == "--context") {
      int x;
      if (!absl::SimpleAtoi(v, &x) || x < 1) return false;
      (k == "--threads" ? a->threads
       : k == "--reps"  ? a->reps
       : k == "--pp"    ? a->pp
       : k == "--tg"    ? a->tg
       : k == "--steps" ? a->steps
                        : a->context) = x;
    } else if (k == "--batches" || k == "--verify") {
      std::vector<int>& list = k == "--batches" ? a->batches : a->verify;
      list.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int x;
        if (!absl::SimpleAtoi(s, &x) || x < 1) return false;
        list.push_back(x);
      }
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

// Streams a 256 MiB buffer with the pool (each thread its own range), the
// best of `reps` passes after a warm-up: GB/s of DRAM reads.
double BandwidthProbe(ThreadPool* pool, int reps) {
  const int64_t n = (int64_t(256) << 20) / 8;
  std::vector<uint64_t> buf(n, 1);
  std::vector<double> gbs;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<uint64_t> sums(64, 0);
    const auto t0 = Clock::now();
    pool->ParallelFor(
        64,
        [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) {
            const uint64_t* p = buf.data() + n / 64 * c;
            const int64_t len = n / 64;
#if defined(__AVX512F__)
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i + 32 <= len; i += 32) {
              a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
              a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
              a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
              a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
            }
            sums[c] = _mm512_reduce_add_epi64(
                _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#else
            uint64_t s = 0;
            for (int64_t i = 0; i < len; ++i) s += p[i];
            sums[c] = s;
#endif
          }
        },
        1);
    const double s = Seconds(t0, Clock::now());
    if (r > 0) gbs.push_back(double(n) * 8 / s / 1e9);
    if (sums[0] == 42) std::printf(" ");  // keep the loads
  }
  return *std::max_element(gbs.begin(), gbs.end());
}

// B sequences of `steps` tokens each, all starting at position 0, decoded
// one token per sequence per Forward. Returns the seconds of all steps.
double DecodeRun(const engine::LlamaModel& m, engine::KvDtype dtype, int batch, int steps,
                 uint32_t seed) {
  const int64_t bs = engine::KvCacheStorage::kDefaultBlockSize;
  const int64_t blocks_per_seq = (steps + bs - 1) / bs;
  auto cache = m.MakeKvCache(batch * blocks_per_seq, bs, dtype);
  if (!cache.ok()) std::abort();
  std::mt19937 rng(seed);
  const int64_t vocab = m.config().vocab_size;
  engine::ForwardBatch b;
  for (int s = 0; s < batch; ++s) {
    std::vector<int32_t> table(blocks_per_seq);
    for (int64_t i = 0; i < blocks_per_seq; ++i) table[i] = int32_t(s * blocks_per_seq + i);
    b.block_tables.push_back(table);
  }
  std::vector<float> logits(batch * vocab);
  const auto t0 = Clock::now();
  for (int pos = 0; pos < steps; ++pos) {
    b.token_ids.clear();
    b.positions.clear();
    b.slot_mapping.clear();
    b.query_start = {0};
    b.context_lens.clear();
    b.logits_indices.clear();
    for (int s = 0; s < batch; ++s) {
      b.token_ids.push_back(int32_t(rng() % vocab));
      b.positions.push_back(pos);
      b.slot_mapping.push_back(int64_t(b.block_tables[s][pos / bs]) * bs + pos % bs);
      b.query_start.push_back(s + 1);
      b.context_lens.push_back(pos + 1);
      b.logits_indices.push_back(s);
    }
    if (!m.Forward(b, cache->get(), logits.data()).ok()) std::abort();
  }
  return Seconds(t0, Clock::now());
}

double PrefillRun(const engine::LlamaModel& m, engine::KvDtype dtype, int tokens, uint32_t seed) {
  const int64_t bs = engine::KvCacheStorage::kDefaultBlockSize;
  const int64_t blocks = (tokens + bs - 1) / bs;
  auto cache = m.MakeKvCache(blocks, bs, dtype);
  if (!cache.ok()) std::abort();
  std::mt19937 rng(seed);
  engine::ForwardBatch b;
  std::vector<int32_t> table(blocks);
  for (int64_t i = 0; i < blocks; ++i) table[i] = int32_t(i);
  for (int t = 0; t < tokens; ++t) {
    b.token_ids.push_back(int32_t(rng() % m.config().vocab_size));
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  b.query_start = {0, tokens};
  b.context_lens = {tokens};
  b.block_tables = {table};
  b.logits_indices = {tokens - 1};
  std::vector<float> logits(m.config().vocab_size);
  const auto t0 = Clock::now();
  if (!m.Forward(b, cache->get(), logits.data()).ok()) std::abort();
  return Seconds(t0, Clock::now());
}

// Bytes one decode step reads: every matrix once (packed copies on the fast
// path, the file's tensors otherwise), one embedding row, and the KV cache
// of the mean context of tg (K and V in the benchmarked dtype).
double DecodeBytesPerToken(const engine::LlamaModel& m, engine::KernelMode mode,
                           engine::KvDtype kv_dtype, int tg) {
  const engine::ModelWeights& w = m.weights();
  int64_t weight_bytes = 0;
  if (mode == engine::KernelMode::kReference || w.packed_bytes() == 0) {
    weight_bytes = w.lm_head.rows * w.lm_head.row_bytes;
    for (const auto& l : w.layers) {
      for (const auto* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        weight_bytes += v->rows * v->row_bytes;
      }
    }
  } else {
    weight_bytes = w.packed_bytes();
  }
  const engine::ModelConfig& c = m.config();
  const double kv_bytes =
      double(kernels::KvBytesPerToken(kv_dtype, c.num_layers, c.num_kv_heads, c.head_dim)) *
      (tg + 1) / 2.0;
  return double(weight_bytes) + kv_bytes;
}

// Speculative verification probe: one sequence with `context` tokens in its
// KV cache (f16, the serving default) runs `steps` Forwards of an m-token chunk (the last token
// plus m - 1 drafts) with logits for every chunk position. Returns the median milliseconds of one
// such Forward.
double VerifyRun(const engine::LlamaModel& m, int context, int chunk, int steps, uint32_t seed) {
  const int64_t bs = engine::KvCacheStorage::kDefaultBlockSize;
  const int64_t blocks = (context + chunk + bs - 1) / bs;
  auto cache = m.MakeKvCache(blocks, bs, engine::KvDtype::kF16);
  std::mt19937 rng(seed);
  const int64_t vocab = m.config().vocab_size;
  std::vector<int32_t> table(blocks);
  for (int64_t i = 0; i < blocks; ++i) table[i] = int32_t(i);
  engine::ForwardBatch b;
  b.block_tables = {table};
  b.query_start = {0, context};
  b.context_lens = {context};
  for (int t = 0; t < context; ++t) {
    b.token_ids.push_back(int32_t(rng() % vocab));
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  b.logits_indices = {context - 1};
  std::vector<float> logits(chunk * vocab);
  if (!m.Forward(b, cache->get(), logits.data()).ok()) std::abort();
  b.token_ids.clear();
  b.positions.clear();
  b.slot_mapping.clear();
  b.logits_indices.clear();
  for (int t = 0; t < chunk; ++t) {
    b.token_ids.push_back(int32_t(rng() % vocab));
    b.positions.push_back(context + t);
    b.slot_mapping.push_back(context + t);
    b.logits_indices.push_back(t);
  }
  b.query_start = {0, chunk};
  b.context_lens = {context + chunk};
  std::vector<double> ms;
  for (int i = 0; i < steps + 2; ++i) {
    const auto t0 = Clock::now();
    if (!m.Forward(b, cache->get(), logits.data()).ok()) std::abort();
    if (i >= 2) ms.push_back(1e3 * Seconds(t0, Clock::now()));
  }
  return Median(ms);
}

// --verify: one JSON line of VerifyRun's milliseconds per chunk size.
void PrintVerify(const engine::LlamaModel& m, const Args& a) {
  std::string json;
  for (int chunk : a.verify) {
    const double ms = VerifyRun(m, a.context, chunk, a.steps * 4, 7);
    json += (json.empty() ? "" : ", ") + std::string("\"") + std::to_string(chunk) +
            "\": " + std::to_string(ms);
  }
  std::printf("{\"isa\": \"%s\", \"context\": %d, \"verify_ms\": {%s}}\n",
              kernels::QGemmIsa().c_str(), a.context, json.c_str());
}

int Main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr, "usage: see bench/tandem_bench.cc\n");
    return 2;
  }
  engine::KernelMode mode;
  if (!engine::ParseKernelMode(a.kernels, &mode)) {
    std::fprintf(stderr, "--kernels: expected %s\n", engine::kKernelModeChoices);
    return 2;
  }
  engine::KvDtype kv_dtype;
  if (!kernels::ParseKvDtype(a.kv_dtype, &kv_dtype)) {
    std::fprintf(stderr, "--kv-cache-dtype: expected %s\n", kernels::KvDtypeChoices().c_str());
    return 2;
  }
  auto file = gguf::GgufFile::Open(a.model);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  ThreadPool pool(a.threads);
  engine::LoadOptions options{&pool, true, {}};
  options.kernels = mode;
  auto model = engine::LlamaModel::Load(**file, options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const engine::LlamaModel& m = **model;
  std::fprintf(stderr, "%s\n", m.Summary().c_str());

  if (!a.verify.empty()) {
    PrintVerify(m, a);
    return 0;
  }
  const double bw = BandwidthProbe(&pool, a.reps);
  const double bytes_per_token = DecodeBytesPerToken(m, mode, kv_dtype, a.tg);
  const double bound = bw * 1e9 / bytes_per_token;

  (void)PrefillRun(m, kv_dtype, std::min(a.pp, 64), 1);  // warm-up
  std::vector<double> pp, tg;
  for (int r = 0; r < a.reps; ++r) pp.push_back(a.pp / PrefillRun(m, kv_dtype, a.pp, 10 + r));
  for (int r = 0; r < a.reps; ++r) tg.push_back(a.tg / DecodeRun(m, kv_dtype, 1, a.tg, 20 + r));
  std::string batch_json;
  for (int batch : a.batches) {
    std::vector<double> v;
    for (int r = 0; r < a.reps; ++r) {
      v.push_back(double(batch) * a.steps / DecodeRun(m, kv_dtype, batch, a.steps, 30 + r));
    }
    batch_json += (batch_json.empty() ? "" : ", ") + std::string("\"") + std::to_string(batch) +
                  "\": " + std::to_string(Median(v));
  }
  std::printf(
      "{\"kernels\": \"%s\", \"isa\": \"%s\", \"simd_variant\": \"%s\", "
      "\"kv_cache_dtype\": \"%s\", "
      "\"threads\": %d, \"reps\": %d, "
      "\"pp\": %d, \"pp_tok_s\": %.2f, \"tg\": %d, \"tg_tok_s\": %.2f, "
      "\"batch_steps\": %d, \"decode_batch_tok_s\": {%s}, "
      "\"bandwidth_gb_s\": %.2f, \"bytes_per_token\": %.0f, \"decode_bound_tok_s\": %.1f, "
      "\"tg_fraction_of_bound\": %.3f}\n",
      a.kernels.c_str(),
      mode == engine::KernelMode::kReference ? "f32" : kernels::QGemmIsa().c_str(),
      kernels::SimdKernelsVariant().c_str(), kernels::KvDtypeName(kv_dtype), a.threads, a.reps,
      a.pp, Median(pp), a.tg, Median(tg), a.steps, batch_json.c_str(), bw, bytes_per_token, bound,
      Median(tg) / bound);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
