// Calibration activations: the input of every group of linears (see
// engine::LinearInput) on the exact f32 reference path, captured while the
// model runs over calibration tokens. Shared by AWQ, GPTQ and --report.
//
// Thread safety: Observe is called from the Forward thread only; read the
// results after RunCalibration returns.
#ifndef TANDEM_QUANT_CALIBRATION_H_
#define TANDEM_QUANT_CALIBRATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/llama_model.h"

namespace tandem::quant {

constexpr int kNumLinearInputs = 4;

// Keeps the first `max_tokens` rows of each (layer, input).
class CalibrationSet : public engine::ActivationObserver {
 public:
  CalibrationSet(int64_t num_layers, int64_t max_tokens);

  void Observe(int64_t layer, engine::LinearInput which, const float* x, int64_t num_tokens,
               int64_t dim) override;

  // [tokens(layer, which), dim(layer, which)] row-major.
  const std::vector<float>& inputs(int64_t layer, engine::LinearInput which) const {
    return slots_[Index(layer, which)].x;
  }
  int64_t dim(int64_t layer, engine::LinearInput which) const {
    return slots_[Index(layer, which)].dim;
  }
  int64_t tokens(int64_t layer, engine::LinearInput which) const;

 private:
  struct Slot {
    int64_t dim = 0;
    std::vector<float> x;
  };
  static size_t Index(int64_t layer, engine::LinearInput which) {
    return static_cast<size_t>(layer * kNumLinearInputs + static_cast<int>(which));
  }
  int64_t max_tokens_;
  std::vector<Slot> slots_;
};

// Runs `model` (loaded with KernelMode::kReference, so the observer sees
// every layer) over `tokens` split into independent sequences of at most
// `seq_len` tokens, with `observer` installed. progress(done, total) after
// each sequence.
absl::Status RunCalibration(engine::LlamaModel* model, absl::Span<const int32_t> tokens,
                            int64_t seq_len, engine::ActivationObserver* observer,
                            const std::function<void(int64_t, int64_t)>& progress);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_CALIBRATION_H_
