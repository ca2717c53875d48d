// `tandem quantize`: a GGUF model in, a quantized GGUF out (quant/,
// docs/quantization.md). --method rtn | awq | gptq | smoothquant; all but
// rtn run the model over the tokens of --calibration FILE first. --report prints the
// activation statistics of every linear's input on the calibration text
// (alone, or beside a quantization). Progress goes to stderr; bad input is
// one line on stderr and exit code 2.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/llama_model.h"
#include "quant/act_report.h"
#include "quant/calibration.h"
#include "quant/quantize_model.h"
#include "services/cli/args.h"
#include "services/cli/command_status.h"
#include "services/cli/commands.h"
#include "services/cli/model_loader.h"
#include "services/cli/output_file.h"

namespace tandem::cli {
namespace {

constexpr int64_t kMaxCalibrationBytes = int64_t{8} << 20;

struct QuantizeFlags {
  std::string model;
  std::string out;
  std::string type;
  std::string method = "rtn";
  std::string calibration;
  int64_t calibration_tokens = 512;
  int64_t calibration_ctx = 256;
  int64_t awq_grid = 20;
  int64_t awq_clip_grid = 10;
  double gptq_damp = 0.01;
  bool gptq_act_order = false;
  double alpha = quant::kDefaultSmoothAlpha;
  int64_t threads = 0;
  bool report = false;
  double report_threshold = 6.0;
};

void AddFlags(ArgParser& p, QuantizeFlags& f) {
  p.AddString("model", &f.model,
              "input GGUF (default: $TANDEM_MODEL, else models/" + std::string(kDefaultModelName) +
                  "); its weights, dequantized to f32, are the reference");
  p.AddString("out", &f.out, "output GGUF path (required unless --report alone)");
  p.AddString("type", &f.type,
              "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q4_k_m, q5_k, q5_k_m or q6_k (K types fall "
              "back to q5_0 / q5_1 / q8_0 on rows that are not a multiple of 256)");
  p.AddString("method", &f.method,
              "rtn, awq, gptq or smoothquant (W8A8: --type q8_0, the default for it; the file "
              "runs with --kernels fast-int8-token by default); all but rtn need --calibration");
  p.AddString("calibration", &f.calibration,
              "calibration text file (at most 8 MiB): awq / gptq / --report run the model on it");
  p.AddInt("calibration-tokens", &f.calibration_tokens, 1, 1 << 16,
           "calibration tokens used (the text's first ones)");
  p.AddInt("calibration-ctx", &f.calibration_ctx, 8, 1 << 16, "tokens per calibration sequence");
  p.AddInt("awq-grid", &f.awq_grid, 1, 100, "awq: alpha grid points in [0, 1)");
  p.AddInt("awq-clip-grid", &f.awq_clip_grid, 1, 100,
           "awq: clip ratios tried per block (1 = no clip search)");
  p.AddDouble("gptq-damp", &f.gptq_damp, 0.0, 10.0,
              "gptq: damping added to the Hessian diagonal, as a fraction of its mean");
  p.AddBool("gptq-act-order", &f.gptq_act_order,
            "gptq: quantize columns by decreasing input energy (desc_act), with each block's "
            "scales fixed from the original weights (static groups)");
  p.AddDouble("alpha", &f.alpha, 0.0, 1.0,
              "smoothquant: migration strength in [0, 1], s = max|x|^alpha / max|w|^(1-alpha)");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads, 0 = all cores");
  p.AddBool("report", &f.report,
            "print per-linear activation statistics on the calibration text (max|x| per "
            "channel, channels over --report-threshold, max/median)");
  p.AddDouble("report-threshold", &f.report_threshold, 0.0, 1e9,
              "--report: the |x| above which a channel counts as an outlier");
}

absl::StatusOr<std::string> ReadCalibration(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--calibration: no regular file at '%s'", path));
  }
  if (st.st_size > kMaxCalibrationBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--calibration: '%s' is %d bytes, above the 8 MiB limit", path, st.st_size));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrFormat("--calibration: cannot read '%s'", path));
  }
  return ss.str();
}

// "<stage> done/total" on stderr at every tenth of a stage (and its end),
// on one line that each update rewrites.
class ProgressLine {
 public:
  void operator()(std::string_view stage, int64_t done, int64_t total) {
    const int64_t tenth = total > 0 ? done * 10 / total : 10;
    if (stage == stage_ && tenth == tenth_ && done != total) return;
    stage_ = std::string(stage);
    tenth_ = tenth;
    std::fprintf(stderr, "\r%-10s %6lld / %lld", stage_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string stage_;
  int64_t tenth_ = -1;
};

int RunReport(const LoadedModel& loaded, const std::vector<int32_t>& tokens, const QuantizeFlags& f,
              ThreadPool* pool) {
  engine::LoadOptions load;
  load.pool = pool;
  load.prefault = false;
  load.kernels = engine::KernelMode::kReference;
  auto model = engine::LlamaModel::Load(*loaded.file, load);
  if (!model.ok()) return ExitFor("quantize", UsageStatus(std::string(model.status().message())));
  quant::ActivationReport report((*model)->config().num_layers);
  absl::Status s =
      quant::RunCalibration(model->get(), tokens, f.calibration_ctx, &report,
                            [line = ProgressLine()](int64_t done, int64_t total) mutable {
                              line("report", done, total);
                            });
  if (!s.ok()) return ExitFor("quantize", absl::InternalError(std::string(s.message())));
  const float threshold = static_cast<float>(f.report_threshold);
  std::fputs(quant::FormatReport(report.Summarize(threshold), threshold).c_str(), stdout);
  return kExitOk;
}

// --out, --type, --method and --alpha of a quantizing run; usage errors.
absl::Status ParseTarget(const ArgParser& parser, const QuantizeFlags& f,
                         quant::QuantizeOptions* options) {
  if (f.out.empty()) return UsageStatus("--out is required");
  auto method = quant::ParseMethod(f.method);
  if (!method.ok()) return UsageStatus("--method: " + std::string(method.status().message()));
  options->method = *method;
  const bool smooth = *method == quant::Method::kSmoothQuant;
  if (parser.WasSet("alpha") && !smooth) {
    return UsageStatus("--alpha applies to --method smoothquant only");
  }
  options->smooth_alpha = static_cast<float>(f.alpha);
  if (f.type.empty() && !smooth) return UsageStatus("--type is required");
  auto target = quant::ParseTargetType(f.type.empty() ? "q8_0" : f.type);
  if (!target.ok()) return UsageStatus("--type: " + std::string(target.status().message()));
  if (smooth && target->type != gguf::TensorType::kQ8_0) {
    return UsageStatus("--method smoothquant writes int8 weights: --type must be q8_0, got '" +
                       f.type + "'");
  }
  options->target = *target;
  return absl::OkStatus();
}

// The input GGUF, with its tokenizer when calibration text must be encoded
// (rtn needs none: a model without one, a test's tiny model, quantizes too).
absl::StatusOr<LoadedModel> LoadInput(const std::string& path, bool tokenizer) {
  if (tokenizer) return LoadTokenizer(path);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(path));
  return LoadedModel{path, std::move(file), nullptr, nullptr};
}

// --out: not the input model, and writable (checked before the model loads).
absl::Status CheckOut(const std::string& out, const std::string& model_path) {
  if (out == model_path) return UsageStatus("--out must differ from the input model");
  return CheckOutputFile("--out", out);
}

// `out`.tmp, renamed to `out` once whole: a failure never leaves a partial file.
absl::Status WriteAtomically(const gguf::GgufWriter& writer, const std::string& out) {
  const std::string tmp = out + ".tmp";
  if (absl::Status s = writer.WriteFile(tmp); !s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrFormat("cannot rename '%s' to '%s'", tmp, out));
  }
  return absl::OkStatus();
}

void PrintSummary(const std::string& out, const quant::QuantizeOptions& options,
                  const quant::QuantizeSummary& summary) {
  std::string types;
  for (const auto& [name, count] : summary.type_counts) {
    types += absl::StrFormat("%s%s x%d", types.empty() ? "" : ", ", name, count);
  }
  std::printf("wrote %s (%s, %s): %.1f MiB of tensors (%s)\n", out.c_str(),
              options.target.name.c_str(), std::string(quant::MethodName(options.method)).c_str(),
              summary.bytes_out / 1048576.0, types.c_str());
}

}  // namespace

int RunQuantize(int argc, char** argv) {
  QuantizeFlags f;
  ArgParser parser(
      "quantize",
      "Quantize a GGUF model (rtn, awq, gptq or smoothquant) into a new GGUF; --report prints "
      "activation statistics (docs/quantization.md).");
  AddFlags(parser, f);
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) {
    return ExitFor("quantize", UsageStatus(std::string(s.message())));
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  const bool quantize = !f.report || parser.WasSet("out") || parser.WasSet("type");
  quant::QuantizeOptions options;
  if (quantize) {
    if (absl::Status st = ParseTarget(parser, f, &options); !st.ok()) {
      return ExitFor("quantize", st);
    }
  }
  if (f.gptq_act_order && (!quantize || options.method != quant::Method::kGptq)) {
    return ExitFor("quantize", UsageStatus("--gptq-act-order needs --method gptq"));
  }
  const bool needs_calibration = f.report || options.method != quant::Method::kRtn;
  if (needs_calibration && f.calibration.empty()) {
    return ExitFor("quantize",
                   UsageStatus(f.report ? "--report needs --calibration FILE"
                                        : "--method " + f.method + " needs --calibration FILE"));
  }
  std::string text;
  if (!f.calibration.empty()) {
    auto t = ReadCalibration(f.calibration);
    if (!t.ok()) return ExitFor("quantize", UsageStatus(std::string(t.status().message())));
    text = std::move(*t);
  }
  auto path = ResolveModelPath(f.model);
  if (!path.ok()) return ExitFor("quantize", UsageStatus(std::string(path.status().message())));
  if (quantize) {
    if (absl::Status st = CheckOut(f.out, *path); !st.ok()) return ExitFor("quantize", st);
  }
  // rtn needs no tokenizer: a model without one (a test's tiny model)
  // quantizes too.
  absl::StatusOr<LoadedModel> loaded = LoadInput(*path, /*tokenizer=*/!text.empty());
  if (!loaded.ok()) return ExitFor("quantize", UsageStatus(std::string(loaded.status().message())));
  std::vector<int32_t> tokens;
  if (!text.empty()) {
    tokens = loaded->tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/false);
    if (static_cast<int64_t>(tokens.size()) > f.calibration_tokens)
      tokens.resize(f.calibration_tokens);
  }
  if (needs_calibration && tokens.size() < 2) {
    return ExitFor("quantize", UsageStatus("--calibration: the text has fewer than 2 tokens"));
  }
  const int threads = f.threads > 0 ? static_cast<int>(f.threads)
                                    : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  if (f.report) {
    if (int rc = RunReport(*loaded, tokens, f, &pool); rc != kExitOk || !quantize) return rc;
  }
  options.calibration_tokens = tokens;
  options.calibration_seq_len = f.calibration_ctx;
  options.max_calibration_tokens = f.calibration_tokens;
  options.awq.grid = static_cast<int>(f.awq_grid);
  options.awq.clip_grid = static_cast<int>(f.awq_clip_grid);
  options.gptq.damp = f.gptq_damp;
  options.gptq.act_order = f.gptq_act_order;
  options.pool = &pool;
  options.progress = ProgressLine();
  gguf::GgufWriter writer;
  auto summary = quant::QuantizeModel(*loaded->file, options, &writer);
  if (!summary.ok()) {
    return ExitFor("quantize", summary.status());
  }
  if (absl::Status s = WriteAtomically(writer, f.out); !s.ok()) {
    return ExitFor("quantize", absl::InternalError(std::string(s.message())));
  }
  PrintSummary(f.out, options, *summary);
  return kExitOk;
}

}  // namespace tandem::cli
