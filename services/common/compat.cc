#include "services/common/compat.h"

#include <string_view>

#include "absl/strings/str_cat.h"

namespace tandem::services {
namespace {

class Fnv {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 1099511628211ull;
    }
  }
  void Str(std::string_view s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  void U64(uint64_t v) { Bytes(&v, sizeof(v)); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

absl::Status Mismatch(const std::string& field, const std::string& mine, const std::string& peer) {
  return absl::FailedPreconditionError(
      absl::StrCat("kv compat mismatch: ", field, " is ", peer, ", this worker has ", mine));
}
template <typename T>
absl::Status Mismatch(const std::string& field, const T& mine, const T& peer) {
  return Mismatch(field, absl::StrCat(mine), absl::StrCat(peer));
}

}  // namespace

uint64_t ModelFingerprint(const gguf::GgufFile& file) {
  Fnv h;
  h.U64(file.version());
  h.U64(file.file_size());
  h.U64(file.metadata().size());
  for (const auto& [key, value] : file.metadata()) {
    h.Str(key);
    if (auto s = file.GetString(key); s.ok()) h.Str(*s);
    if (auto i = file.GetInt(key); i.ok()) h.U64(static_cast<uint64_t>(*i));
  }
  h.U64(file.tensors().size());
  for (const gguf::TensorInfo& t : file.tensors()) {
    h.Str(t.name);
    h.U64(t.shape.size());
    for (int64_t d : t.shape) h.U64(static_cast<uint64_t>(d));
    h.U64(static_cast<uint64_t>(t.type));
    h.U64(t.offset);
    h.U64(t.num_bytes);
  }
  return h.value();
}

uint64_t CompatHash(const tandem::v1::KvCompatibility& c) {
  Fnv h;
  h.Str(c.model_name());
  h.U64(c.model_fingerprint());
  h.Str(c.kv_dtype());
  h.U64(static_cast<uint64_t>(c.block_size()));
  h.U64(static_cast<uint64_t>(c.num_layers()));
  h.U64(static_cast<uint64_t>(c.num_kv_heads()));
  h.U64(static_cast<uint64_t>(c.head_dim()));
  return h.value();
}

tandem::v1::KvCompatibility MakeCompat(const gguf::GgufFile& file, const engine::LlamaModel& model,
                                       const std::string& model_name, int32_t block_size,
                                       engine::KvDtype kv_dtype) {
  tandem::v1::KvCompatibility c;
  c.set_model_name(model_name);
  c.set_model_fingerprint(ModelFingerprint(file));
  c.set_kv_dtype(kernels::KvDtypeName(kv_dtype));
  c.set_block_size(block_size);
  c.set_num_layers(static_cast<int32_t>(model.config().num_layers));
  c.set_num_kv_heads(static_cast<int32_t>(model.config().num_kv_heads));
  c.set_head_dim(static_cast<int32_t>(model.config().head_dim));
  c.set_hash(CompatHash(c));
  return c;
}

absl::Status CheckCompat(const tandem::v1::KvCompatibility& ours,
                         const tandem::v1::KvCompatibility& theirs) {
  // Every field is compared even when the hashes agree (a hash collision,
  // or a peer that sends a matching hash with other fields, is refused).
  if (ours.model_name() != theirs.model_name()) {
    return Mismatch("compat.model_name", ours.model_name(), theirs.model_name());
  }
  if (ours.model_fingerprint() != theirs.model_fingerprint()) {
    return Mismatch("compat.model_fingerprint", ours.model_fingerprint(),
                    theirs.model_fingerprint());
  }
  if (ours.kv_dtype() != theirs.kv_dtype()) {
    return Mismatch("compat.kv_dtype", ours.kv_dtype(), theirs.kv_dtype());
  }
  if (ours.block_size() != theirs.block_size()) {
    return Mismatch("compat.block_size", ours.block_size(), theirs.block_size());
  }
  if (ours.num_layers() != theirs.num_layers()) {
    return Mismatch("compat.num_layers", ours.num_layers(), theirs.num_layers());
  }
  if (ours.num_kv_heads() != theirs.num_kv_heads()) {
    return Mismatch("compat.num_kv_heads", ours.num_kv_heads(), theirs.num_kv_heads());
  }
  if (ours.head_dim() != theirs.head_dim()) {
    return Mismatch("compat.head_dim", ours.head_dim(), theirs.head_dim());
  }
  if (theirs.hash() != ours.hash()) return Mismatch("compat.hash", ours.hash(), theirs.hash());
  if (CompatHash(theirs) != theirs.hash()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv compat mismatch: compat.hash ", theirs.hash(),
                     " is not the hash of the peer's own fields (", CompatHash(theirs), ")"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::services
