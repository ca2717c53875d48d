// Fuzzes the `tandem perplexity --kl-divergence-base` reader
// (services/cli/kld_base.h): any file opens and yields every record it
// declares, or fails with an InvalidArgument naming the file; never a crash,
// an unbounded allocation or a record that breaks the header's promises.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "services/cli/kld_base.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kld_base_fuzz_" + std::to_string(getpid()) + ".kld";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto reader = tandem::cli::KldBaseReader::Open(path);
  if (!reader.ok()) {
    if (reader.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    if (reader.status().message().find(path) == std::string::npos) __builtin_trap();
    return 0;
  }
  const tandem::cli::KldBaseHeader& h = (*reader)->header();
  const uint64_t records = uint64_t{h.n_chunks} * h.scored_per_chunk;
  // Open checked the size, so the records are all in the (small) input.
  if (h.HeaderBytes() + records * h.RecordBytes() != size) __builtin_trap();
  tandem::cli::KldBaseRecord rec;
  for (uint64_t i = 0; i < records; ++i) {
    absl::Status s = (*reader)->Next(&rec);
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
      return 0;
    }
    if (rec.top.size() != h.top_k || !std::isfinite(rec.nll) || rec.nll < 0) __builtin_trap();
    for (const auto& e : rec.top) {
      if (e.id < 0 || static_cast<uint32_t>(e.id) >= h.n_vocab || e.logprob > 0) __builtin_trap();
    }
  }
  if ((*reader)->Next(&rec).ok()) __builtin_trap();
  return 0;
}
