// Views of a Llama-family model's weights inside a GGUF file.
//
// Matrices stay where they are (quantized, in the mmap'ed file) and are
// described by kernels::WeightView; only the small vectors (norms, biases,
// rope factors) are dequantized into owned f32 storage.
//
// Ownership: the GgufFile must outlive the ModelWeights.
#ifndef TANDEM_ENGINE_WEIGHTS_H_
#define TANDEM_ENGINE_WEIGHTS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "engine/model_config.h"
#include "kernels/kernels.h"

namespace tandem::engine {

struct LayerWeights {
  std::vector<float> attn_norm;   // [hidden]
  std::vector<float> ffn_norm;    // [hidden]
  kernels::WeightView wq;         // [q_dim, hidden]
  kernels::WeightView wk;         // [kv_dim, hidden]
  kernels::WeightView wv;         // [kv_dim, hidden]
  kernels::WeightView wo;         // [hidden, q_dim]
  kernels::WeightView w_gate;     // [ffn, hidden]
  kernels::WeightView w_up;       // [ffn, hidden]
  kernels::WeightView w_down;     // [hidden, ffn]
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]; empty without bias
};

struct ModelWeights {
  kernels::WeightView token_embd;    // [vocab, hidden]
  kernels::WeightView lm_head;       // [vocab, hidden]: output.weight, or token_embd when tied
  std::vector<float> output_norm;    // [hidden]
  std::vector<float> rope_freqs;     // [rope_dim / 2] or empty
  std::vector<LayerWeights> layers;  // [num_layers]
  std::map<std::string, int> type_counts;  // tensor type name -> tensors used

  static absl::StatusOr<ModelWeights> Load(const gguf::GgufFile& file, const ModelConfig& config);
};

// Checks that every tensor the forward pass needs is present with the
// expected shape and a dequantizable type.
absl::Status CheckTensors(const gguf::GgufFile& file, const ModelConfig& config);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_WEIGHTS_H_
