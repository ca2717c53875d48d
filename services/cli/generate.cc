// `tandem generate`: load a GGUF model, tokenize a prompt (optionally through
// the model's chat template), prefill, then decode token by token, streaming
// UTF-8-safe text.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/json.h"
#include "common/thread_pool.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "engine/llama_model.h"
#include "engine/sampler.h"
#include "engine/single_sequence_runner.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/model_loader.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string system;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  int64_t seed = 0;
  int64_t threads = 0;
  bool chat = false;
  bool json = false;
  bool ignore_eos = false;
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "tandem generate: %s\n", message.c_str());
  return kExitUsage;
}

// The prompt text as the model sees it: raw, or rendered with the chat template.
absl::StatusOr<std::string> PromptText(const GenerateFlags& flags,
                                       const tokenizer::Tokenizer& tok) {
  if (!flags.chat) return flags.prompt;
  const std::string& tmpl = tok.vocab().chat_template;
  auto format = tokenizer::DetectChatFormat(tmpl);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--chat: the model's chat template is not supported (%s)", format.status().message()));
  }
  std::vector<tokenizer::ChatMessage> messages;
  if (!flags.system.empty()) messages.push_back({"system", flags.system});
  messages.push_back({"user", flags.prompt});
  return tokenizer::RenderChat(*format, messages, /*add_generation_prompt=*/true,
                               tokenizer::ExtractDefaultSystem(tmpl));
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  GenerateFlags flags;
  ArgParser parser("generate",
                   "Generates text from a prompt with a local GGUF model (greedy when "
                   "--temperature is 0).");
  parser.AddString("model", &flags.model,
                   "GGUF model path (default: $TANDEM_MODEL, else models/" + std::string(kDefaultModelName) + ")");
  parser.AddString("prompt", &flags.prompt, "prompt text (required)");
  parser.AddBool("chat", &flags.chat, "wrap the prompt in the model's chat template");
  parser.AddString("system", &flags.system, "system message for --chat");
  parser.AddInt("max-tokens", &flags.max_tokens, 1, 1 << 20, "maximum tokens to generate");
  parser.AddDouble("temperature", &flags.temperature, 0.0, 100.0, "sampling temperature, 0 = greedy");
  parser.AddInt("top-k", &flags.top_k, 0, 1 << 30, "keep the k most likely tokens, 0 = off");
  parser.AddDouble("top-p", &flags.top_p, 1e-9, 1.0, "nucleus sampling mass, 1 = off");
  parser.AddDouble("min-p", &flags.min_p, 0.0, 1.0, "drop tokens below min-p x p(max), 0 = off");
  parser.AddInt("seed", &flags.seed, 0, INT64_MAX, "random seed");
  parser.AddInt("threads", &flags.threads, 0, 1024, "compute threads, 0 = all cores");
  parser.AddBool("ignore-eos", &flags.ignore_eos,
                 "keep generating past end-of-generation tokens until --max-tokens");
  parser.AddBool("json", &flags.json,
                 "print one JSON object: prompt_token_ids, token_ids, text, finish_reason, "
                 "ttft_ms, tpot_ms");
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) return UsageError(std::string(s.message()));
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!parser.WasSet("prompt")) return UsageError("--prompt is required");
  if (!flags.chat && parser.WasSet("system")) return UsageError("--system needs --chat");

  engine::SamplingParams sampling;
  sampling.temperature = flags.temperature;
  sampling.top_k = flags.top_k;
  sampling.top_p = flags.top_p;
  sampling.min_p = flags.min_p;
  sampling.seed = static_cast<uint64_t>(flags.seed);
  if (absl::Status s = sampling.Validate(); !s.ok()) return UsageError(std::string(s.message()));

  const int threads = flags.threads > 0 ? static_cast<int>(flags.threads)
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  auto loaded = LoadModel(flags.model, &pool, /*verbose=*/true);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  const tokenizer::Tokenizer& tok = *loaded->tokenizer;
  const engine::LlamaModel& model = *loaded->model;

  const Clock::time_point start = Clock::now();
  auto text = PromptText(flags, tok);
  if (!text.ok()) return UsageError(std::string(text.status().message()));
  // Plain prompts get BOS/EOS as the model's metadata asks; rendered chat text
  // already carries the template's own BOS text.
  const std::vector<int32_t> prompt_ids =
      tok.Encode(*text, /*add_special=*/!flags.chat, /*parse_special=*/true);
  if (prompt_ids.empty()) return UsageError("the prompt encodes to zero tokens");
  const int64_t context = model.config().context_length;
  if (static_cast<int64_t>(prompt_ids.size()) + flags.max_tokens > context) {
    return UsageError(absl::StrFormat(
        "prompt (%d tokens) + --max-tokens %d exceeds the model's context length %d",
        prompt_ids.size(), flags.max_tokens, context));
  }

  auto runner = engine::SingleSequenceRunner::Create(
      &model, static_cast<int64_t>(prompt_ids.size()) + flags.max_tokens);
  if (!runner.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(runner.status().message()).c_str());
    return kExitFailure;
  }
  engine::Sampler sampler;
  tokenizer::StreamingDetokenizer detok(tok, {.skip_special = true, .continuation = true});
  std::vector<int32_t> output_ids;
  std::string output_text;
  std::string finish_reason = "length";
  Clock::time_point first_token_time, last_token_time;

  auto logits = (*runner)->Prefill(prompt_ids);
  const Clock::time_point prefill_done = Clock::now();
  while (true) {
    if (!logits.ok()) {
      std::fprintf(stderr, "tandem generate: %s\n", std::string(logits.status().message()).c_str());
      return kExitFailure;
    }
    const int64_t position = static_cast<int64_t>(prompt_ids.size() + output_ids.size());
    const int32_t id = sampler.Sample(*logits, sampling, position);
    last_token_time = Clock::now();
    if (output_ids.empty()) first_token_time = last_token_time;
    output_ids.push_back(id);
    if (!flags.ignore_eos && tok.IsEog(id)) {
      finish_reason = "eos";
      break;
    }
    std::string piece = detok.Push(id);
    output_text += piece;
    if (!flags.json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (static_cast<int64_t>(output_ids.size()) >= flags.max_tokens) break;
    logits = (*runner)->DecodeStep(id);
  }
  std::string tail = detok.Flush();
  output_text += tail;

  const double ttft_ms = MsSince(start, first_token_time);
  const size_t n = output_ids.size();
  const double tpot_ms = n > 1 ? MsSince(first_token_time, last_token_time) / (n - 1) : 0.0;
  if (flags.json) {
    std::printf(
        "{\"prompt_token_ids\":%s,\"token_ids\":%s,\"text\":%s,\"finish_reason\":\"%s\","
        "\"ttft_ms\":%s,\"tpot_ms\":%s}\n",
        json::IntArray(prompt_ids).c_str(), json::IntArray(output_ids).c_str(),
        json::Quote(output_text).c_str(), finish_reason.c_str(), json::Number(ttft_ms).c_str(),
        json::Number(tpot_ms).c_str());
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);  // the text ends before the stats line on a shared terminal
  const double prefill_s = MsSince(start, prefill_done) / 1000.0;
  std::fprintf(stderr,
               "[generate] prompt %zu tokens, prefill %.1f tokens/s | generated %zu tokens "
               "(%s), decode %.1f tokens/s | TTFT %.1f ms, TPOT %.2f ms\n",
               prompt_ids.size(), prompt_ids.size() / prefill_s, n, finish_reason.c_str(),
               tpot_ms > 0 ? 1000.0 / tpot_ms : 0.0, ttft_ms, tpot_ms);
  return kExitOk;
}

}  // namespace tandem::cli
