// Block packing for the NCCL KV transport: the KvExport payload (token-major,
// engine/kv_export.h: [token][layer][K|V][row]) laid out in the staging
// buffer as whole KV blocks, each in the paged cache's own block layout:
//
//   staging = [num_blocks][num_layers][K|V][block_size][row]
//   row     = num_kv_heads * head_dim * dtype bytes = bytes_per_token / (2 * num_layers)
//
// so block b is one contiguous chunk of block_bytes = block_size *
// bytes_per_token bytes at offset b * block_bytes, which a receiver can place
// straight into one slot of a paged cache (the unit a grouped ncclRecv of
// scattered blocks writes). The last block is padded with zeros when
// num_tokens is not a multiple of block_size. Both sides derive the layout
// from the validated KvTransferHeader only (num_tokens, bytes_per_token) and
// the checked KvCompatibility (block_size, num_layers).
//
// Segments: the blocks are sent as ranges of `blocks_per_segment` whole
// blocks (the last range may be shorter), one ncclSend / ncclRecv each.
//
// Thread safety: pure functions.
#ifndef TANDEM_SERVICES_TRANSFER_KV_BLOCK_PACKING_H_
#define TANDEM_SERVICES_TRANSFER_KV_BLOCK_PACKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::transfer {

// The largest staging buffer (and segment) either side accepts.
inline constexpr int64_t kMaxStagingBytes = int64_t{64} << 30;  // 64 GiB
inline constexpr int64_t kMaxSegmentBytes = int64_t{1} << 30;   // 1 GiB

struct KvBlockLayout {
  int64_t num_tokens = 0;
  int64_t bytes_per_token = 0;
  int64_t block_size = 0;
  int64_t num_layers = 0;
  int64_t row_bytes = 0;    // bytes_per_token / (2 * num_layers)
  int64_t block_bytes = 0;  // block_size * bytes_per_token
  int64_t num_blocks = 0;   // ceil(num_tokens / block_size)

  int64_t payload_bytes() const { return num_tokens * bytes_per_token; }
  int64_t staging_bytes() const { return num_blocks * block_bytes; }
};

// InvalidArgument naming the field when a value is < 1, bytes_per_token is
// not a multiple of 2 * num_layers, or the staging buffer would exceed
// kMaxStagingBytes.
absl::StatusOr<KvBlockLayout> MakeKvBlockLayout(int64_t num_tokens, int64_t bytes_per_token,
                                                int64_t block_size, int64_t num_layers);

// src: payload_bytes() bytes (KvExport layout) -> dst: staging_bytes() bytes.
void PackKvBlocks(const KvBlockLayout& layout, const char* src, char* dst);
// src: staging_bytes() bytes -> dst: payload_bytes() bytes (padding dropped).
void UnpackKvBlocks(const KvBlockLayout& layout, const char* src, char* dst);

struct KvSegment {
  int64_t offset = 0;  // bytes into the staging buffer
  int64_t bytes = 0;
};

// The most whole blocks per segment within max_segment_bytes (at least 1,
// at most num_blocks).
int32_t BlocksPerSegment(const KvBlockLayout& layout, int64_t max_segment_bytes);
// InvalidArgument unless blocks_per_segment is in [1, num_blocks] and a
// segment fits kMaxSegmentBytes (a peer's value is checked with this).
absl::Status CheckBlocksPerSegment(const KvBlockLayout& layout, int64_t blocks_per_segment);
// REQUIRES: CheckBlocksPerSegment ok.
std::vector<KvSegment> KvSegments(const KvBlockLayout& layout, int64_t blocks_per_segment);

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_BLOCK_PACKING_H_
