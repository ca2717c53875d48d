// Views of a Llama-family model's weights inside a GGUF file.
//
// Matrices stay where they are (quantized, in the mmap'ed file) and are
// described by kernels::WeightView; only the small vectors (norms, biases,
// rope factors) are dequantized into owned f32 storage. Pack() additionally
// repacks the quantized matrices once into the interleaved row-group layout
// of kernels/qgemm.h (owned, 64-byte aligned copies: about the size of the
// file's matrices again; the views stay valid for the reference path and the
// embedding lookup). Q|K|V and gate|up are stacked into one matrix each
// (PackedStack: one PackedWeight per run of views that share a type, as in
// K-quant files whose 576-column Q/K fall back to Q5_0 and V to Q8_0).
//
// Ownership: the GgufFile must outlive the ModelWeights.
#ifndef TANDEM_ENGINE_WEIGHTS_H_
#define TANDEM_ENGINE_WEIGHTS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "engine/model_config.h"
#include "kernels/kernels.h"
#include "kernels/qgemm.h"

namespace tandem::engine {

// Stacked views packed as consecutive parts, one per run of views of one
// type; part p holds rows [offset, offset + w.rows()) of the stack.
struct PackedStack {
  struct Part {
    kernels::PackedWeight w;
    int64_t offset = 0;
  };
  std::vector<Part> parts;
  bool empty() const { return parts.empty(); }
  int64_t bytes() const;
};

// kernels::QGemm of every part into its rows of y (ldy: row stride). Each
// output element is computed by exactly one part, as if the stack were one
// PackedWeight.
void QGemm(const PackedStack& m, const kernels::QuantizedActs& acts, float* y, int64_t ldy,
           bool accumulate, ThreadPool* pool);

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

  // Filled by ModelWeights::Pack when every matrix of the layer is packable;
  // empty otherwise.
  PackedStack qkv;               // [q_dim + 2 * kv_dim, hidden]: Q rows, K rows, V rows
  kernels::PackedWeight wo_p;    // [hidden, q_dim]
  PackedStack gate_up;           // [2 * ffn, hidden]: gate rows then up rows
  kernels::PackedWeight down_p;  // [hidden, ffn]
  bool packed() const { return !qkv.empty(); }
};

struct ModelWeights {
  kernels::WeightView token_embd;    // [vocab, hidden]
  kernels::WeightView lm_head;       // [vocab, hidden]: output.weight, or token_embd when tied
  std::vector<float> output_norm;    // [hidden]
  std::vector<float> rope_freqs;     // [rope_dim / 2] or empty
  std::vector<LayerWeights> layers;  // [num_layers]
  std::map<std::string, int> type_counts;  // tensor type name -> tensors used
  kernels::PackedWeight lm_head_p;         // packed lm_head (empty if not packable)
  // One arena for every packed matrix (2 MiB aligned, transparent huge pages
  // requested): streaming decode then takes few TLB misses.
  struct ArenaFree {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], ArenaFree> packed_arena;
  int64_t packed_arena_bytes = 0;

  static absl::StatusOr<ModelWeights> Load(const gguf::GgufFile& file, const ModelConfig& config);

  // Repacks every packable matrix (see the file comment); `pool` may be null.
  void Pack(ThreadPool* pool);
  // Bytes held by the packed copies.
  int64_t packed_bytes() const;
  // Layers that run on the packed (fast) path.
  int64_t num_packed_layers() const;
};

// Checks that every tensor the forward pass needs is present with the
// expected shape and a dequantizable type.
absl::Status CheckTensors(const gguf::GgufFile& file, const ModelConfig& config);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_WEIGHTS_H_
