// `tandem generate`: load a GGUF model and run one prompt (--prompt) or a
// file of them (--prompts-file) through the engine as a continuous batch,
// streaming UTF-8-safe text (single prompt) or printing per-request results in
// input order, with per-request and aggregate timings on stderr.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/json.h"
#include "common/thread_pool.h"
#include "common/tokenizer/chat_template.h"
#include "engine/engine.h"
#include "services/cli/args.h"
#include "services/cli/command_status.h"
#include "services/cli/commands.h"
#include "services/cli/device_flag.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/kv_memory_flag.h"
#include "services/cli/model_loader.h"
#include "services/cli/prompt_file.h"
#include "services/cli/run_stats.h"
#include "services/cli/spec_flags.h"

namespace tandem::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string prompts_file;
  std::string system;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  int64_t seed = 0;
  int64_t threads = 0;
  std::string device = "cpu";
  std::string kv_cache_dtype;  // empty: the device's default
  SpecFlags spec;
  int64_t concurrency = 8;
  std::string kv_cache_memory = "1GiB";
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
  bool chat = false;
  bool json = false;
  bool ignore_eos = false;
};

void AddFlags(ArgParser& p, GenerateFlags& f) {
  p.AddString("model", &f.model,
              "GGUF model path (default: $TANDEM_MODEL, else models/" +
                  std::string(kDefaultModelName) + ")");
  p.AddString("prompt", &f.prompt, "prompt text");
  p.AddString("prompts-file", &f.prompts_file,
              "file of prompts: one per line, or JSONL {\"prompt\": ..., \"max_tokens\": ...}");
  p.AddInt("concurrency", &f.concurrency, 1, 4096, "requests in flight at once (--prompts-file)");
  p.AddBool("chat", &f.chat, "wrap each prompt in the model's chat template");
  p.AddString("system", &f.system, "system message for --chat");
  p.AddInt("max-tokens", &f.max_tokens, 1, 1 << 20, "maximum tokens to generate");
  p.AddDouble("temperature", &f.temperature, 0.0, 100.0, "sampling temperature, 0 = greedy");
  p.AddInt("top-k", &f.top_k, 0, 1 << 30, "keep the k most likely tokens, 0 = off");
  p.AddDouble("top-p", &f.top_p, 1e-9, 1.0, "nucleus sampling mass, 1 = off");
  p.AddDouble("min-p", &f.min_p, 0.0, 1.0, "drop tokens below min-p x p(max), 0 = off");
  p.AddInt("seed", &f.seed, 0, INT64_MAX, "random seed (each request's default)");
  p.AddBool("ignore-eos", &f.ignore_eos,
            "keep generating past end-of-generation tokens until --max-tokens");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads, 0 = all cores");
  AddDeviceFlag(p, &f.device);
  AddKvDtypeFlag(p, &f.kv_cache_dtype);
  AddSpecFlags(p, &f.spec);
  p.AddString("kv-cache-memory", &f.kv_cache_memory,
              std::string("KV cache budget: ") + kKvCacheMemoryHelp);
  p.AddInt("max-num-seqs", &f.max_num_seqs, 1, 4096, "sequences in one batch at most");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20,
           "tokens in one step at most (chunked prefill splits longer prompts)");
  p.AddBool("json", &f.json,
            "print one JSON object per prompt, in input order: prompt_token_ids, token_ids, "
            "text, finish_reason, ttft_ms, tpot_ms");
}

// The prompt as the model sees it: raw, or rendered with the chat template.
absl::StatusOr<std::vector<int32_t>> EncodePrompt(const GenerateFlags& flags,
                                                  const std::string& prompt,
                                                  const tokenizer::Tokenizer& tok) {
  if (!flags.chat) return tok.Encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  const std::string& tmpl = tok.vocab().chat_template;
  auto format = tokenizer::DetectChatFormat(tmpl);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--chat: the model's chat template is not supported (%s)", format.status().message()));
  }
  std::vector<tokenizer::ChatMessage> messages;
  if (!flags.system.empty()) messages.push_back({"system", flags.system});
  messages.push_back({"user", prompt});
  const std::string text = tokenizer::RenderChat(*format, messages, /*add_generation_prompt=*/true,
                                                 tokenizer::ExtractDefaultSystem(tmpl));
  // The rendered text carries the template's own BOS text.
  return tok.Encode(text, /*add_special=*/false, /*parse_special=*/true);
}

// Events of all requests, funnelled from the engine thread's callbacks.
class EventQueue {
 public:
  void Push(size_t index, engine::EngineEvent event) {
    absl::MutexLock lock(&mu_);
    events_.emplace_back(index, std::move(event));
  }
  std::pair<size_t, engine::EngineEvent> Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::deque<std::pair<size_t, engine::EngineEvent>>* q) { return !q->empty(); },
        &events_));
    auto front = std::move(events_.front());
    events_.pop_front();
    return front;
  }

 private:
  absl::Mutex mu_;
  std::deque<std::pair<size_t, engine::EngineEvent>> events_ ABSL_GUARDED_BY(mu_);
};

std::string JsonLine(const RequestResult& r) {
  const json::OrderedJson line = {
      {"prompt_token_ids", r.prompt_ids}, {"token_ids", r.token_ids}, {"text", r.text},
      {"finish_reason", r.finish_reason}, {"ttft_ms", r.ttft_ms},     {"tpot_ms", r.tpot_ms}};
  return json::Dump(line) + "\n";
}

// The flags checked and resolved, the prompts read.
struct GenerateSetup {
  bool from_file = false;
  std::vector<PromptSpec> specs;
  engine::EngineConfig config;
};

// A finished prompt, in input order: a JSON line, the text under a header
// (--prompts-file) or the newline after the streamed text.
void PrintResult(const GenerateFlags& flags, const GenerateSetup& setup, size_t index,
                 const RequestResult& r) {
  if (flags.json) {
    std::fputs(JsonLine(r).c_str(), stdout);
  } else if (setup.from_file) {
    std::printf("--- prompt %zu (line %lld) ---\n%s\n", index + 1,
                static_cast<long long>(setup.specs[index].line), r.text.c_str());
  } else {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
}

absl::StatusOr<GenerateSetup> CheckFlags(const ArgParser& parser, const GenerateFlags& flags) {
  GenerateSetup setup;
  setup.from_file = parser.WasSet("prompts-file");
  if (setup.from_file == parser.WasSet("prompt")) {
    return UsageStatus("give exactly one of --prompt and --prompts-file");
  }
  if (!flags.chat && parser.WasSet("system")) return UsageStatus("--system needs --chat");
  engine::SamplingParams defaults;
  defaults.temperature = flags.temperature;
  defaults.top_k = flags.top_k;
  defaults.top_p = flags.top_p;
  defaults.min_p = flags.min_p;
  defaults.seed = static_cast<uint64_t>(flags.seed);
  defaults.stop.max_tokens = flags.max_tokens;
  defaults.stop.ignore_eos = flags.ignore_eos;
  if (absl::Status s = defaults.Validate(); !s.ok()) return UsageStatus(s);
  if (setup.from_file) {
    auto read = ReadPromptsFile(flags.prompts_file, defaults);
    if (!read.ok()) return UsageStatus(read.status());
    setup.specs = std::move(read).value();
  } else {
    setup.specs.push_back({flags.prompt, 0, defaults});
  }
  auto device = ResolveDevice(flags.device);
  if (!device.ok()) return UsageStatus(device.status());
  if (absl::Status s = ApplyKvCacheMemory(flags.kv_cache_memory, &setup.config); !s.ok()) {
    return UsageStatus(s);
  }
  auto kv_dtype = ResolveKvDtype(flags.kv_cache_dtype, *device);
  if (!kv_dtype.ok()) return UsageStatus(kv_dtype.status());
  auto spec = ResolveSpec(flags.spec);
  if (!spec.ok()) return UsageStatus(spec.status());
  engine::EngineConfig& config = setup.config;
  config.device = *device;
  config.kv_cache_dtype = *kv_dtype;
  config.spec = *spec;
  config.scheduler.max_num_seqs = flags.max_num_seqs;
  config.scheduler.max_num_batched_tokens = flags.max_num_batched_tokens;
  if (flags.spec.method == "draft") {
    auto target = ResolveModelPath(flags.model);
    if (!target.ok()) return UsageStatus(target.status());
    if (absl::Status s = CheckDraftVocab(flags.spec, *target); !s.ok()) return UsageStatus(s);
  }
  return setup;
}

// One result per prompt, with its token ids; every prompt fits the context.
absl::StatusOr<std::vector<RequestResult>> EncodeAll(const GenerateFlags& flags,
                                                     const GenerateSetup& setup,
                                                     const tokenizer::Tokenizer& tok,
                                                     int64_t context) {
  std::vector<RequestResult> results(setup.specs.size());
  for (size_t i = 0; i < setup.specs.size(); ++i) {
    const PromptSpec& spec = setup.specs[i];
    const std::string where =
        setup.from_file ? absl::StrFormat("%s:%d: ", flags.prompts_file, spec.line) : "";
    auto ids = EncodePrompt(flags, spec.text, tok);
    if (!ids.ok()) return UsageStatus(where + std::string(ids.status().message()));
    if (ids->empty()) return UsageStatus(where + "the prompt encodes to zero tokens");
    const int64_t max_tokens = spec.params.stop.max_tokens.value_or(flags.max_tokens);
    if (static_cast<int64_t>(ids->size()) + max_tokens > context) {
      return UsageStatus(absl::StrFormat(
          "%sprompt (%d tokens) + --max-tokens %d exceeds the model's context length %d", where,
          ids->size(), max_tokens, context));
    }
    results[i].prompt_ids = std::move(ids).value();
  }
  return results;
}

// Runs every prompt through `eng`, --concurrency at a time: streams the text
// of a single prompt as it comes, prints finished prompts in input order.
absl::Status RunAll(const GenerateFlags& flags, const GenerateSetup& setup, engine::Engine& eng,
                    std::vector<RequestResult>& results) {
  EventQueue queue;
  const std::vector<PromptSpec>& specs = setup.specs;
  const bool stream_text = !setup.from_file && !flags.json;
  const size_t concurrency = setup.from_file ? static_cast<size_t>(flags.concurrency) : 1;
  size_t next_submit = 0, in_flight = 0, done = 0, next_print = 0;
  while (done < specs.size()) {
    while (in_flight < concurrency && next_submit < specs.size()) {
      const size_t i = next_submit++;
      engine::EngineRequest req;
      req.request_id = absl::StrCat("prompt-", i);
      req.prompt_token_ids = results[i].prompt_ids;
      req.params = specs[i].params;
      req.on_event = [&queue, i](const engine::EngineEvent& e) { queue.Push(i, e); };
      auto handle = eng.Submit(std::move(req));
      if (!handle.ok()) return absl::InternalError(handle.status().message());
      ++in_flight;
    }
    auto [i, event] = queue.Pop();
    RequestResult& r = results[i];
    if (auto* token = std::get_if<engine::TokenEvent>(&event)) {
      r.token_ids.push_back(token->token_id);
      r.text += token->text;
      if (stream_text && !token->text.empty()) {
        std::fwrite(token->text.data(), 1, token->text.size(), stdout);
        std::fflush(stdout);
      }
      continue;
    }
    const auto& finish = std::get<engine::FinishEvent>(event);
    if (finish.reason == engine::FinishReason::kError) {
      return absl::InternalError(
          absl::StrFormat("request %d failed: %s", i, finish.status.message()));
    }
    r.Finish(finish, std::string(engine::FinishReasonName(finish.reason)));
    if (stream_text) std::fwrite(finish.text.data(), 1, finish.text.size(), stdout);
    --in_flight;
    ++done;
    for (; next_print < specs.size() && results[next_print].done; ++next_print) {
      PrintResult(flags, setup, next_print, results[next_print]);
    }
  }
  return absl::OkStatus();
}

absl::Status Generate(const ArgParser& parser, const GenerateFlags& flags) {
  absl::StatusOr<GenerateSetup> setup = CheckFlags(parser, flags);
  if (!setup.ok()) return setup.status();
  const int threads = flags.threads > 0
                          ? static_cast<int>(flags.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  auto loaded = LoadModel(flags.model, &pool, /*verbose=*/true);
  if (!loaded.ok()) return UsageStatus(loaded.status());
  const tokenizer::Tokenizer& tok = *loaded->tokenizer;
  auto results = EncodeAll(flags, *setup, tok, loaded->model->config().context_length);
  if (!results.ok()) return results.status();
  auto eng = engine::Engine::Create(setup->config, loaded->model.get(), &tok);
  if (!eng.ok()) return UsageStatus(eng.status());
  std::fprintf(stderr, "[engine] %s\n[engine] %s\n", (*eng)->kv_cache_description().c_str(),
               (*eng)->executor_description().c_str());
  if (!(*eng)->draft_description().empty()) {
    std::fprintf(stderr, "[engine] %s\n", (*eng)->draft_description().c_str());
  }
  const absl::Time start = absl::Now();
  if (absl::Status s = RunAll(flags, *setup, **eng, *results); !s.ok()) return s;
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  const engine::EngineStats stats = (*eng)->Stats();
  (*eng)->Shutdown();
  PrintRunStats(*results, wall_s, stats, /*per_request=*/setup->from_file, stderr);
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  GenerateFlags flags;
  ArgParser parser("generate",
                   "Generates text from a prompt (or a file of prompts, as a continuous batch) "
                   "with a local GGUF model; greedy when --temperature is 0.");
  AddFlags(parser, flags);
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) {
    return ExitFor("generate", UsageStatus(s));
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  if (absl::Status s = Generate(parser, flags); !s.ok()) return ExitFor("generate", s);
  return kExitOk;
}

}  // namespace tandem::cli
