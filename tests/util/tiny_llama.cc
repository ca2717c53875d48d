#include "tests/util/tiny_llama.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/status.h"
#include "kernels/quant.h"

namespace tandem::testing {
namespace {

class Builder {
 public:
  Builder(const TinyLlamaShape& s, uint32_t seed) : s_(s), rng_(seed) {}

  void Tensor(const std::string& name, std::vector<int64_t> shape, gguf::TensorType type,
              float scale, float offset = 0.f) {
    if (s_.omit_tensors.count(name)) return;
    if (auto it = s_.shape_override.find(name); it != s_.shape_override.end()) shape = it->second;
    const size_t dot =
        name.rfind('.', name.rfind('.') - 1);  // "attn_v.weight" of "blk.0.attn_v.weight"
    if (auto it = s_.type_override.find(name.substr(dot == std::string::npos ? 0 : dot + 1));
        it != s_.type_override.end()) {
      type = it->second;
    }
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * u(rng_);
    absl::StatusOr<uint64_t> bytes = gguf::RowBytes(type, n);
    TANDEM_CHECK(bytes.ok());
    std::string raw(*bytes, '\0');
    if (kernels::IsQuantizable(type)) {
      kernels::QuantizeRow(type, v.data(), raw.data(), n);
    } else {
      RandomKQuant(type, n, scale, reinterpret_cast<uint8_t*>(raw.data()));
    }
    TANDEM_CHECK(w_.AddTensor(name, shape, type, std::move(raw)).ok());
  }

  gguf::GgufWriter& writer() { return w_; }

 private:
  // K-quant blocks (types QuantizeRow does not take) of random bytes with
  // f16 super-block scales that keep |w| below about `scale`, centred.
  void RandomKQuant(gguf::TensorType type, int64_t n, float scale, uint8_t* dst) {
    int bytes = 0;
    float d = 0.f, dmin = 0.f;
    if (type == gguf::TensorType::kQ4_K || type == gguf::TensorType::kQ5_K) {
      const float qmax = type == gguf::TensorType::kQ4_K ? 15.f : 31.f;
      bytes = type == gguf::TensorType::kQ4_K ? 144 : 176;
      d = 2.f * scale / (63.f * qmax);
      dmin = d * qmax / 2.f;
    } else {
      TANDEM_CHECK(type == gguf::TensorType::kQ6_K);
      bytes = 210;
      d = scale / (128.f * 32.f);
    }
    std::uniform_int_distribution<int> byte(0, 255);
    const uint16_t hd = kernels::Fp32ToFp16(d), hm = kernels::Fp32ToFp16(dmin);
    for (int64_t b = 0; b < n / 256; ++b, dst += bytes) {
      for (int i = 0; i < bytes; ++i) dst[i] = uint8_t(byte(rng_));
      if (type == gguf::TensorType::kQ6_K) {
        std::memcpy(dst + 208, &hd, 2);
      } else {
        std::memcpy(dst, &hd, 2);
        std::memcpy(dst + 2, &hm, 2);
      }
    }
  }

  const TinyLlamaShape& s_;
  std::mt19937 rng_;
  gguf::GgufWriter w_;
};

}  // namespace

std::string MakeRandomLlamaGguf(const TinyLlamaShape& s, uint32_t seed) {
  Builder b(s, seed);
  gguf::GgufWriter& w = b.writer();
  const std::string a = s.arch + ".";
  w.Add("general.architecture", gguf::Value::String(s.arch));
  w.Add("general.name", gguf::Value::String("tiny-random"));
  w.Add(a + "block_count", gguf::Value::Uint32(uint32_t(s.num_layers)));
  w.Add(a + "embedding_length", gguf::Value::Uint32(uint32_t(s.hidden)));
  w.Add(a + "feed_forward_length", gguf::Value::Uint32(uint32_t(s.ffn)));
  w.Add(a + "attention.head_count", gguf::Value::Uint32(uint32_t(s.num_heads)));
  if (s.write_head_count_kv) {
    w.Add(a + "attention.head_count_kv", gguf::Value::Uint32(uint32_t(s.num_kv_heads)));
  }
  w.Add(a + "context_length", gguf::Value::Uint32(uint32_t(s.context)));
  w.Add(a + "attention.layer_norm_rms_epsilon", gguf::Value::Float32(1e-5f));
  w.Add(a + "rope.freq_base", gguf::Value::Float32(s.rope_base));
  const int64_t hd = s.num_heads > 0 ? s.hidden / s.num_heads : 1;
  const int64_t q = s.num_heads * hd, kv = s.num_kv_heads * hd;
  const float ws = 2.f / std::sqrt(float(s.hidden));
  b.Tensor("token_embd.weight", {s.hidden, s.vocab}, s.embd_type, 1.f);
  b.Tensor("output_norm.weight", {s.hidden}, gguf::TensorType::kF32, 0.2f, 1.f);
  if (!s.tied) b.Tensor("output.weight", {s.hidden, s.vocab}, s.matrix_type, ws);
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    b.Tensor(p + "attn_norm.weight", {s.hidden}, gguf::TensorType::kF32, 0.2f, 1.f);
    b.Tensor(p + "ffn_norm.weight", {s.hidden}, gguf::TensorType::kF32, 0.2f, 1.f);
    b.Tensor(p + "attn_q.weight", {s.hidden, q}, s.matrix_type, ws);
    b.Tensor(p + "attn_k.weight", {s.hidden, kv}, s.matrix_type, ws);
    b.Tensor(p + "attn_v.weight", {s.hidden, kv}, s.matrix_type, ws);
    b.Tensor(p + "attn_output.weight", {q, s.hidden}, s.matrix_type, ws);
    b.Tensor(p + "ffn_gate.weight", {s.hidden, s.ffn}, s.matrix_type, ws);
    b.Tensor(p + "ffn_up.weight", {s.hidden, s.ffn}, s.matrix_type, ws);
    b.Tensor(p + "ffn_down.weight", {s.ffn, s.hidden}, s.matrix_type,
             2.f / std::sqrt(float(s.ffn)));
    if (s.qkv_bias) {
      b.Tensor(p + "attn_q.bias", {q}, gguf::TensorType::kF32, 0.1f);
      b.Tensor(p + "attn_k.bias", {kv}, gguf::TensorType::kF32, 0.1f);
      b.Tensor(p + "attn_v.bias", {kv}, gguf::TensorType::kF32, 0.1f);
    }
  }
  return w.Serialize();
}

}  // namespace tandem::testing
