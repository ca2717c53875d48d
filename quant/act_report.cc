#include "quant/act_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tandem::quant {

ActivationReport::ActivationReport(int64_t num_layers)
    : channel_max_(static_cast<size_t>(num_layers * 4)) {}

void ActivationReport::Observe(int64_t layer, engine::LinearInput which, const float* x,
                               int64_t num_tokens, int64_t dim) {
  std::vector<float>& m = channel_max_[static_cast<size_t>(layer * 4 + static_cast<int>(which))];
  if (m.empty()) m.assign(dim, 0.f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t c = 0; c < dim; ++c) m[c] = std::max(m[c], std::fabs(x[t * dim + c]));
  }
}

std::vector<InputReport> ActivationReport::Summarize(float threshold) const {
  std::vector<InputReport> rows;
  for (size_t i = 0; i < channel_max_.size(); ++i) {
    const std::vector<float>& m = channel_max_[i];
    if (m.empty()) continue;
    InputReport r;
    r.layer = static_cast<int64_t>(i / 4);
    r.input = static_cast<engine::LinearInput>(i % 4);
    r.channels = static_cast<int64_t>(m.size());
    const auto top = std::max_element(m.begin(), m.end());
    r.max = *top;
    r.top_channel = top - m.begin();
    std::vector<float> sorted = m;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    r.median = sorted[sorted.size() / 2];
    r.over_threshold = std::count_if(m.begin(), m.end(), [&](float v) { return v > threshold; });
    rows.push_back(r);
  }
  return rows;
}

std::string_view LinearInputName(engine::LinearInput input) {
  switch (input) {
    case engine::LinearInput::kAttnIn:
      return "attn_in (q,k,v)";
    case engine::LinearInput::kAttnOut:
      return "attn_out (o)";
    case engine::LinearInput::kFfnIn:
      return "ffn_in (gate,up)";
    case engine::LinearInput::kDownIn:
      return "down_in (down)";
  }
  return "?";
}

std::string FormatReport(const std::vector<InputReport>& rows, float threshold) {
  std::string out = absl::StrFormat("%-5s %-17s %8s %10s %10s %9s %8s %s\n", "layer", "input",
                                    "channels", "max|x|", "median", "max/med",
                                    absl::StrFormat(">%.1f", threshold), "top channel");
  int64_t total_over = 0, inputs_with_outliers = 0;
  for (const InputReport& r : rows) {
    out += absl::StrFormat("%-5d %-17s %8d %10.3f %10.3f %9.1f %8d %d\n", r.layer,
                           LinearInputName(r.input), r.channels, r.max, r.median,
                           r.median > 0 ? r.max / r.median : 0.f, r.over_threshold, r.top_channel);
    total_over += r.over_threshold;
    inputs_with_outliers += r.over_threshold > 0 ? 1 : 0;
  }
  out += absl::StrFormat("%d of %d linear inputs have channels above %.1f (%d channels in all)\n",
                         inputs_with_outliers, rows.size(), threshold, total_over);
  return out;
}

}  // namespace tandem::quant
