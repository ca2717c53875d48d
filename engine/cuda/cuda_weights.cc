#include "engine/cuda/cuda_weights.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/quant.h"

namespace tandem::engine::cuda {
namespace {

namespace kc = kernels::cuda;
using gguf::TensorType;

std::string TypeName(TensorType t) {
  auto traits = gguf::GetTypeTraits(t);
  return traits.ok() ? std::string(traits->name) : "?";
}

// Quantized types the kernels read stay as they are; the rest become bf16.

int64_t RowBytesOf(TensorType t, int64_t cols) {
  auto b = gguf::RowBytes(t, cols);
  return b.ok() ? static_cast<int64_t>(*b) : -1;
}

class Uploader {
 public:
  Uploader(DeviceWeights* w, kc::Stream stream) : w_(w), stream_(stream) {}

  absl::StatusOr<void*> Alloc(int64_t bytes) {
    TANDEM_ASSIGN_OR_RETURN(void* p, kc::Malloc(bytes));
    w_->owned.emplace_back(p);
    w_->bytes += bytes;
    return p;
  }

  // `v` converted to device type `dt` at d_dst (rows * RowBytes(dt, cols) bytes).
  absl::Status UploadTo(const kernels::WeightView& v, TensorType dt, void* d_dst) {
    w_->max_cols = std::max(w_->max_cols, v.cols);
    if (dt == v.type) {
      ++w_->device_types[TypeName(dt) + " (as stored)"];
      return kc::CopyToDevice(d_dst, v.data, v.rows * v.row_bytes, stream_);
    }
    ++w_->device_types[absl::StrCat(TypeName(dt), " (from ", TypeName(v.type), ")")];
    // Host conversion in slices of rows (the copy from pageable memory
    // returns once the source is staged, so the buffer can be reused).
    const int64_t slice = std::max<int64_t>(1, (int64_t(16) << 20) / std::max<int64_t>(1, v.cols));
    std::vector<float> row(v.cols);
    std::vector<uint16_t> buf;
    for (int64_t r0 = 0; r0 < v.rows; r0 += slice) {
      const int64_t m = std::min(slice, v.rows - r0);
      buf.resize(m * v.cols);
      for (int64_t r = 0; r < m; ++r) {
        kernels::DequantizeRow(v.type, v.row(r0 + r), row.data(), v.cols);
        for (int64_t c = 0; c < v.cols; ++c) buf[r * v.cols + c] = kernels::Fp32ToBf16(row[c]);
      }
      TANDEM_RETURN_IF_ERROR(kc::CopyToDevice(static_cast<char*>(d_dst) + r0 * v.cols * 2,
                                              buf.data(), m * v.cols * 2, stream_));
    }
    return kc::StreamSync(stream_);
  }

  // `m` (GGUF layout in `staged`, freed here) in the planar layout the
  // matrix products read fastest; other types as they are, kept.
  absl::StatusOr<kc::DeviceMatrix> Planar(kc::DeviceMatrix m, DevicePtr staged) {
    const int64_t bytes = kc::PlanarBytes(m);
    if (bytes == 0) {
      w_->owned.push_back(std::move(staged));
      w_->bytes += m.rows * m.row_bytes;
      return m;
    }
    TANDEM_ASSIGN_OR_RETURN(void* p, Alloc(bytes));
    TANDEM_ASSIGN_OR_RETURN(m, kc::RepackPlanar(m, p, stream_));
    TANDEM_RETURN_IF_ERROR(kc::StreamSync(stream_));
    return m;
  }
  absl::StatusOr<DevicePtr> Staging(int64_t bytes) {
    TANDEM_ASSIGN_OR_RETURN(void* p, kc::Malloc(bytes));
    return DevicePtr(p);
  }
  // A matrix for the matrix products (planar when quantized).
  absl::StatusOr<kc::DeviceMatrix> Matrix(const kernels::WeightView& v, TensorType dt) {
    kc::DeviceMatrix m{dt, nullptr, v.rows, v.cols, RowBytesOf(dt, v.cols)};
    if (m.row_bytes < 0) return absl::InvalidArgumentError("cuda: matrix cols not block aligned");
    TANDEM_ASSIGN_OR_RETURN(DevicePtr staged, Staging(v.rows * m.row_bytes));
    TANDEM_RETURN_IF_ERROR(UploadTo(v, dt, staged.get()));
    m.data = staged.get();
    return Planar(m, std::move(staged));
  }
  // A table for EmbeddingGather (GGUF layout).
  absl::StatusOr<kc::DeviceMatrix> Table(const kernels::WeightView& v, TensorType dt) {
    kc::DeviceMatrix m{dt, nullptr, v.rows, v.cols, RowBytesOf(dt, v.cols)};
    if (m.row_bytes < 0) return absl::InvalidArgumentError("cuda: table cols not block aligned");
    TANDEM_ASSIGN_OR_RETURN(void* p, Alloc(v.rows * m.row_bytes));
    TANDEM_RETURN_IF_ERROR(UploadTo(v, dt, p));
    m.data = p;
    return m;
  }

  // One stacked matrix when every part has the same device type, else one
  // matrix per part; offsets are the output columns of each part.
  absl::StatusOr<std::vector<MatrixPart>> Stacked(std::vector<const kernels::WeightView*> views) {
    std::vector<MatrixPart> parts;
    const TensorType dt = DeviceMatrixType(views[0]->type);
    int64_t offset = 0;
    if (!StacksAsOne(views)) {
      for (const auto* v : views) {
        TANDEM_ASSIGN_OR_RETURN(kc::DeviceMatrix m, Matrix(*v, DeviceMatrixType(v->type)));
        parts.push_back({m, offset});
        offset += v->rows;
      }
      return parts;
    }
    const int64_t row_bytes = RowBytesOf(dt, views[0]->cols);
    if (row_bytes < 0) return absl::InvalidArgumentError("cuda: matrix cols not block aligned");
    int64_t rows = 0;
    for (const auto* v : views) rows += v->rows;
    TANDEM_ASSIGN_OR_RETURN(DevicePtr staged, Staging(rows * row_bytes));
    for (const auto* v : views) {
      TANDEM_RETURN_IF_ERROR(
          UploadTo(*v, dt, static_cast<char*>(staged.get()) + offset * row_bytes));
      offset += v->rows;
    }
    // (Not staged.get() in the call that moves staged: arguments are
    // evaluated in any order.)
    const kc::DeviceMatrix gguf_layout{dt, staged.get(), rows, views[0]->cols, row_bytes};
    TANDEM_ASSIGN_OR_RETURN(kc::DeviceMatrix m, Planar(gguf_layout, std::move(staged)));
    parts.push_back({m, 0});
    return parts;
  }

  absl::StatusOr<float*> Vector(const std::vector<float>& v) {
    if (v.empty()) return nullptr;
    TANDEM_ASSIGN_OR_RETURN(void* p, Alloc(int64_t(v.size() * sizeof(float))));
    TANDEM_RETURN_IF_ERROR(kc::CopyToDevice(p, v.data(), v.size() * sizeof(float), stream_));
    return static_cast<float*>(p);
  }

 private:
  DeviceWeights* w_;
  kc::Stream stream_;
};

}  // namespace

TensorType DeviceMatrixType(TensorType stored) {
  return kc::IsMatrixType(stored) ? stored : TensorType::kBF16;
}

TensorType DeviceTableType(TensorType stored) {
  return kc::IsTableType(stored) ? stored : TensorType::kBF16;
}

bool StacksAsOne(const std::vector<const kernels::WeightView*>& parts) {
  for (const auto* v : parts) {
    if (DeviceMatrixType(v->type) != DeviceMatrixType(parts[0]->type) ||
        v->cols != parts[0]->cols) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<DeviceWeights> UploadWeights(const LlamaModel& model, kc::Stream stream) {
  const ModelWeights& mw = model.weights();
  DeviceWeights w;
  Uploader up(&w, stream);
  const kernels::WeightView& embd = mw.token_embd;
  TANDEM_ASSIGN_OR_RETURN(w.token_embd, up.Table(embd, DeviceTableType(embd.type)));
  // Its own copy also when tied: the table is read in GGUF layout, the LM
  // head's matrix product in the planar one.
  TANDEM_ASSIGN_OR_RETURN(w.lm_head, up.Matrix(mw.lm_head, DeviceMatrixType(mw.lm_head.type)));
  TANDEM_ASSIGN_OR_RETURN(w.output_norm, up.Vector(mw.output_norm));
  TANDEM_ASSIGN_OR_RETURN(w.rope_freqs, up.Vector(mw.rope_freqs));
  for (const LayerWeights& l : mw.layers) {
    DeviceLayer d;
    TANDEM_ASSIGN_OR_RETURN(d.qkv, up.Stacked({&l.wq, &l.wk, &l.wv}));
    TANDEM_ASSIGN_OR_RETURN(d.gate_up, up.Stacked({&l.w_gate, &l.w_up}));
    TANDEM_ASSIGN_OR_RETURN(d.wo, up.Matrix(l.wo, DeviceMatrixType(l.wo.type)));
    TANDEM_ASSIGN_OR_RETURN(d.down, up.Matrix(l.w_down, DeviceMatrixType(l.w_down.type)));
    TANDEM_ASSIGN_OR_RETURN(d.attn_norm, up.Vector(l.attn_norm));
    TANDEM_ASSIGN_OR_RETURN(d.ffn_norm, up.Vector(l.ffn_norm));
    if (!l.bq.empty()) {
      std::vector<float> bias(l.bq);
      bias.insert(bias.end(), l.bk.begin(), l.bk.end());
      bias.insert(bias.end(), l.bv.begin(), l.bv.end());
      TANDEM_ASSIGN_OR_RETURN(d.qkv_bias, up.Vector(bias));
    }
    w.layers.push_back(std::move(d));
  }
  TANDEM_RETURN_IF_ERROR(kc::StreamSync(stream));
  return w;
}

absl::StatusOr<DeviceWeights> SyntheticWeights(const ModelConfig& c, TensorType type, uint64_t seed,
                                               kc::Stream stream) {
  if (!kc::IsMatrixType(type)) {
    return absl::InvalidArgumentError("synthetic model: matrix type must be Q4_0/Q4_1/Q8_0/BF16");
  }
  DeviceWeights w;
  Uploader up(&w, stream);
  // Random GGUF-layout matrices, planar for the matrix products (not the
  // embedding table).
  auto make = [&](int64_t rows, int64_t cols, float scale,
                  bool table = false) -> absl::StatusOr<kc::DeviceMatrix> {
    kc::DeviceMatrix m{type, nullptr, rows, cols, RowBytesOf(type, cols)};
    if (m.row_bytes < 0) return absl::InvalidArgumentError("synthetic model: cols % 32 != 0");
    TANDEM_ASSIGN_OR_RETURN(DevicePtr staged, up.Staging(rows * m.row_bytes));
    m.data = staged.get();
    TANDEM_RETURN_IF_ERROR(kc::FillRandom(m, scale, seed++, stream));
    w.max_cols = std::max(w.max_cols, cols);
    ++w.device_types[TypeName(type) + " (random)"];
    if (!table) return up.Planar(m, std::move(staged));
    TANDEM_RETURN_IF_ERROR(kc::StreamSync(stream));
    w.bytes += rows * m.row_bytes;
    w.owned.push_back(std::move(staged));
    return m;
  };
  auto ones = [&](int64_t n) -> absl::StatusOr<float*> {
    TANDEM_ASSIGN_OR_RETURN(void* p, up.Alloc(n * int64_t(sizeof(float))));
    TANDEM_RETURN_IF_ERROR(kc::FillConstant(static_cast<float*>(p), n, 1.f, stream));
    return static_cast<float*>(p);
  };
  const float s_hidden = std::sqrt(3.f / float(c.hidden_size));
  TANDEM_ASSIGN_OR_RETURN(w.token_embd, make(c.vocab_size, c.hidden_size, 1.f, /*table=*/true));
  TANDEM_ASSIGN_OR_RETURN(w.lm_head, make(c.vocab_size, c.hidden_size, s_hidden));
  TANDEM_ASSIGN_OR_RETURN(w.output_norm, ones(c.hidden_size));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    DeviceLayer d;
    TANDEM_ASSIGN_OR_RETURN(kc::DeviceMatrix qkv,
                            make(c.q_dim() + 2 * c.kv_dim(), c.hidden_size, s_hidden));
    d.qkv.push_back({qkv, 0});
    TANDEM_ASSIGN_OR_RETURN(kc::DeviceMatrix gu, make(2 * c.ffn_size, c.hidden_size, s_hidden));
    d.gate_up.push_back({gu, 0});
    TANDEM_ASSIGN_OR_RETURN(d.wo, make(c.hidden_size, c.q_dim(), std::sqrt(3.f / c.q_dim())));
    TANDEM_ASSIGN_OR_RETURN(d.down, make(c.hidden_size, c.ffn_size, std::sqrt(3.f / c.ffn_size)));
    TANDEM_ASSIGN_OR_RETURN(d.attn_norm, ones(c.hidden_size));
    TANDEM_ASSIGN_OR_RETURN(d.ffn_norm, ones(c.hidden_size));
    w.layers.push_back(std::move(d));
  }
  TANDEM_RETURN_IF_ERROR(kc::StreamSync(stream));
  return w;
}

}  // namespace tandem::engine::cuda
