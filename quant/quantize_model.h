// `tandem quantize`: a Llama-family GGUF in, a quantized GGUF out.
//
// The reference weights are the f32 values of the input's tensors (for a
// file that is already quantized, e.g. the bundled SmolLM2 Q4_1, its
// dequantized weights). Methods (quant/quant_types.h for the per-tensor
// types):
//   rtn  - the reference quantizers (kernels/quant.h) on every matrix;
//   awq  - per layer: scales searched for q/k/v (folded into attn_norm),
//          attn_output (into attn_v's rows, shared across the heads of a
//          KV group), gate/up (into ffn_norm) and ffn_down (into ffn_up's
//          rows), then a clip search per block, then rtn (quant/awq.h);
//   gptq - every layer matrix by GPTQ with the Gram matrix of its input
//          (quant/gptq.h);
//   smoothquant - per layer and linear group, the smoothing factors of
//          quant/smoothquant.h folded into the same producers as AWQ's
//          scales, then rtn to Q8_0 (the target must be q8_0; f32 in tests
//          keeps the smoothed weights unquantized). The file records
//          tandem.quantize.alpha and tandem.quantize.kernels =
//          "fast-int8-token", the kernel mode it runs with by default.
// awq, gptq and smoothquant run the model (f32 reference kernels) over the calibration
// tokens first and keep at most max_calibration_tokens rows of each
// linear's input. token_embd / output are always rtn (their input is a
// lookup / the final norm, not calibrated). Metadata is copied;
// general.file_type and general.quantization_version are set, and
// tandem.quantize.{type,method} record how the file was made.
//
// Thread safety: one call at a time per GgufFile is not required (the
// input is read only); the pool is used by one call at a time.
#ifndef TANDEM_QUANT_QUANTIZE_MODEL_H_
#define TANDEM_QUANT_QUANTIZE_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "common/thread_pool.h"
#include "quant/awq.h"
#include "quant/gptq.h"
#include "quant/quant_types.h"
#include "quant/smoothquant.h"

namespace tandem::quant {

// (stage, done, total); stages: "calibrate", "awq", "gptq", "smoothquant",
// "write".
using QuantizeProgress = std::function<void(std::string_view, int64_t, int64_t)>;

struct QuantizeOptions {
  TargetType target;
  Method method = Method::kRtn;
  std::vector<int32_t> calibration_tokens;  // awq / gptq: required
  int64_t calibration_seq_len = 256;        // tokens per calibration sequence
  int64_t max_calibration_tokens = 512;     // input rows kept per linear
  AwqOptions awq;
  GptqOptions gptq;
  float smooth_alpha = kDefaultSmoothAlpha;  // smoothquant: migration strength in [0, 1]
  ThreadPool* pool = nullptr;                // not owned
  QuantizeProgress progress;
};

struct QuantizeSummary {
  std::map<std::string, int> type_counts;  // output type name -> tensors
  uint64_t bytes_out = 0;                  // tensor bytes written
  int64_t calibration_tokens = 0;          // tokens the model ran over
  std::vector<float> awq_alphas;           // awq: per layer, qkv/o/gate-up/down
};

// Fills `out` (empty) with the quantized model. InvalidArgument for files
// that are not a supported model or have tensors that cannot be
// dequantized; awq / gptq / smoothquant without calibration tokens too, and
// smoothquant with a type other than q8_0 (or f32) or alpha outside [0, 1].
absl::StatusOr<QuantizeSummary> QuantizeModel(const gguf::GgufFile& in,
                                              const QuantizeOptions& options,
                                              gguf::GgufWriter* out);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_QUANTIZE_MODEL_H_
