#include "services/transfer/kv_block_packing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::transfer {

absl::StatusOr<KvBlockLayout> MakeKvBlockLayout(int64_t num_tokens, int64_t bytes_per_token,
                                                int64_t block_size, int64_t num_layers) {
  if (num_tokens < 1)
    return absl::InvalidArgumentError(absl::StrCat("num_tokens ", num_tokens, " < 1"));
  if (block_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("block_size ", block_size, " < 1"));
  if (num_layers < 1)
    return absl::InvalidArgumentError(absl::StrCat("num_layers ", num_layers, " < 1"));
  if (bytes_per_token < 1 || bytes_per_token % (2 * num_layers) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes_per_token ", bytes_per_token, " is not a positive multiple of 2 x num_layers"));
  }
  KvBlockLayout l;
  l.num_tokens = num_tokens;
  l.bytes_per_token = bytes_per_token;
  l.block_size = block_size;
  l.num_layers = num_layers;
  l.row_bytes = bytes_per_token / (2 * num_layers);
  // Overflow-safe bounds before multiplying.
  if (block_size > kMaxStagingBytes / bytes_per_token ||
      num_tokens > kMaxStagingBytes / bytes_per_token) {
    return absl::InvalidArgumentError("KV staging buffer would exceed 64 GiB");
  }
  l.block_bytes = block_size * bytes_per_token;
  l.num_blocks = (num_tokens + block_size - 1) / block_size;
  if (l.num_blocks > kMaxStagingBytes / l.block_bytes) {
    return absl::InvalidArgumentError("KV staging buffer would exceed 64 GiB");
  }
  return l;
}

void PackKvBlocks(const KvBlockLayout& l, const char* src, char* dst) {
  const int64_t rows_per_token = 2 * l.num_layers;
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    char* block = dst + b * l.block_bytes;
    const int64_t first = b * l.block_size;
    const int64_t n = std::min(l.block_size, l.num_tokens - first);
    for (int64_t r = 0; r < rows_per_token; ++r) {  // r = layer * 2 + (K|V)
      char* out = block + r * l.block_size * l.row_bytes;
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(out + j * l.row_bytes, src + (first + j) * l.bytes_per_token + r * l.row_bytes,
                    l.row_bytes);
      }
      if (n < l.block_size) std::memset(out + n * l.row_bytes, 0, (l.block_size - n) * l.row_bytes);
    }
  }
}

void UnpackKvBlocks(const KvBlockLayout& l, const char* src, char* dst) {
  const int64_t rows_per_token = 2 * l.num_layers;
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    const char* block = src + b * l.block_bytes;
    const int64_t first = b * l.block_size;
    const int64_t n = std::min(l.block_size, l.num_tokens - first);
    for (int64_t r = 0; r < rows_per_token; ++r) {
      const char* in = block + r * l.block_size * l.row_bytes;
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(dst + (first + j) * l.bytes_per_token + r * l.row_bytes, in + j * l.row_bytes,
                    l.row_bytes);
      }
    }
  }
}

int32_t BlocksPerSegment(const KvBlockLayout& l, int64_t max_segment_bytes) {
  const int64_t cap = std::min(max_segment_bytes, kMaxSegmentBytes);
  const int64_t n = std::clamp<int64_t>(cap / l.block_bytes, 1, l.num_blocks);
  return static_cast<int32_t>(n);
}

absl::Status CheckBlocksPerSegment(const KvBlockLayout& l, int64_t blocks_per_segment) {
  if (blocks_per_segment < 1 || blocks_per_segment > l.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("blocks_per_segment ", blocks_per_segment,
                                                   " outside [1, ", l.num_blocks, "]"));
  }
  if (blocks_per_segment > 1 && blocks_per_segment * l.block_bytes > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks_per_segment ", blocks_per_segment, " makes a segment over 1 GiB"));
  }
  return absl::OkStatus();
}

std::vector<KvSegment> KvSegments(const KvBlockLayout& l, int64_t blocks_per_segment) {
  std::vector<KvSegment> out;
  for (int64_t b = 0; b < l.num_blocks; b += blocks_per_segment) {
    const int64_t n = std::min(blocks_per_segment, l.num_blocks - b);
    out.push_back({b * l.block_bytes, n * l.block_bytes});
  }
  return out;
}

}  // namespace tandem::transfer
