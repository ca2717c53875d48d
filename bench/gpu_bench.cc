// GPU throughput of the CUDA executor next to the HBM-bandwidth bound.
//
//   gpu_bench [--model PATH] [--quick] [--no-synthetic] [--kernels]
//
// --kernels: the matrix products and paged decode attention alone (bytes
// read per second next to the copy bandwidth), instead of the models.
//
// Measures the device's copy bandwidth (float4 copy kernel), then for each
// model: prefill tok/s (one 1024-token prompt in one step) and decode tok/s
// at batch 1 / 16 / 64 (each sequence with a 256-token context), printed
// next to the bound bandwidth / (weight bytes + KV bytes read per step).
// Models: the GGUF at --model (default models/SmolLM2-135M-Instruct.Q4_1.gguf,
// skipped when missing) and a synthetic Llama-3-8B shape with random weights
// made on the device, in BF16 and in Q4_0. Exits 1 when there is no device
// or a step fails.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_synthetic.h"
#include "engine/executor.h"
#include "engine/llama_model.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem {
namespace {

using engine::ForwardBatch;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define BENCH_CHECK(expr)                                                         \
  do {                                                                            \
    const absl::Status _st = (expr);                                              \
    if (!_st.ok()) {                                                              \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #expr, _st.ToString().c_str()); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

struct Options {
  int64_t prefill_tokens = 1024;
  int64_t context = 256;
  int64_t decode_steps = 16;
  std::vector<int64_t> batches = {1, 16, 64};
};

// Sequence i owns blocks [i * per_seq, (i + 1) * per_seq).
struct Batcher {
  int64_t block_size, per_seq;
  void Add(int64_t seq, int64_t start, int64_t n, int64_t vocab, ForwardBatch* b) const {
    if (b->query_start.empty()) b->query_start.push_back(0);
    std::vector<int32_t> table(per_seq);
    for (int64_t i = 0; i < per_seq; ++i) table[i] = static_cast<int32_t>(seq * per_seq + i);
    for (int64_t p = start; p < start + n; ++p) {
      b->token_ids.push_back(static_cast<int32_t>((p * 131 + seq * 7 + 1) % vocab));
      b->positions.push_back(static_cast<int32_t>(p));
      b->slot_mapping.push_back(int64_t(table[p / block_size]) * block_size + p % block_size);
    }
    b->query_start.push_back(static_cast<int32_t>(b->token_ids.size()));
    b->context_lens.push_back(static_cast<int32_t>(start + n));
    b->block_tables.push_back(std::move(table));
    b->logits_indices.push_back(static_cast<int32_t>(b->token_ids.size() - 1));
  }
};

void Run(engine::Executor* ex, const ForwardBatch& b, int64_t vocab, std::vector<float>* logits) {
  logits->resize(b.logits_indices.size() * vocab);
  BENCH_CHECK(ex->Forward(b, logits->data()));
}

// Weight bytes one step streams: every matrix and the LM head.
void Bench(const std::string& name, engine::Executor* ex, const engine::ModelConfig& c,
           double weight_bytes, double gbs, const Options& o) {
  const int64_t bs = ex->kv_shape().layout.block_size;
  const Batcher batcher{bs, ex->kv_shape().layout.num_blocks / (o.batches.back() + 1)};
  const double kv_token_bytes = double(c.KvBytesPerToken(sizeof(float)));
  std::vector<float> logits;
  std::printf("%s\n  %s\n", name.c_str(), ex->Describe().c_str());
  // Prefill: one prompt per step, in the last sequence's blocks.
  {
    ForwardBatch b;
    batcher.Add(o.batches.back(), 0, o.prefill_tokens, c.vocab_size, &b);
    Run(ex, b, c.vocab_size, &logits);  // warm-up
    const int reps = 3;
    const double t0 = Now();
    for (int r = 0; r < reps; ++r) Run(ex, b, c.vocab_size, &logits);
    const double dt = (Now() - t0) / reps;
    const double flops = 2.0 * double(c.NumParameters()) * o.prefill_tokens;
    std::printf("  prefill %lld tokens: %.0f tok/s (%.1f ms, %.1f TFLOP/s dense)\n",
                (long long)o.prefill_tokens, o.prefill_tokens / dt, dt * 1e3, flops / dt / 1e12);
  }
  for (int64_t B : o.batches) {
    // Contexts of o.context tokens, prefilled in steps of up to 4096 tokens.
    ForwardBatch b;
    for (int64_t s = 0; s < B; ++s) {
      batcher.Add(s, 0, o.context, c.vocab_size, &b);
      if (b.num_tokens() >= 4096 || s == B - 1) {
        Run(ex, b, c.vocab_size, &logits);
        b = ForwardBatch();
      }
    }
    auto step = [&](int64_t i) {
      ForwardBatch d;
      for (int64_t s = 0; s < B; ++s) batcher.Add(s, o.context + i, 1, c.vocab_size, &d);
      Run(ex, d, c.vocab_size, &logits);
    };
    step(0);  // warm-up
    const double t0 = Now();
    for (int64_t i = 1; i <= o.decode_steps; ++i) step(i);
    const double dt = (Now() - t0) / o.decode_steps;
    const double ctx = o.context + o.decode_steps / 2.0;
    const double bytes = weight_bytes + B * ctx * kv_token_bytes;
    const double bound = gbs * 1e9 / bytes * B;
    std::printf(
        "  decode batch %3lld: %8.0f tok/s (%.2f ms/step); HBM bound %8.0f tok/s (%.0f%%)\n",
        (long long)B, B / dt, dt * 1e3, bound, 100.0 * (B / dt) / bound);
  }
}

int64_t BlocksNeeded(const Options& o, int64_t block_size) {
  const int64_t per_seq =
      (std::max(o.prefill_tokens, o.context + o.decode_steps + 1) + block_size - 1) / block_size;
  return per_seq * (o.batches.back() + 1);
}

double MatrixBytes(const engine::ModelConfig& c, gguf::TensorType t) {
  const double per_elem = double(*gguf::RowBytes(t, 32)) / 32.0;
  const double layer =
      double(c.hidden_size) * (2 * c.q_dim() + 2 * c.kv_dim()) + 3.0 * c.hidden_size * c.ffn_size;
  return per_elem * (c.num_layers * layer + double(c.vocab_size) * c.hidden_size);
}

engine::ModelConfig Llama3_8B() {
  engine::ModelConfig c;
  c.architecture = "llama";
  c.name = "synthetic Llama-3-8B shape";
  c.num_layers = 32;
  c.hidden_size = 4096;
  c.ffn_size = 14336;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.context_length = 8192;
  c.rope_dim = 128;
  c.rope_freq_base = 500000.f;
  return c;
}

namespace kc = kernels::cuda;

// Device memory freed at scope end.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(int64_t bytes) {
    auto m = kc::Malloc(std::max<int64_t>(bytes, 256));
    BENCH_CHECK(m.status());
    p = *m;
    BENCH_CHECK(kc::Memset(p, 0, std::max<int64_t>(bytes, 256), nullptr));
  }
  ~DevBuf() { kc::Free(p); }
  template <typename T = float>
  T* get() const {
    return static_cast<T*>(p);
  }
};

// Seconds per call of `f` (enqueues device work), the median of 5 timings
// of `reps` calls after a warm-up.
template <typename F>
double TimeDevice(int reps, F&& f) {
  f();
  BENCH_CHECK(kc::StreamSync(nullptr));
  std::vector<double> t;
  for (int k = 0; k < 5; ++k) {
    const double t0 = Now();
    for (int r = 0; r < reps; ++r) f();
    BENCH_CHECK(kc::StreamSync(nullptr));
    t.push_back((Now() - t0) / reps);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

// The matrix products alone: weight bytes read per second by the Gemv at one
// token (planar layout for the quantized types), then Gemv against the bf16
// tensor-core GEMM (dequantization included) per token count: where MatMul
// should switch (kGemvMaxTokens).
void MatrixBench(double gbs) {
  std::printf("matrix products (Llama-3-8B gate|up [28672 x 4096] and down [4096 x 14336])\n");
  auto blas = kc::CreateBlasHandle();
  BENCH_CHECK(blas.status());
  for (gguf::TensorType t : {gguf::TensorType::kBF16, gguf::TensorType::kQ4_0,
                             gguf::TensorType::kQ4_1, gguf::TensorType::kQ8_0}) {
    for (const auto& shape : {std::pair<int64_t, int64_t>{28672, 4096}, {4096, 14336}}) {
      const int64_t rows = shape.first, cols = shape.second;  // (lambdas capture these)
      kc::DeviceMatrix m{t, nullptr, rows, cols, int64_t(*gguf::RowBytes(t, cols))};
      DevBuf gguf_buf(rows * m.row_bytes);
      m.data = gguf_buf.p;
      BENCH_CHECK(kc::FillRandom(m, 0.02f, 7, nullptr));
      const int64_t planar_bytes = kc::PlanarBytes(m);
      DevBuf planar_buf(planar_bytes);
      if (planar_bytes > 0) {
        auto pm = kc::RepackPlanar(m, planar_buf.p, nullptr);
        BENCH_CHECK(pm.status());
        m = *pm;
      }
      const int64_t max_n = 256;
      DevBuf x(max_n * cols * 4), y(max_n * rows * 4);
      BENCH_CHECK(kc::FillConstant(x.get(), max_n * cols, 0.01f, nullptr));
      const int64_t ws_bytes = kc::MatMulWorkspaceBytes(max_n, cols);
      DevBuf ws(ws_bytes);
      const kc::GemmContext ctx{*blas, ws.p, ws_bytes};
      const double bytes = double(rows) * m.row_bytes;
      const double t1 = TimeDevice(
          20, [&] { BENCH_CHECK(kc::Gemv(m, x.get(), 1, y.get(), rows, false, nullptr)); });
      std::printf("  %-5s [%5lld x %5lld] Gemv n=1: %7.1f us, %5.0f GB/s (%.0f%% of copy)\n",
                  std::string(gguf::GetTypeTraits(t)->name).c_str(), (long long)rows,
                  (long long)cols, t1 * 1e6, bytes / t1 / 1e9, 100.0 * bytes / t1 / 1e9 / gbs);
      if (kc::GemvInt8Supports(m)) {  // the same product on int8 activations (dp4a)
        const double ti = TimeDevice(
            20, [&] { BENCH_CHECK(kc::GemvInt8(m, x.get(), 1, y.get(), rows, false, nullptr)); });
        std::printf(
            "        GemvInt8 n=1: %7.1f us, %5.0f GB/s (%.0f%% of copy), %.2fx the f32 Gemv\n",
            ti * 1e6, bytes / ti / 1e9, 100.0 * bytes / ti / 1e9 / gbs, t1 / ti);
      }
      if (cols != 4096) continue;
      std::printf("        tokens:");
      for (int64_t n : {8, 16, 32, 64, 128, 256}) std::printf(" %8lld", (long long)n);
      std::printf("\n        Gemv us:");
      for (int64_t n : {8, 16, 32, 64, 128, 256}) {
        std::printf(" %8.1f", 1e6 * TimeDevice(5, [&] {
                                BENCH_CHECK(kc::Gemv(m, x.get(), n, y.get(), rows, false, nullptr));
                              }));
      }
      if (kc::GemvInt8Supports(m)) {
        std::printf("\n       Int8 us:");
        for (int64_t n : {8, 16, 32, 64, 128, 256}) {
          std::printf(" %8.1f",
                      1e6 * TimeDevice(5, [&] {
                        BENCH_CHECK(kc::GemvInt8(m, x.get(), n, y.get(), rows, false, nullptr));
                      }));
        }
      }
      std::printf("\n        GEMM us:");
      for (int64_t n : {8, 16, 32, 64, 128, 256}) {
        std::printf(
            " %8.1f",
            1e6 * TimeDevice(5, [&] {
              BENCH_CHECK(n <= kc::kGemvMaxTokens
                              ? kc::Gemv(m, x.get(), n, y.get(), rows, false, nullptr)
                              : kc::BlasMatMul(ctx, m, x.get(), n, y.get(), rows, false, nullptr));
            }));
      }
      std::printf("\n");
    }
  }
  kc::DestroyBlasHandle(*blas);
}

// Paged decode attention alone (Llama-3-8B heads: 32 query, 8 KV, dim 128;
// f32 KV cache, 16-token blocks in shuffled order): KV bytes read per second.
void AttentionBench(double gbs) {
  std::printf("paged decode attention (32 q heads, 8 KV heads, head dim 128, f32 KV)\n");
  const int64_t heads = 32, kv_heads = 8, hd = 128, bs = 16;
  for (const auto& shape :
       {std::pair<int64_t, int64_t>{1, 4096}, {16, 4096}, {64, 4096}, {64, 1024}, {16, 16384}}) {
    const int64_t B = shape.first, ctx = shape.second;
    const int64_t per_seq = ctx / bs, blocks = B * per_seq;
    const int64_t row = kv_heads * hd;
    DevBuf k(blocks * bs * row * 4), v(blocks * bs * row * 4), q(B * heads * hd * 4),
        out(B * heads * hd * 4);
    BENCH_CHECK(kc::FillConstant(k.get(), blocks * bs * row, 0.01f, nullptr));
    BENCH_CHECK(kc::FillConstant(v.get(), blocks * bs * row, 0.02f, nullptr));
    BENCH_CHECK(kc::FillConstant(q.get(), B * heads * hd, 0.03f, nullptr));
    std::vector<int32_t> tables(blocks), pos(B, int32_t(ctx - 1)), seq(B);
    for (int64_t i = 0; i < blocks; ++i) tables[i] = int32_t((i * 7919) % blocks);  // a permutation
    for (int64_t i = 0; i < B; ++i) seq[i] = int32_t(i);
    DevBuf d_tables(blocks * 4), d_pos(B * 4), d_seq(B * 4);
    BENCH_CHECK(kc::CopyToDevice(d_tables.p, tables.data(), blocks * 4, nullptr));
    BENCH_CHECK(kc::CopyToDevice(d_pos.p, pos.data(), B * 4, nullptr));
    BENCH_CHECK(kc::CopyToDevice(d_seq.p, seq.data(), B * 4, nullptr));
    const int64_t ws_floats = kc::PagedAttentionWorkspaceFloats(B, heads, hd, ctx - 1);
    DevBuf ws(ws_floats * 4);
    kc::DeviceAttentionArgs a;
    a.layout = {blocks, bs, kv_heads, hd};
    a.num_heads = heads;
    a.scale = 1.f / std::sqrt(float(hd));
    a.num_tokens = B;
    a.d_q = q.get();
    a.q_stride = heads * hd;
    a.d_positions = d_pos.get<int32_t>();
    a.d_token_seq = d_seq.get<int32_t>();
    a.d_block_tables = d_tables.get<int32_t>();
    a.max_blocks_per_seq = per_seq;
    a.max_position = ctx - 1;
    a.d_k_cache = k.get();
    a.d_v_cache = v.get();
    a.d_out = out.get();
    a.d_workspace = ws.get();
    a.workspace_floats = ws_floats;
    const double t = TimeDevice(10, [&] { BENCH_CHECK(kc::PagedAttention(a, nullptr)); });
    const double bytes = 2.0 * B * ctx * row * 4;
    std::printf("  batch %3lld x %5lld context: %8.1f us, %5.0f GB/s KV read (%.0f%% of copy)\n",
                (long long)B, (long long)ctx, t * 1e6, bytes / t / 1e9,
                100.0 * bytes / t / 1e9 / gbs);
  }
}

int Main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  Options o;
  bool synthetic = true, kernels_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      model_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      o.prefill_tokens = 256;
      o.decode_steps = 4;
    } else if (std::strcmp(argv[i], "--no-synthetic") == 0) {
      synthetic = false;
    } else if (std::strcmp(argv[i], "--kernels") == 0) {
      kernels_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_bench [--model PATH] [--quick] [--no-synthetic] [--kernels]\n");
      return 2;
    }
  }
  BENCH_CHECK(engine::cuda::CheckDevice(0));
  std::printf("device: %s\n", kernels::cuda::DeviceDescription(0).c_str());
  auto gbs = kernels::cuda::MeasureCopyBandwidthGBs(int64_t(2) << 30, 10);
  BENCH_CHECK(gbs.status());
  std::printf("HBM copy bandwidth (read + write): %.0f GB/s\n\n", *gbs);
  if (kernels_only) {
    MatrixBench(*gbs);
    AttentionBench(*gbs);
    return 0;
  }

  engine::ExecutorOptions eo;
  eo.device = engine::Device::kCuda;
  eo.block_size = 16;
  eo.num_blocks = BlocksNeeded(o, eo.block_size);
  if (std::filesystem::exists(model_path)) {
    auto file = gguf::GgufFile::Open(model_path);
    BENCH_CHECK(file.status());
    engine::LoadOptions lo;
    lo.prefault = false;
    lo.kernels = engine::KernelMode::kReference;  // no CPU repacking
    auto model = engine::LlamaModel::Load(**file, lo);
    BENCH_CHECK(model.status());
    auto ex = engine::MakeExecutor(model->get(), eo);
    BENCH_CHECK(ex.status());
    double bytes = 0;
    const engine::ModelWeights& w = (*model)->weights();
    for (const auto& l : w.layers) {
      for (const auto* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        bytes += double(v->rows) * v->row_bytes;
      }
    }
    bytes += double(w.lm_head.rows) * w.lm_head.row_bytes;
    Bench(model_path, ex->get(), (*model)->config(), bytes, *gbs, o);
  } else {
    std::printf("%s: not found, skipped\n", model_path.c_str());
  }
  if (!synthetic) return 0;
  const engine::ModelConfig c = Llama3_8B();
  // Q4_0 twice: the f32 Gemv, then int8 activations (GemvInt8).
  struct Run {
    gguf::TensorType type;
    bool int8_acts;
    const char* label;
  };
  for (const Run& run : {Run{gguf::TensorType::kBF16, false, " (BF16)"},
                         Run{gguf::TensorType::kQ4_0, false, " (Q4_0)"},
                         Run{gguf::TensorType::kQ4_0, true, " (Q4_0, int8 acts)"}}) {
    engine::ExecutorOptions ro = eo;
    ro.int8_activations = run.int8_acts;
    auto ex = engine::cuda::MakeSyntheticCudaExecutor(c, run.type, ro, 1234);
    BENCH_CHECK(ex.status());
    Bench(std::string(c.name) + run.label, ex->get(), c, MatrixBytes(c, run.type), *gbs, o);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
