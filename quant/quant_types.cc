#include "quant/quant_types.h"

#include <array>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::quant {
namespace {

using gguf::TensorType;

struct NamedType {
  const char* name;
  TensorType type;
  bool mix;
  uint32_t file_type;
};

constexpr std::array<NamedType, 10> kTypes = {{
    {"q8_0", TensorType::kQ8_0, false, 7},
    {"q4_0", TensorType::kQ4_0, false, 2},
    {"q4_1", TensorType::kQ4_1, false, 3},
    {"q5_0", TensorType::kQ5_0, false, 8},
    {"q5_1", TensorType::kQ5_1, false, 9},
    {"q4_k", TensorType::kQ4_K, false, 14},  // Q4_K_S
    {"q4_k_m", TensorType::kQ4_K, true, 15},
    {"q5_k", TensorType::kQ5_K, false, 16},  // Q5_K_S
    {"q5_k_m", TensorType::kQ5_K, true, 17},
    {"q6_k", TensorType::kQ6_K, false, 18},
}};

// llama.cpp's use_more_bits(i, n): the first and last eighth, every third between.
bool MoreBits(int64_t layer, int64_t n) {
  return layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
}

// The layer index of "blk.N.…", or -1.
int64_t LayerOf(const std::string& name) {
  if (!absl::StartsWith(name, "blk.")) return -1;
  const size_t dot = name.find('.', 4);
  int64_t layer = -1;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(4, dot - 4), &layer)) return -1;
  return layer;
}

}  // namespace

absl::StatusOr<TargetType> ParseTargetType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const NamedType& t : kTypes) {
    if (lower == t.name) return TargetType{t.type, t.mix, lower};
  }
  std::string names;
  for (const NamedType& t : kTypes) absl::StrAppend(&names, names.empty() ? "" : ", ", t.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown quantization type '", std::string(name), "' (one of: ", names, ")"));
}

absl::StatusOr<Method> ParseMethod(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "rtn") return Method::kRtn;
  if (lower == "awq") return Method::kAwq;
  if (lower == "gptq") return Method::kGptq;
  if (lower == "smoothquant") return Method::kSmoothQuant;
  return absl::InvalidArgumentError(absl::StrCat("unknown quantization method '", std::string(name),
                                                 "' (one of: rtn, awq, gptq, smoothquant)"));
}

std::string_view MethodName(Method m) {
  switch (m) {
    case Method::kRtn:
      return "rtn";
    case Method::kAwq:
      return "awq";
    case Method::kGptq:
      return "gptq";
    case Method::kSmoothQuant:
      return "smoothquant";
  }
  return "?";
}

TensorType TensorTargetType(const TargetType& target, const std::string& name, int rank,
                            int64_t row_length, int64_t num_layers, bool tied, TensorType current) {
  if (rank < 2) return current;
  TensorType t = target.type;
  const bool is_output = name == "output.weight" || (tied && name == "token_embd.weight");
  if (is_output && t != TensorType::kQ8_0) {
    t = row_length % 256 != 0 ? TensorType::kQ8_0 : TensorType::kQ6_K;
  }
  if (target.mix && !is_output) {
    const int64_t layer = LayerOf(name);
    const bool v_or_down =
        absl::StrContains(name, ".attn_v.") || absl::StrContains(name, ".ffn_down.");
    if (layer >= 0 && v_or_down && MoreBits(layer, num_layers)) t = TensorType::kQ6_K;
  }
  if (row_length % 256 != 0) {
    if (t == TensorType::kQ4_K) t = TensorType::kQ5_0;
    if (t == TensorType::kQ5_K) t = TensorType::kQ5_1;
    if (t == TensorType::kQ6_K) t = TensorType::kQ8_0;
  }
  if (row_length % 32 != 0) t = TensorType::kF16;
  return t;
}

uint32_t FileTypeOf(const TargetType& target) {
  for (const NamedType& t : kTypes) {
    if (target.name == t.name) return t.file_type;
  }
  return 0;
}

}  // namespace tandem::quant
