#include "quant/calibration.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/single_sequence_runner.h"

namespace tandem::quant {

CalibrationSet::CalibrationSet(int64_t num_layers, int64_t max_tokens)
    : max_tokens_(max_tokens), slots_(static_cast<size_t>(num_layers * kNumLinearInputs)) {}

void CalibrationSet::Observe(int64_t layer, engine::LinearInput which, const float* x,
                             int64_t num_tokens, int64_t dim) {
  Slot& s = slots_[Index(layer, which)];
  s.dim = dim;
  const int64_t have = static_cast<int64_t>(s.x.size()) / dim;
  const int64_t take = std::min(num_tokens, max_tokens_ - have);
  if (take > 0) s.x.insert(s.x.end(), x, x + take * dim);
}

int64_t CalibrationSet::tokens(int64_t layer, engine::LinearInput which) const {
  const Slot& s = slots_[Index(layer, which)];
  return s.dim == 0 ? 0 : static_cast<int64_t>(s.x.size()) / s.dim;
}

absl::Status RunCalibration(engine::LlamaModel* model, absl::Span<const int32_t> tokens,
                            int64_t seq_len, engine::ActivationObserver* observer,
                            const std::function<void(int64_t, int64_t)>& progress) {
  if (model->kernel_mode() != engine::KernelMode::kReference) {
    return absl::FailedPreconditionError("calibration needs the f32 reference kernels");
  }
  if (tokens.empty()) return absl::InvalidArgumentError("no calibration tokens");
  seq_len = std::max<int64_t>(1, std::min(seq_len, model->config().context_length));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::SingleSequenceRunner> runner,
                          engine::SingleSequenceRunner::Create(model, seq_len, seq_len));
  model->set_activation_observer(observer);
  const int64_t total = static_cast<int64_t>(tokens.size());
  absl::Status status;
  for (int64_t begin = 0; begin < total && status.ok(); begin += seq_len) {
    runner->Reset();
    const int64_t n = std::min(seq_len, total - begin);
    status = runner->Prefill(tokens.subspan(begin, n)).status();
    if (progress) progress(begin + n, total);
  }
  model->set_activation_observer(nullptr);
  if (!status.ok())
    return absl::Status(status.code(), absl::StrCat("calibration: ", status.message()));
  return absl::OkStatus();
}

}  // namespace tandem::quant
