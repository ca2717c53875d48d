// Activation statistics of every linear's input (`tandem quantize
// --report`, issue 17 item 4): per (layer, input) the largest |x| of each
// channel over the calibration tokens; the report lists the largest channel
// maximum, the median of the channel maxima, their ratio and the number of
// channels whose maximum is above a threshold (6.0: LLM.int8's outlier
// definition). Tells whether a model has the outlier channels that make
// int8 activations hard.
//
// Thread safety: Observe from the Forward thread only.
#ifndef TANDEM_QUANT_ACT_REPORT_H_
#define TANDEM_QUANT_ACT_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/llama_model.h"

namespace tandem::quant {

struct InputReport {
  int64_t layer = 0;
  engine::LinearInput input = engine::LinearInput::kAttnIn;
  int64_t channels = 0;
  float max = 0;     // largest channel maximum
  float median = 0;  // median of the channel maxima
  int64_t over_threshold = 0;
  int64_t top_channel = 0;  // channel holding `max`
};

class ActivationReport : public engine::ActivationObserver {
 public:
  explicit ActivationReport(int64_t num_layers);
  void Observe(int64_t layer, engine::LinearInput which, const float* x, int64_t num_tokens,
               int64_t dim) override;

  std::vector<InputReport> Summarize(float threshold) const;

 private:
  std::vector<std::vector<float>> channel_max_;  // [layer * 4 + input][channel]
};

std::string_view LinearInputName(engine::LinearInput input);

// The table printed by --report (one line per layer and input, then totals).
std::string FormatReport(const std::vector<InputReport>& rows, float threshold);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_ACT_REPORT_H_
