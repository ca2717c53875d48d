// Fuzzes the GGUF parser: any byte string must give a status or a file whose
// metadata and tensor ranges can be walked safely.
// Seeds: tests/fuzz/corpus/gguf (tools/make_gguf_seeds.py).
#include <cstdint>
#include <string>

#include "common/gguf/gguf.h"

namespace {

using tandem::gguf::Value;

// Visits every value through the typed accessors; returns a checksum so the
// work is not optimized away.
uint64_t Walk(const Value& v) {
  uint64_t h = static_cast<uint64_t>(v.type);
  if (auto i = v.AsInt(); i.ok()) h += static_cast<uint64_t>(*i);
  if (auto u = v.AsUint(); u.ok()) h += *u;
  if (auto f = v.AsFloat(); f.ok()) h += static_cast<uint64_t>(*f != *f);
  if (auto b = v.AsBool(); b.ok()) h += *b;
  if (auto s = v.AsString(); s.ok()) h += s->size() + (s->empty() ? 0 : (*s)[0]);
  if (auto a = v.AsArray(); a.ok()) {
    for (const Value& e : **a) h = h * 31 + Walk(e);
  }
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file =
      tandem::gguf::GgufFile::FromBuffer(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const tandem::gguf::GgufFile& f = **file;
  volatile uint64_t sink = 0;
  for (const auto& [key, value] : f.metadata()) {
    sink = sink + Walk(value) + key.size();
    if (f.Find(key) == nullptr) __builtin_trap();
  }
  (void)f.GetIntOr("llama.block_count", 0);
  (void)f.GetString("general.architecture");
  for (const auto& t : f.tensors()) {
    if (f.FindTensor(t.name) == nullptr) __builtin_trap();
    // The reader promises data = image start + data_offset + offset, inside the image.
    if (f.data_offset() + t.offset + t.num_bytes > f.file_size()) __builtin_trap();
    if (!tandem::gguf::GetTypeTraits(t.type).ok()) __builtin_trap();
    sink = sink + t.data[0] + t.data[t.num_bytes - 1];
  }
  f.Prefault(nullptr);
  return 0;
}
