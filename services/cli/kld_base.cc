#include "services/cli/kld_base.h"

#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem::cli {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the KLD base file is little-endian; add byte swaps for this host");

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

template <typename T>
void Put(std::vector<char>* buf, T v) {
  const size_t at = buf->size();
  buf->resize(at + sizeof(T));
  std::memcpy(buf->data() + at, &v, sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Upper bounds that keep every size computation far from overflow.
constexpr uint32_t kMaxVocab = 1u << 24;
constexpr uint32_t kMaxCtx = 1u << 20;
constexpr uint32_t kMaxChunks = 1u << 24;
constexpr uint64_t kFixedHeaderBytes = 8 + 4 + 4 + 3 * 8 + 6 * 4;

absl::Status CheckHeader(const KldBaseHeader& h, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a usable KLD base file: %s", where, what));
  };
  if (h.n_vocab == 0 || h.n_vocab > kMaxVocab) return bad("vocab size out of range");
  if (h.n_ctx < 4 || h.n_ctx > kMaxCtx) return bad("n_ctx out of range");
  if (h.n_chunks == 0 || h.n_chunks > kMaxChunks) return bad("chunk count out of range");
  if (h.scored_per_chunk == 0 || h.scored_per_chunk >= h.n_ctx) {
    return bad("scored tokens per chunk out of range");
  }
  if (h.top_k == 0 || h.top_k > h.n_vocab) return bad("top_k out of range");
  if (h.model_name.size() > kKldBaseMaxName) return bad("model name too long");
  return absl::OkStatus();
}

}  // namespace

uint64_t HashTokens(absl::Span<const int32_t> tokens) {
  uint64_t h = kFnvOffset;
  for (int32_t t : tokens) h = Fnv(h, &t, sizeof(t));
  return h;
}

uint64_t HashVocab(absl::Span<const std::string> tokens) {
  uint64_t h = kFnvOffset;
  const uint64_t n = tokens.size();
  h = Fnv(h, &n, sizeof(n));
  for (const std::string& t : tokens) {
    const uint64_t len = t.size();
    h = Fnv(h, &len, sizeof(len));
    h = Fnv(h, t.data(), t.size());
  }
  return h;
}

// ---------------------------------------------------------------- writer

absl::StatusOr<std::unique_ptr<KldBaseWriter>> KldBaseWriter::Create(const std::string& path,
                                                                     const KldBaseHeader& header) {
  if (absl::Status s = CheckHeader(header, path); !s.ok()) return s;
  // Written to PATH.partial and renamed by Finish, so an interrupted or
  // failed run never leaves a file that looks complete.
  std::FILE* f = std::fopen((path + ".partial").c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot write %s.partial: %s", path, std::strerror(errno)));
  }
  std::unique_ptr<KldBaseWriter> w(new KldBaseWriter(f, path, header));
  std::vector<char> buf(kKldBaseMagic, kKldBaseMagic + 8);
  Put<uint32_t>(&buf, kKldBaseVersion);
  Put<uint32_t>(&buf, static_cast<uint32_t>(header.HeaderBytes()));
  Put<uint64_t>(&buf, header.model_fingerprint);
  Put<uint64_t>(&buf, header.vocab_fingerprint);
  Put<uint64_t>(&buf, header.tokens_hash);
  Put<uint32_t>(&buf, header.n_vocab);
  Put<uint32_t>(&buf, header.n_ctx);
  Put<uint32_t>(&buf, header.n_chunks);
  Put<uint32_t>(&buf, header.scored_per_chunk);
  Put<uint32_t>(&buf, header.top_k);
  Put<uint32_t>(&buf, static_cast<uint32_t>(header.model_name.size()));
  buf.insert(buf.end(), header.model_name.begin(), header.model_name.end());
  if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size()) {
    return absl::InternalError(absl::StrFormat("cannot write %s: %s", path, std::strerror(errno)));
  }
  return w;
}

KldBaseWriter::~KldBaseWriter() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::remove((path_ + ".partial").c_str());
  }
}

absl::Status KldBaseWriter::Append(const KldBaseRecord& record) {
  if (f_ == nullptr) return absl::FailedPreconditionError("KLD base writer is closed");
  if (record.top.size() != header_.top_k) {
    return absl::InvalidArgumentError("KLD base record has the wrong number of entries");
  }
  buf_.clear();
  Put<float>(&buf_, record.nll);
  for (const TopEntry& e : record.top) {
    Put<uint32_t>(&buf_, static_cast<uint32_t>(e.id));
    Put<float>(&buf_, e.logprob);
  }
  if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
    return absl::InternalError(absl::StrFormat("cannot write %s: %s", path_, std::strerror(errno)));
  }
  ++written_;
  return absl::OkStatus();
}

absl::Status KldBaseWriter::Finish() {
  if (f_ == nullptr) return absl::FailedPreconditionError("KLD base writer is closed");
  const uint64_t want = uint64_t{header_.n_chunks} * header_.scored_per_chunk;
  const bool flushed = std::fflush(f_) == 0;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!flushed || !closed) {
    return absl::InternalError(absl::StrFormat("cannot write %s: %s", path_, std::strerror(errno)));
  }
  const std::string partial = path_ + ".partial";
  if (written_ != want) {
    std::remove(partial.c_str());
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: wrote %d of %d token records; the file is incomplete", path_, written_, want));
  }
  if (std::rename(partial.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot rename %s to %s: %s", partial, path_, std::strerror(errno)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- reader

absl::StatusOr<std::unique_ptr<KldBaseReader>> KldBaseReader::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot open KLD base %s: %s", path, std::strerror(errno)));
  }
  std::unique_ptr<KldBaseReader> r(new KldBaseReader(f, path));
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a usable KLD base file: %s", path, what));
  };
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) return bad("not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  char fixed[kFixedHeaderBytes];
  if (file_size < kFixedHeaderBytes || std::fread(fixed, 1, sizeof(fixed), f) != sizeof(fixed)) {
    return bad("shorter than the header (truncated?)");
  }
  if (std::memcmp(fixed, kKldBaseMagic, 8) != 0) return bad("wrong magic (not a KLD base)");
  const uint32_t version = Get<uint32_t>(fixed + 8);
  if (version != kKldBaseVersion) {
    return bad(
        absl::StrFormat("version %d, this build reads version %d", version, kKldBaseVersion));
  }
  const uint32_t header_bytes = Get<uint32_t>(fixed + 12);
  KldBaseHeader& h = r->header_;
  h.model_fingerprint = Get<uint64_t>(fixed + 16);
  h.vocab_fingerprint = Get<uint64_t>(fixed + 24);
  h.tokens_hash = Get<uint64_t>(fixed + 32);
  h.n_vocab = Get<uint32_t>(fixed + 40);
  h.n_ctx = Get<uint32_t>(fixed + 44);
  h.n_chunks = Get<uint32_t>(fixed + 48);
  h.scored_per_chunk = Get<uint32_t>(fixed + 52);
  h.top_k = Get<uint32_t>(fixed + 56);
  const uint32_t name_len = Get<uint32_t>(fixed + 60);
  if (name_len > kKldBaseMaxName) return bad("model name too long");
  if (header_bytes != kFixedHeaderBytes + name_len) return bad("header size mismatch");
  if (file_size < header_bytes) return bad("shorter than the header (truncated?)");
  h.model_name.resize(name_len);
  if (name_len > 0 && std::fread(h.model_name.data(), 1, name_len, f) != name_len) {
    return bad("shorter than the header (truncated?)");
  }
  if (absl::Status s = CheckHeader(h, path); !s.ok()) return s;
  // Bounded above: 2^24 chunks x 2^20 tokens x (4 + 8 x 2^24) bytes < 2^92
  // would overflow, so check in two steps against the actual size.
  const uint64_t records = uint64_t{h.n_chunks} * h.scored_per_chunk;  // < 2^44
  const uint64_t payload = file_size - header_bytes;
  if (payload % h.RecordBytes() != 0 || payload / h.RecordBytes() != records) {
    const bool short_file = payload / h.RecordBytes() < records;
    return bad(absl::StrFormat("%s: %d bytes of records for %d chunks x %d tokens x %d bytes",
                               short_file ? "truncated" : "trailing bytes", payload, h.n_chunks,
                               h.scored_per_chunk, h.RecordBytes()));
  }
  return r;
}

KldBaseReader::~KldBaseReader() {
  if (f_ != nullptr) std::fclose(f_);
}

absl::Status KldBaseReader::Next(KldBaseRecord* record) {
  const uint64_t total = uint64_t{header_.n_chunks} * header_.scored_per_chunk;
  const uint64_t index = read_;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: corrupted KLD base: record %d (chunk %d, token %d): %s", path_, index,
        index / header_.scored_per_chunk + 1, index % header_.scored_per_chunk, what));
  };
  if (read_ >= total) return absl::OutOfRangeError(path_ + ": no more records in the KLD base");
  buf_.resize(header_.RecordBytes());
  if (std::fread(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
    return bad("unexpected end of file");
  }
  ++read_;
  record->nll = Get<float>(buf_.data());
  if (!std::isfinite(record->nll) || record->nll < 0) return bad("NLL not finite or negative");
  record->top.resize(header_.top_k);
  double mass = 0;
  for (uint32_t i = 0; i < header_.top_k; ++i) {
    const char* p = buf_.data() + 4 + 8 * uint64_t{i};
    const uint32_t id = Get<uint32_t>(p);
    const float lp = Get<float>(p + 4);
    if (id >= header_.n_vocab) return bad(absl::StrFormat("token id %d outside vocab", id));
    if (!std::isfinite(lp) || lp > 1e-4f) return bad("log-prob not finite or above 0");
    if (i > 0 && lp > record->top[i - 1].logprob) return bad("log-probs not sorted");
    record->top[i] = {static_cast<int32_t>(id), std::min(lp, 0.0f)};
    mass += std::exp(static_cast<double>(record->top[i].logprob));
  }
  if (mass > 1.0 + 1e-3) return bad("probabilities sum above 1");
  return absl::OkStatus();
}

}  // namespace tandem::cli
