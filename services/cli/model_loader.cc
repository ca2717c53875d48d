#include "services/cli/model_loader.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/tokenizer/vocab.h"

namespace tandem::cli {
namespace {

bool IsRegularFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// Draws "loading model [#####     ]  50%" on stderr, only when it is a terminal
// or on each 25% step otherwise (so logs stay short).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(isatty(fileno(stderr))) {}
  void Update(uint64_t done, uint64_t total) {
    if (!enabled_ || total == 0) return;
    const int percent = static_cast<int>(done * 100 / total);
    if (percent == last_) return;
    if (!tty_ && percent % 25 != 0 && percent != 100) return;
    last_ = percent;
    const int filled = percent / 5;
    std::fprintf(stderr, "%sloading model [%.*s%*s] %3d%%%s", tty_ ? "\r" : "", filled,
                 "####################", 20 - filled, "", percent, tty_ ? "" : "\n");
    if (tty_ && percent == 100) std::fputc('\n', stderr);
  }

 private:
  bool enabled_;
  bool tty_;
  int last_ = -1;
};

}  // namespace

absl::StatusOr<std::string> ResolveModelPath(const std::string& flag) {
  std::string path = flag;
  std::string source = "--model";
  if (path.empty()) {
    const char* env = std::getenv("TANDEM_MODEL");
    if (env != nullptr && *env != '\0') {
      path = env;
      source = "$TANDEM_MODEL";
    }
  }
  if (path.empty()) {
    for (const std::string& candidate :
         {std::string(TANDEM_DEFAULT_MODEL), std::string("models/") + kDefaultModelName}) {
      if (IsRegularFile(candidate)) return candidate;
    }
    return absl::NotFoundError(absl::StrFormat(
        "default model %s not found (run scripts/fetch_model.sh, or pass --model PATH)",
        kDefaultModelName));
  }
  if (!IsRegularFile(path)) {
    return absl::NotFoundError(absl::StrFormat("%s: no model file at '%s'", source, path));
  }
  return path;
}

absl::StatusOr<LoadedModel> LoadTokenizer(const std::string& path) {
  LoadedModel out;
  out.path = path;
  auto file = gguf::GgufFile::Open(out.path);
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot load model: %s", file.status().message()));
  }
  out.file = std::move(file).value();
  auto vocab = tokenizer::VocabFromGguf(*out.file);
  if (!vocab.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot load tokenizer of '%s': %s", out.path, vocab.status().message()));
  }
  auto tok = tokenizer::Tokenizer::Create(std::move(vocab).value());
  if (!tok.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot load tokenizer of '%s': %s", out.path, tok.status().message()));
  }
  out.tokenizer = std::move(tok).value();
  return out;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& model_flag, ThreadPool* pool, bool verbose,
                                      std::optional<engine::KernelMode> kernels) {
  TANDEM_ASSIGN_OR_RETURN(std::string path, ResolveModelPath(model_flag));
  const auto start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(LoadedModel out, LoadTokenizer(path));
  ProgressBar bar(verbose);
  engine::LoadOptions options;
  options.pool = pool;
  options.kernels = kernels.value_or(engine::DefaultKernelMode(*out.file));
  options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  auto model = engine::LlamaModel::Load(*out.file, options);
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot load model '%s': %s", out.path, model.status().message()));
  }
  out.model = std::move(model).value();
  if (verbose) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string summary = out.model->Summary();
    if (!summary.empty() && summary.back() != '\n') summary.push_back('\n');
    std::fprintf(stderr, "%s[model] %s loaded in %.2f s, %d threads\n", summary.c_str(),
                 out.path.c_str(), secs, pool != nullptr ? pool->num_threads() : 1);
  }
  return out;
}

}  // namespace tandem::cli
