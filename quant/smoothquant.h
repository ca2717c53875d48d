// SmoothQuant (Xiao et al., 2023): W8A8 with activation outliers migrated
// into the weights.
//
// For a group of linears sharing one input X (q/k/v, o, gate/up, down), the
// smoothing factor of input channel c is
//   s_c = max_t |X_tc| ^ alpha / max_r |W_rc| ^ (1 - alpha)
// (the weight maximum over the rows of every linear of the group). The
// linears become W diag(s) and the input X diag(1/s): diag(1/s) is folded
// into what produces X (quantize_model.cc, shared with AWQ: the RMSNorm
// weight, attn_v's rows, ffn_up's rows), so in f32 the model computes the
// same function, while the activations' per-channel range is flattened
// (alpha = 1 moves it all into the weights, alpha = 0 only equalizes the
// weights). Then the weights are quantized to Q8_0 and the model runs with
// one int8 scale per token on its activations (engine::KernelMode::
// kFastInt8Token).
//
// Thread safety: pure functions.
#ifndef TANDEM_QUANT_SMOOTHQUANT_H_
#define TANDEM_QUANT_SMOOTHQUANT_H_

#include <cstdint>
#include <vector>

namespace tandem::quant {

// The default migration strength (the paper's choice for most models).
inline constexpr float kDefaultSmoothAlpha = 0.5f;

// max_r |x[r, c]| of a row-major [rows, cols] matrix, per column c.
std::vector<float> ColumnAbsMax(const float* x, int64_t rows, int64_t cols);

// s_c as above for alpha in [0, 1]. A channel whose activation or weight
// maximum is 0 (dead, or pruned) gets s_c = 1; the others are clamped below
// at 1e-5 before the powers, so s is finite and positive.
std::vector<float> SmoothScales(const std::vector<float>& act_max,
                                const std::vector<float>& weight_max, float alpha);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_SMOOTHQUANT_H_
