// Builds small random Llama-family GGUF models in memory (test-only).
#ifndef TANDEM_TESTS_UTIL_TINY_LLAMA_H_
#define TANDEM_TESTS_UTIL_TINY_LLAMA_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/gguf/types.h"

namespace tandem::testing {

struct TinyLlamaShape {
  std::string arch = "llama";
  int64_t num_layers = 2;
  int64_t hidden = 64;  // multiple of 32 for quantized matrices
  int64_t ffn = 96;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;  // GQA by default
  int64_t vocab = 96;
  int64_t context = 256;
  float rope_base = 10000.f;
  bool tied = true;       // no output.weight
  bool qkv_bias = false;  // Qwen2-style attn_{q,k,v}.bias
  gguf::TensorType matrix_type = gguf::TensorType::kQ4_1;
  gguf::TensorType embd_type = gguf::TensorType::kQ8_0;
  // Per-matrix types by name without the "blk.N." prefix (e.g.
  // "attn_v.weight"), as mixed files have them; else matrix_type. K types
  // that kernels::QuantizeRow does not take get random blocks (the matrix's
  // columns a multiple of 256).
  std::map<std::string, gguf::TensorType> type_override;
  // Hostile-file knobs.
  std::set<std::string> omit_tensors;
  std::map<std::string, std::vector<int64_t>> shape_override;  // ggml order
  bool write_head_count_kv = true;
};

// A GGUF image (bytes) with weights drawn from `seed`.
std::string MakeRandomLlamaGguf(const TinyLlamaShape& shape, uint32_t seed);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_TINY_LLAMA_H_
