// The `tandem perplexity --kl-divergence-base` file: a reference run's
// top-K log-probabilities for every scored token, so a later run (another
// quantization, KV dtype or kernel mode) can be compared with it
// (docs/perplexity.md, "Base file format").
//
// Layout (little-endian), version 1:
//   header  "TNDMKLDB" | u32 version | u32 header_bytes (of the whole header)
//           | u64 model_fingerprint | u64 vocab_fingerprint | u64 tokens_hash
//           | u32 n_vocab | u32 n_ctx | u32 n_chunks | u32 scored_per_chunk
//           | u32 top_k | u32 name_len | name bytes (the base model's path, <= 4096)
//   records n_chunks * scored_per_chunk of:
//           f32 nll (of the token that followed) | top_k x (u32 id, f32 logprob)
//           (log-prob descending, then id ascending)
// The file size must be exactly header + records: a truncated file or one
// with trailing bytes is refused before any record is read. Every record is
// checked as it is read (ids in vocab, log-probs finite, <= 0 and sorted,
// mass <= 1, NLL finite and >= 0), so a corrupted file is a clear error,
// never a crash.
#ifndef TANDEM_SERVICES_CLI_KLD_BASE_H_
#define TANDEM_SERVICES_CLI_KLD_BASE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/cli/perplexity_stats.h"

namespace tandem::cli {

inline constexpr char kKldBaseMagic[8] = {'T', 'N', 'D', 'M', 'K', 'L', 'D', 'B'};
inline constexpr uint32_t kKldBaseVersion = 1;
inline constexpr uint32_t kKldBaseMaxName = 4096;

struct KldBaseHeader {
  uint64_t model_fingerprint = 0;  // services/common/compat.h ModelFingerprint (informational)
  uint64_t vocab_fingerprint = 0;  // must match: same tokenizer
  uint64_t tokens_hash = 0;        // must match: same text, same chunks
  uint32_t n_vocab = 0;
  uint32_t n_ctx = 0;
  uint32_t n_chunks = 0;
  uint32_t scored_per_chunk = 0;
  uint32_t top_k = 0;
  std::string model_name;

  // Bytes of one token record / of the whole file.
  uint64_t RecordBytes() const { return 4 + 8 * uint64_t{top_k}; }
  uint64_t HeaderBytes() const { return 8 + 4 + 4 + 3 * 8 + 6 * 4 + model_name.size(); }
};

// One scored token of the base run.
struct KldBaseRecord {
  float nll = 0;
  std::vector<TopEntry> top;  // [top_k]
};

// FNV-1a 64 helpers for the header's fingerprints.
uint64_t HashTokens(absl::Span<const int32_t> tokens);
uint64_t HashVocab(absl::Span<const std::string> tokens);

class KldBaseWriter {
 public:
  static absl::StatusOr<std::unique_ptr<KldBaseWriter>> Create(const std::string& path,
                                                               const KldBaseHeader& header);
  ~KldBaseWriter();
  // record.top must hold exactly header.top_k entries.
  absl::Status Append(const KldBaseRecord& record);
  // Records go to `path`.partial; Finish flushes, closes and renames it to
  // `path`. FailedPrecondition (and the partial file removed) unless every
  // record was written; a writer destroyed unfinished removes it too.
  absl::Status Finish();
  const KldBaseHeader& header() const { return header_; }

 private:
  KldBaseWriter(std::FILE* f, std::string path, KldBaseHeader header)
      : f_(f), path_(std::move(path)), header_(std::move(header)) {}
  std::FILE* f_;
  std::string path_;
  KldBaseHeader header_;
  uint64_t written_ = 0;
  std::vector<char> buf_;
};

class KldBaseReader {
 public:
  // Reads and validates the header and the file size.
  static absl::StatusOr<std::unique_ptr<KldBaseReader>> Open(const std::string& path);
  ~KldBaseReader();
  const KldBaseHeader& header() const { return header_; }
  // The next record, validated against the header.
  absl::Status Next(KldBaseRecord* record);

 private:
  KldBaseReader(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
  KldBaseHeader header_;
  uint64_t read_ = 0;
  std::vector<char> buf_;
};

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_KLD_BASE_H_
