// `tandem perplexity`: perplexity of a model on a text file in llama.cpp's
// llama-perplexity convention (docs/perplexity.md): the whole file is
// tokenized with BOS, cut into chunks of --ctx-size tokens, each chunk's first
// token replaced by BOS, every chunk run through the engine's executor (the
// real paged-KV forward pass, in --batch-size steps), and only the second
// half of each chunk scored (positions n_ctx/2 .. n_ctx-2 predicting the next
// token). Prints the running PPL per chunk ("[1]12.3456,[2]...") and
// "Final estimate: PPL = X +/- err". --kl-divergence-base writes the run's
// top-K log-probs to a file; with --kl-divergence it compares this run with
// such a file instead (KLD, same top-1, delta p, both PPLs).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/forward_batch.h"
#include "services/cli/args.h"
#include "services/cli/command_status.h"
#include "services/cli/commands.h"
#include "services/cli/device_flag.h"
#include "services/cli/kld_base.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/model_loader.h"
#include "services/cli/perplexity_stats.h"
#include "services/common/compat.h"

namespace tandem::cli {
namespace {

constexpr int64_t kMaxTextBytes = int64_t{256} << 20;

struct PerplexityFlags {
  std::string model;
  std::string file;
  int64_t ctx_size = 512;
  int64_t chunks = 0;
  int64_t threads = 0;
  int64_t batch_size = 0;
  std::string kernels;  // empty: the file's default (engine::DefaultKernelMode)
  std::string device = "cpu";
  std::string kv_cache_dtype;  // empty: the device's default (f16 on cpu)
  std::string kld_base;
  bool kl_divergence = false;
  int64_t kl_top_k = 1024;
  bool json = false;
};

void AddFlags(ArgParser& p, PerplexityFlags& f) {
  p.AddString("model", &f.model,
              "GGUF model path (default: $TANDEM_MODEL, else models/" +
                  std::string(kDefaultModelName) + ")");
  p.AddString("file", &f.file, "text file to evaluate (required; at most 256 MiB)");
  p.AddInt("ctx-size", &f.ctx_size, 8, 1 << 20,
           "tokens per chunk (n_ctx); the second half of each chunk is scored");
  p.AddInt("chunks", &f.chunks, 0, 1 << 24, "evaluate at most this many chunks, 0 = all");
  p.AddInt("batch-size", &f.batch_size, 0, 1 << 20,
           "tokens per forward step within a chunk (the paged KV cache carries the rest), "
           "0 = the whole chunk; larger values are clamped to --ctx-size; memory for logits is "
           "about batch / 2 x vocab x 4 bytes");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads, 0 = all cores");
  p.AddString("kernels", &f.kernels,
              "CPU kernel mode: fast, fast-int8 (llama.cpp's int8 activation precision), "
              "fast-int8-token (int8 activations with one scale per token: SmoothQuant W8A8) or "
              "reference (exact f32); default: the file's (fast-int8-token for a `tandem "
              "quantize --method smoothquant` file), else fast");
  AddDeviceFlag(p, &f.device);
  AddKvDtypeFlag(p, &f.kv_cache_dtype);
  p.AddString("kl-divergence-base", &f.kld_base,
              "alone: write this run's top-K log-probs to FILE; with --kl-divergence: read "
              "FILE and compare this run with it");
  p.AddBool("kl-divergence", &f.kl_divergence,
            "compare with --kl-divergence-base: KLD, same top-1, delta p, both PPLs");
  p.AddInt("kl-top-k", &f.kl_top_k, 1, 1 << 24,
           "log-probs stored per token when writing a base (clamped to the vocab size; the "
           "vocab size makes the KLD exact, see docs/perplexity.md)");
  p.AddBool("json", &f.json, "print one JSON object with the results on stdout");
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat("--file: no regular file at '%s'", path));
  }
  if (st.st_size > kMaxTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--file: '%s' is %d bytes, above the 256 MiB limit", path, st.st_size));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrFormat("--file: cannot read '%s'", path));
  }
  return ss.str();
}

json::OrderedJson JsonMean(const MeanWithError& m) {
  return {{"mean", m.mean}, {"error", m.error}};
}

void PrintKldSummary(const KldSummary& s, std::FILE* out) {
  std::fprintf(out, "\n====== Perplexity statistics ======\n");
  std::fprintf(out, "Mean PPL(Q)                   : %10.6f ± %10.6f\n", s.ppl, s.ppl_error);
  std::fprintf(out, "Mean PPL(base)                : %10.6f ± %10.6f\n", s.ppl_base,
               s.ppl_base_error);
  std::fprintf(out, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100.0 * s.cor_ln_ppl);
  std::fprintf(out, "Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", s.ln_ppl_ratio.mean,
               s.ln_ppl_ratio.error);
  std::fprintf(out, "Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n",
               std::exp(s.ln_ppl_ratio.mean), std::exp(s.ln_ppl_ratio.mean) * s.ln_ppl_ratio.error);
  std::fprintf(out, "\n====== KL divergence statistics ======\n");
  std::fprintf(out, "Mean    KLD: %10.6f ± %10.6f\n", s.kld.mean, s.kld.error);
  std::fprintf(out, "Maximum KLD: %10.6f\n", s.kld_max);
  std::fprintf(out, "99.9%%   KLD: %10.6f\n", s.kld_p999);
  std::fprintf(out, "99.0%%   KLD: %10.6f\n", s.kld_p99);
  std::fprintf(out, "90.0%%   KLD: %10.6f\n", s.kld_p90);
  std::fprintf(out, "Median  KLD: %10.6f\n", s.kld_median);
  std::fprintf(out, "10.0%%   KLD: %10.6f\n", s.kld_p10);
  std::fprintf(out, " 5.0%%   KLD: %10.6f\n", s.kld_p5);
  std::fprintf(out, " 1.0%%   KLD: %10.6f\n", s.kld_p1);
  std::fprintf(out, "Minimum KLD: %10.6f\n", s.kld_min);
  std::fprintf(out, "\n====== Token probability statistics ======\n");
  std::fprintf(out, "Mean    Δp: %6.3f ± %5.3f %%\n", 100 * s.delta_p.mean, 100 * s.delta_p.error);
  std::fprintf(out, "Maximum Δp: %6.3f%%\n", 100 * s.delta_p_max);
  std::fprintf(out, "99.9%%   Δp: %6.3f%%\n", 100 * s.delta_p_p999);
  std::fprintf(out, "99.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p99);
  std::fprintf(out, "95.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p95);
  std::fprintf(out, "90.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p90);
  std::fprintf(out, "Median  Δp: %6.3f%%\n", 100 * s.delta_p_median);
  std::fprintf(out, "10.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p10);
  std::fprintf(out, " 5.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p5);
  std::fprintf(out, " 1.0%%   Δp: %6.3f%%\n", 100 * s.delta_p_p1);
  std::fprintf(out, " 0.1%%   Δp: %6.3f%%\n", 100 * s.delta_p_p001);
  std::fprintf(out, "Minimum Δp: %6.3f%%\n", 100 * s.delta_p_min);
  std::fprintf(out, "RMS Δp    : %6.3f ± %5.3f %%\n", 100 * s.rms_delta_p.mean,
               100 * s.rms_delta_p.error);
  std::fprintf(out, "Same top p: %6.3f ± %5.3f %%\n", 100 * s.same_top.mean,
               100 * s.same_top.error);
}

json::OrderedJson KldJson(const KldSummary& s, const KldBaseHeader& h) {
  return {{"base_model", h.model_name},
          {"base_top_k", h.top_k},
          {"ppl", s.ppl},
          {"ppl_error", s.ppl_error},
          {"ppl_base", s.ppl_base},
          {"ppl_base_error", s.ppl_base_error},
          {"cor_ln_ppl", s.cor_ln_ppl},
          {"ln_ppl_ratio", JsonMean(s.ln_ppl_ratio)},
          {"kld_mean", JsonMean(s.kld)},
          {"kld_max", s.kld_max},
          {"kld_p999", s.kld_p999},
          {"kld_p99", s.kld_p99},
          {"kld_p90", s.kld_p90},
          {"kld_median", s.kld_median},
          {"kld_p10", s.kld_p10},
          {"kld_p5", s.kld_p5},
          {"kld_p1", s.kld_p1},
          {"kld_min", s.kld_min},
          {"delta_p_mean", JsonMean(s.delta_p)},
          {"delta_p_max", s.delta_p_max},
          {"delta_p_p99", s.delta_p_p99},
          {"delta_p_median", s.delta_p_median},
          {"delta_p_p1", s.delta_p_p1},
          {"delta_p_min", s.delta_p_min},
          {"rms_delta_p", JsonMean(s.rms_delta_p)},
          {"same_top_p", JsonMean(s.same_top)}};
}

// The flags checked and resolved; `reader` is open in compare mode (the base
// fixes n_ctx and the chunk count unless they are given).
struct Setup {
  std::optional<engine::KernelMode> mode;  // unset: the file's default
  engine::Device device = engine::Device::kCpu;
  std::optional<kernels::KvDtype> kv_dtype;
  std::string text;
  std::unique_ptr<KldBaseReader> reader;
};

absl::StatusOr<Setup> CheckFlags(const ArgParser& parser, PerplexityFlags& flags) {
  if (!parser.WasSet("file")) return UsageStatus("--file is required");
  if (flags.kl_divergence && flags.kld_base.empty()) {
    return UsageStatus("--kl-divergence needs --kl-divergence-base FILE");
  }
  if (flags.kl_divergence && parser.WasSet("kl-top-k")) {
    return UsageStatus("--kl-top-k applies when writing a base, not with --kl-divergence");
  }
  Setup setup;
  if (!flags.kernels.empty()) {
    engine::KernelMode mode{};
    if (!engine::ParseKernelMode(flags.kernels, &mode)) {
      return UsageStatus(absl::StrCat("--kernels: expected ", engine::kKernelModeChoices, ", got '",
                                      flags.kernels, "'"));
    }
    setup.mode = mode;
  }
  auto device = ResolveDevice(flags.device);
  if (!device.ok()) return UsageStatus(device.status());
  setup.device = *device;
  auto kv_dtype = ResolveKvDtype(flags.kv_cache_dtype, *device);
  if (!kv_dtype.ok()) return UsageStatus(kv_dtype.status());
  setup.kv_dtype = *kv_dtype;
  auto text = ReadText(flags.file);
  if (!text.ok()) return UsageStatus(text.status());
  setup.text = *std::move(text);
  if (flags.kl_divergence) {
    auto r = KldBaseReader::Open(flags.kld_base);
    if (!r.ok()) return UsageStatus(r.status());
    setup.reader = std::move(r).value();
    const KldBaseHeader& h = setup.reader->header();
    if (!parser.WasSet("ctx-size")) flags.ctx_size = h.n_ctx;
    if (!parser.WasSet("chunks")) flags.chunks = h.n_chunks;
    if (flags.ctx_size != h.n_ctx) {
      return UsageStatus(absl::StrFormat("--ctx-size %d differs from the base's n_ctx %d",
                                         flags.ctx_size, h.n_ctx));
    }
    if (flags.chunks != h.n_chunks) {
      return UsageStatus(absl::StrFormat("--chunks %d differs from the base's %d chunks",
                                         flags.chunks, h.n_chunks));
    }
  }
  return setup;
}

// The tokenized text cut into chunks, in llama-perplexity's convention.
struct Chunks {
  std::vector<int32_t> tokens;
  bool add_bos = false;
  int32_t bos_id = -1;
  int64_t n_ctx = 0;
  int64_t n_chunks = 0;
  int64_t first = 0;   // first scored position of a chunk
  int64_t scored = 0;  // scored positions per chunk
  int64_t batch = 0;   // tokens per forward step
};

// Tokenizes as llama.cpp does: BOS when the model asks for it, special-token
// text treated as plain text.
absl::StatusOr<Chunks> Tokenize(const PerplexityFlags& flags, const std::string& text,
                                const tokenizer::Tokenizer& tok, const engine::ModelConfig& config,
                                bool compare) {
  Chunks c;
  c.n_ctx = flags.ctx_size;
  if (c.n_ctx > config.context_length) {
    return UsageStatus(absl::StrFormat("--ctx-size %d exceeds the model's context length %d",
                                       c.n_ctx, config.context_length));
  }
  if (tok.vocab().size() != config.vocab_size) {
    return UsageStatus(absl::StrFormat("the tokenizer has %d tokens, the model's vocab %d",
                                       tok.vocab().size(), config.vocab_size));
  }
  const auto t_tok = std::chrono::steady_clock::now();
  c.tokens = tok.Encode(text, /*add_special=*/true, /*parse_special=*/false);
  c.add_bos = tok.vocab().add_bos && tok.vocab().bos_id >= 0;
  c.bos_id = tok.vocab().bos_id;
  std::fprintf(stderr, "[perplexity] tokenized %s: %zu bytes -> %zu tokens in %.2f s\n",
               flags.file.c_str(), text.size(), c.tokens.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_tok).count());
  if (static_cast<int64_t>(c.tokens.size()) < 2 * c.n_ctx) {
    return UsageStatus(absl::StrFormat(
        "you need at least %d tokens to evaluate perplexity with a context of %d (the file has "
        "%d)",
        2 * c.n_ctx, c.n_ctx, c.tokens.size()));
  }
  const int64_t max_chunks = static_cast<int64_t>(c.tokens.size()) / c.n_ctx;
  c.n_chunks = flags.chunks > 0 ? std::min(flags.chunks, max_chunks) : max_chunks;
  if (compare && c.n_chunks != flags.chunks) {
    return UsageStatus(
        absl::StrFormat("the base has %d chunks, this text only %d", flags.chunks, max_chunks));
  }
  c.first = c.n_ctx / 2;
  c.scored = c.n_ctx - 1 - c.first;
  c.batch = flags.batch_size > 0 ? std::min(flags.batch_size, c.n_ctx) : c.n_ctx;
  return c;
}

// Compare mode: checks that the base was made from this vocabulary, text
// and chunking. Otherwise, with --kl-divergence-base, creates the writer
// (null without it).
absl::StatusOr<std::unique_ptr<KldBaseWriter>> PrepareKldBase(const PerplexityFlags& flags,
                                                              const Chunks& c,
                                                              const LoadedModel& loaded,
                                                              const KldBaseReader* reader) {
  const tokenizer::Tokenizer& tok = *loaded.tokenizer;
  const int64_t n_vocab = loaded.model->config().vocab_size;
  const uint64_t tokens_hash =
      HashTokens(absl::MakeConstSpan(c.tokens.data(), static_cast<size_t>(c.n_chunks * c.n_ctx)));
  const uint64_t vocab_fp = HashVocab(tok.vocab().tokens);
  if (reader != nullptr) {
    const KldBaseHeader& h = reader->header();
    if (h.n_vocab != n_vocab || h.vocab_fingerprint != vocab_fp) {
      return UsageStatus(absl::StrFormat(
          "%s was made with a different vocabulary (%d tokens) than this model's (%d tokens)",
          flags.kld_base, h.n_vocab, n_vocab));
    }
    if (h.scored_per_chunk != c.scored) {
      return UsageStatus(absl::StrFormat("%s scores %d tokens per chunk, this run %d",
                                         flags.kld_base, h.scored_per_chunk, c.scored));
    }
    if (h.tokens_hash != tokens_hash) {
      return UsageStatus(absl::StrFormat(
          "%s was made from a different text (the token streams differ); use the same --file",
          flags.kld_base));
    }
    std::fprintf(stderr, "[perplexity] KLD base %s: model %s, %d chunks, top-%d log-probs\n",
                 flags.kld_base.c_str(), h.model_name.c_str(), h.n_chunks, h.top_k);
    return nullptr;
  }
  if (flags.kld_base.empty()) return nullptr;
  KldBaseHeader h;
  h.model_fingerprint = services::ModelFingerprint(*loaded.file);
  h.vocab_fingerprint = vocab_fp;
  h.tokens_hash = tokens_hash;
  h.n_vocab = static_cast<uint32_t>(n_vocab);
  h.n_ctx = static_cast<uint32_t>(c.n_ctx);
  h.n_chunks = static_cast<uint32_t>(c.n_chunks);
  h.scored_per_chunk = static_cast<uint32_t>(c.scored);
  h.top_k = static_cast<uint32_t>(std::min<int64_t>(flags.kl_top_k, n_vocab));
  h.model_name = loaded.path.substr(0, kKldBaseMaxName);
  auto w = KldBaseWriter::Create(flags.kld_base, h);
  if (!w.ok()) return UsageStatus(w.status());
  return std::move(w).value();
}

// Scores every chunk through `executor` (one sequence over an identity block
// table: block i holds positions [i * block_size, (i + 1) * block_size)),
// printing the running PPL; writes or compares the base on the way.
class ChunkScorer {
 public:
  ChunkScorer(const Chunks& c, int64_t n_vocab, engine::Executor* executor, int64_t num_blocks,
              KldBaseWriter* writer, KldBaseReader* reader, bool print_running)
      : c_(c),
        n_vocab_(n_vocab),
        executor_(executor),
        writer_(writer),
        reader_(reader),
        print_running_(print_running),
        block_table_(num_blocks) {
    for (int64_t i = 0; i < num_blocks; ++i) block_table_[i] = static_cast<int32_t>(i);
    if (writer_ != nullptr) top_k_ = writer_->header().top_k;
  }

  absl::Status Run() {
    if (reader_ != nullptr && print_running_) {
      std::printf("%5s %12s %24s %16s %12s\n", "chunk", "PPL", "ln(PPL(Q)/PPL(base))",
                  "KL Divergence", "Same top p");
    }
    const auto t_start = std::chrono::steady_clock::now();
    for (int64_t chunk = 0; chunk < c_.n_chunks; ++chunk) {
      for (int64_t b0 = 0; b0 < c_.n_ctx; b0 += c_.batch) {
        if (absl::Status s = Step(chunk, b0); !s.ok()) return s;
      }
      chunk_ppl_.push_back(ppl_.Ppl());
      PrintRunning(chunk);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      std::fprintf(stderr, "[perplexity] chunk %d/%d: PPL %.4f, %.2f s/chunk, ETA %.1f s\n",
                   static_cast<int>(chunk + 1), static_cast<int>(c_.n_chunks), ppl_.Ppl(),
                   elapsed / (chunk + 1), elapsed / (chunk + 1) * (c_.n_chunks - chunk - 1));
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return absl::OkStatus();
  }

  const PplAccumulator& ppl() const { return ppl_; }
  const KldAccumulator& kld() const { return kld_; }
  const std::vector<double>& chunk_ppl() const { return chunk_ppl_; }
  double seconds() const { return seconds_; }

 private:
  // One forward step: tokens [b0, b0 + batch) of `chunk`.
  absl::Status Step(int64_t chunk, int64_t b0) {
    const int64_t start = chunk * c_.n_ctx;
    const int64_t n = std::min(c_.batch, c_.n_ctx - b0);
    engine::ForwardBatch fb;
    fb.token_ids.assign(c_.tokens.begin() + start + b0, c_.tokens.begin() + start + b0 + n);
    if (b0 == 0 && c_.add_bos) fb.token_ids[0] = c_.bos_id;
    fb.positions.resize(n);
    fb.slot_mapping.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pos = b0 + k;
      fb.positions[k] = static_cast<int32_t>(pos);
      fb.slot_mapping[k] = pos;  // identity block table
      if (pos >= c_.first && pos < c_.n_ctx - 1) {
        fb.logits_indices.push_back(static_cast<int32_t>(k));
      }
    }
    fb.query_start = {0, static_cast<int32_t>(n)};
    fb.context_lens = {static_cast<int32_t>(b0 + n)};
    fb.block_tables = {block_table_};
    step_logits_.resize(fb.logits_indices.size() * n_vocab_);
    if (absl::Status s = executor_->Forward(fb, step_logits_.data()); !s.ok()) {
      return absl::InternalError(absl::StrFormat("chunk %d: %s", chunk + 1, s.message()));
    }
    // Position pos predicts token pos + 1.
    for (size_t i = 0; i < fb.logits_indices.size(); ++i) {
      const int64_t pos = b0 + fb.logits_indices[i];
      const absl::Span<const float> row(step_logits_.data() + i * n_vocab_, n_vocab_);
      if (absl::Status s = Score(row, c_.tokens[start + pos + 1], chunk, pos); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Score(absl::Span<const float> row, int32_t target, int64_t chunk, int64_t pos) {
    const TokenScore score = ScoreToken(row, target);
    if (!std::isfinite(score.nll)) {
      return absl::InternalError(
          absl::StrFormat("chunk %d, position %d: non-finite logits", chunk + 1, pos));
    }
    ppl_.Add(score.nll);
    if (writer_ == nullptr && reader_ == nullptr) return absl::OkStatus();
    LogSoftmax(row, &logprobs_);
    if (writer_ != nullptr) {
      record_.nll = static_cast<float>(score.nll);
      record_.top = TopK(logprobs_, top_k_);
      if (absl::Status s = writer_->Append(record_); !s.ok())
        return absl::InternalError(s.message());
      return absl::OkStatus();
    }
    if (absl::Status s = reader_->Next(&record_); !s.ok()) return UsageStatus(s);
    kld_.Add(score, record_.nll, record_.top[0].id, TopKKld(record_.top, logprobs_));
    return absl::OkStatus();
  }

  void PrintRunning(int64_t chunk) {
    if (!print_running_) return;
    if (reader_ != nullptr) {
      std::printf("%5d %12.4f %12.5f ± %9.5f %16.6f %11.3f%%\n", static_cast<int>(chunk + 1),
                  ppl_.Ppl(), kld_.LnPplRatio().mean, kld_.LnPplRatio().error, kld_.MeanKld(),
                  100 * kld_.SameTopFraction());
    } else {
      std::printf("[%d]%.4f,", static_cast<int>(chunk + 1), ppl_.Ppl());
    }
    std::fflush(stdout);
  }

  const Chunks& c_;
  const int64_t n_vocab_;
  engine::Executor* const executor_;
  KldBaseWriter* const writer_;
  KldBaseReader* const reader_;
  const bool print_running_;
  std::vector<int32_t> block_table_;
  int64_t top_k_ = 0;               // when writing
  std::vector<float> step_logits_;  // [scored rows of one step, vocab]
  std::vector<double> logprobs_;
  KldBaseRecord record_;
  PplAccumulator ppl_;
  KldAccumulator kld_;
  std::vector<double> chunk_ppl_;
  double seconds_ = 0;
};

void PrintResult(const PerplexityFlags& flags, const LoadedModel& loaded, const Chunks& c,
                 kernels::KvDtype kv_dtype, const ChunkScorer& scorer,
                 const KldBaseReader* reader) {
  const PplAccumulator& ppl = scorer.ppl();
  if (flags.json) {
    json::OrderedJson out = {{"model", loaded.path},
                             {"file", flags.file},
                             {"kernels", engine::KernelModeName(loaded.model->kernel_mode())},
                             {"kv_cache_dtype", kernels::KvDtypeName(kv_dtype)},
                             {"n_ctx", c.n_ctx},
                             {"batch_size", c.batch},
                             {"n_tokens", c.tokens.size()},
                             {"n_chunks", c.n_chunks},
                             {"scored_tokens", ppl.count()},
                             {"chunk_ppl", scorer.chunk_ppl()},
                             {"ppl", ppl.Ppl()},
                             {"ppl_error", ppl.PplError()},
                             {"mean_nll", ppl.MeanNll()},
                             {"seconds", scorer.seconds()}};
    if (reader != nullptr) {
      out["kl_divergence"] = KldJson(scorer.kld().Summarize(), reader->header());
    }
    std::printf("%s\n", json::Dump(out).c_str());
    return;
  }
  if (reader != nullptr) {
    PrintKldSummary(scorer.kld().Summarize(), stdout);
  } else {
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl.Ppl(), ppl.PplError());
  }
  std::fprintf(stderr, "[perplexity] %d tokens scored in %.2f s (%.1f tokens/s evaluated)\n",
               static_cast<int>(ppl.count()), scorer.seconds(),
               static_cast<double>(c.n_chunks * c.n_ctx) / std::max(scorer.seconds(), 1e-9));
}

absl::Status Perplexity(const ArgParser& parser, PerplexityFlags& flags) {
  absl::StatusOr<Setup> setup = CheckFlags(parser, flags);
  if (!setup.ok()) return setup.status();
  const int threads = flags.threads > 0
                          ? static_cast<int>(flags.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  auto loaded = LoadModel(flags.model, &pool, /*verbose=*/true, setup->mode);
  if (!loaded.ok()) return UsageStatus(loaded.status());
  const engine::ModelConfig& config = loaded->model->config();
  absl::StatusOr<Chunks> chunks =
      Tokenize(flags, setup->text, *loaded->tokenizer, config, setup->reader != nullptr);
  if (!chunks.ok()) return chunks.status();
  auto writer = PrepareKldBase(flags, *chunks, *loaded, setup->reader.get());
  if (!writer.ok()) return writer.status();

  engine::ExecutorOptions eopts;
  eopts.device = setup->device;
  eopts.kv_dtype = setup->kv_dtype.value_or(engine::DefaultKvDtype(setup->device));
  eopts.num_blocks = (chunks->n_ctx + eopts.block_size - 1) / eopts.block_size;
  auto executor = engine::MakeExecutor(loaded->model.get(), eopts);
  if (!executor.ok()) return absl::InternalError(executor.status().message());
  std::fprintf(stderr, "[perplexity] %s\n", (*executor)->Describe().c_str());
  std::fputs(absl::StrFormat("[perplexity] %d chunks of %d tokens, %d scored per chunk, batch %d, "
                             "kernels %s, KV cache %s\n",
                             chunks->n_chunks, chunks->n_ctx, chunks->scored, chunks->batch,
                             engine::KernelModeName(loaded->model->kernel_mode()),
                             kernels::KvDtypeName(eopts.kv_dtype))
                 .c_str(),
             stderr);
  ChunkScorer scorer(*chunks, config.vocab_size, executor->get(), eopts.num_blocks, writer->get(),
                     setup->reader.get(), /*print_running=*/!flags.json);
  if (absl::Status s = scorer.Run(); !s.ok()) return s;
  if (*writer != nullptr) {
    if (absl::Status s = (*writer)->Finish(); !s.ok()) return absl::InternalError(s.message());
    std::fprintf(stderr, "[perplexity] wrote KLD base %s (%d token records)\n",
                 flags.kld_base.c_str(), static_cast<int>(scorer.ppl().count()));
  }
  PrintResult(flags, *loaded, *chunks, eopts.kv_dtype, scorer, setup->reader.get());
  return absl::OkStatus();
}

}  // namespace

int RunPerplexity(int argc, char** argv) {
  PerplexityFlags flags;
  ArgParser parser("perplexity",
                   "Perplexity of a model on a text file, as llama.cpp's llama-perplexity "
                   "computes it (chunks of --ctx-size, second half scored), and KL divergence "
                   "against a saved base run (docs/perplexity.md).");
  AddFlags(parser, flags);
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) {
    return ExitFor("perplexity", UsageStatus(s));
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  if (absl::Status s = Perplexity(parser, flags); !s.ok()) return ExitFor("perplexity", s);
  return kExitOk;
}

}  // namespace tandem::cli
