// Finds, opens and loads a model for the CLI subcommands: the GGUF file, its
// tokenizer and the Llama-family model, with progress and a summary on stderr.
#ifndef TANDEM_SERVICES_CLI_MODEL_LOADER_H_
#define TANDEM_SERVICES_CLI_MODEL_LOADER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "common/thread_pool.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/llama_model.h"

namespace tandem::cli {

inline constexpr char kDefaultModelName[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The model path to use: `flag` if non-empty, else $TANDEM_MODEL, else the
// bundled default (models/<kDefaultModelName> in the source tree, then in the
// current directory). NotFound with a hint when the file does not exist.
absl::StatusOr<std::string> ResolveModelPath(const std::string& flag);

struct LoadedModel {
  std::string path;
  std::unique_ptr<gguf::GgufFile> file;  // must outlive `model`
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<engine::LlamaModel> model;
};

// Opens the GGUF at `path` and builds its tokenizer only (no weights).
// The returned LoadedModel has no `model`.
absl::StatusOr<LoadedModel> LoadTokenizer(const std::string& path);

// Resolves, opens and loads. verbose: progress bar and summary on stderr.
// kernels: the CPU kernel mode (engine/llama_model.h; `tandem perplexity
// --kernels`); unset: the file's own (engine::DefaultKernelMode: kFast unless
// the file was made by `tandem quantize --method smoothquant`).
absl::StatusOr<LoadedModel> LoadModel(const std::string& model_flag, ThreadPool* pool, bool verbose,
                                      std::optional<engine::KernelMode> kernels = std::nullopt);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_MODEL_LOADER_H_
