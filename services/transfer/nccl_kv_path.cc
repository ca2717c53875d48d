#include "services/transfer/nccl_kv_path.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::transfer {

NcclStaging::~NcclStaging() { Free(); }

void NcclStaging::Free() {
  if (host_ != nullptr) ops_->HostFree(host_);
  if (device_ != nullptr) ops_->DeviceFree(device_);
  host_ = nullptr;
  device_ = nullptr;
  capacity_ = 0;
}

absl::Status NcclStaging::Reserve(int64_t bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  Free();
  absl::StatusOr<void*> h = ops_->HostAlloc(bytes);
  if (!h.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("NCCL staging: pinned host buffer of ", bytes,
                                                     " bytes: ", h.status().message()));
  }
  host_ = static_cast<char*>(*h);
  absl::StatusOr<void*> d = ops_->DeviceAlloc(bytes);
  if (!d.ok()) {
    Free();
    return absl::ResourceExhaustedError(
        absl::StrCat("NCCL staging: device buffer of ", bytes, " bytes: ", d.status().message()));
  }
  device_ = *d;
  capacity_ = bytes;
  return absl::OkStatus();
}

absl::Status StageForSend(NcclOps& ops, const KvBlockLayout& layout, const char* payload,
                          NcclStaging& staging, NcclOps::Stream stream) {
  TANDEM_CHECK(staging.capacity() >= layout.staging_bytes());
  PackKvBlocks(layout, payload, staging.host());
  return ops.CopyToDevice(staging.device(), staging.host(), layout.staging_bytes(), stream);
}

absl::Status EnqueueSends(NcclOps& ops, NcclOps::Comm comm, int peer, const NcclStaging& staging,
                          const std::vector<KvSegment>& segments, NcclOps::Stream stream) {
  const char* base = static_cast<const char*>(staging.device());
  for (const KvSegment& s : segments) {
    TANDEM_RETURN_IF_ERROR(ops.Send(comm, base + s.offset, s.bytes, peer, stream));
  }
  return absl::OkStatus();
}

absl::Status EnqueueRecvs(NcclOps& ops, NcclOps::Comm comm, int peer, NcclStaging& staging,
                          const std::vector<KvSegment>& segments, NcclOps::Stream stream) {
  char* base = static_cast<char*>(staging.device());
  for (const KvSegment& s : segments) {
    TANDEM_RETURN_IF_ERROR(ops.Recv(comm, base + s.offset, s.bytes, peer, stream));
  }
  return absl::OkStatus();
}

absl::Status EnqueueDownload(NcclOps& ops, const KvBlockLayout& layout, NcclStaging& staging,
                             NcclOps::Stream stream) {
  return ops.CopyToHost(staging.host(), staging.device(), layout.staging_bytes(), stream);
}

namespace {

// GroupStart, body, GroupEnd; GroupEnd runs even when body fails (NCCL needs
// the group closed), the first error wins.
template <typename Body>
absl::Status Grouped(NcclOps& ops, NcclOps::Comm comm, absl::Time deadline, Body body) {
  TANDEM_RETURN_IF_ERROR(ops.GroupStart());
  absl::Status st = body();
  absl::Status end = ops.GroupEnd(comm, deadline);
  return st.ok() ? end : st;
}

}  // namespace

absl::Status WaitStreamInterruptible(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream,
                                     absl::Time deadline, const NcclInterrupt& interrupt) {
  if (!interrupt) return ops.WaitStream(comm, stream, deadline);
  while (true) {
    const absl::Time slice = std::min(deadline, absl::Now() + kNcclWaitSlice);
    absl::Status st = ops.WaitStream(comm, stream, slice);
    if (!absl::IsDeadlineExceeded(st) || absl::Now() >= deadline) return st;
    TANDEM_RETURN_IF_ERROR(interrupt());
  }
}

absl::Status SendKvBlocks(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                          const KvBlockLayout& layout, int64_t blocks_per_segment,
                          const char* payload, NcclStaging& staging, absl::Time deadline,
                          const NcclInterrupt& interrupt) {
  TANDEM_RETURN_IF_ERROR(staging.Reserve(layout.staging_bytes()));
  TANDEM_RETURN_IF_ERROR(StageForSend(ops, layout, payload, staging, stream));
  const std::vector<KvSegment> segments = KvSegments(layout, blocks_per_segment);
  TANDEM_RETURN_IF_ERROR(Grouped(ops, comm, deadline, [&] {
    return EnqueueSends(ops, comm, peer, staging, segments, stream);
  }));
  return WaitStreamInterruptible(ops, comm, stream, deadline, interrupt);
}

absl::Status PostRecvKvBlocks(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                              const KvBlockLayout& layout, int64_t blocks_per_segment,
                              NcclStaging& staging, absl::Time deadline) {
  TANDEM_RETURN_IF_ERROR(staging.Reserve(layout.staging_bytes()));
  const std::vector<KvSegment> segments = KvSegments(layout, blocks_per_segment);
  TANDEM_RETURN_IF_ERROR(Grouped(ops, comm, deadline, [&] {
    return EnqueueRecvs(ops, comm, peer, staging, segments, stream);
  }));
  return EnqueueDownload(ops, layout, staging, stream);
}

std::vector<TokenSegment> SplitTokenSegments(
    const std::vector<std::pair<const char*, int64_t>>& pieces, int64_t bytes_per_token,
    int64_t max_segment_bytes) {
  const int64_t max_tokens = std::max<int64_t>(1, max_segment_bytes / bytes_per_token);
  std::vector<TokenSegment> out;
  int64_t offset = 0;
  for (const auto& [data, bytes] : pieces) {
    for (int64_t t = 0, n = bytes / bytes_per_token; t < n; t += max_tokens) {
      TokenSegment s;
      s.tokens = std::min(max_tokens, n - t);
      s.bytes = s.tokens * bytes_per_token;
      s.data = data + t * bytes_per_token;
      s.offset = offset;
      offset += s.bytes;
      out.push_back(s);
    }
  }
  return out;
}

absl::StatusOr<std::vector<TokenSegment>> CheckTokenSegmentsWithin(absl::Span<const int64_t> tokens,
                                                                   int64_t max_tokens,
                                                                   int64_t bytes_per_token) {
  if (tokens.empty() || static_cast<int64_t>(tokens.size()) > kMaxTokenSegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_segments: ", tokens.size(), " segments, not 1 .. ", kMaxTokenSegments));
  }
  std::vector<TokenSegment> out;
  int64_t sum = 0;
  for (int64_t n : tokens) {
    if (n < 1 || n > max_tokens - sum || n * bytes_per_token > kMaxSegmentBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_segments: a segment of ", n, " tokens (", max_tokens - sum,
                       " left, at most ", kMaxSegmentBytes, " bytes each)"));
    }
    TokenSegment s;
    s.tokens = n;
    s.bytes = n * bytes_per_token;
    s.offset = sum * bytes_per_token;
    sum += n;
    out.push_back(s);
  }
  return out;
}

int64_t SegmentTokens(const std::vector<TokenSegment>& segments) {
  int64_t sum = 0;
  for (const TokenSegment& s : segments) sum += s.tokens;
  return sum;
}

absl::StatusOr<std::vector<TokenSegment>> CheckTokenSegments(absl::Span<const int64_t> tokens,
                                                             int64_t num_tokens,
                                                             int64_t bytes_per_token) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<TokenSegment> out,
                          CheckTokenSegmentsWithin(tokens, num_tokens, bytes_per_token));
  if (const int64_t sum = SegmentTokens(out); sum != num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_segments sum to ", sum, " tokens, the header has ", num_tokens));
  }
  return out;
}

absl::Status SendTokenSegments(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                               const std::vector<TokenSegment>& segments, absl::Time deadline,
                               const NcclInterrupt& interrupt) {
  TANDEM_RETURN_IF_ERROR(Grouped(ops, comm, deadline, [&]() -> absl::Status {
    for (const TokenSegment& s : segments) {
      TANDEM_RETURN_IF_ERROR(ops.Send(comm, s.data, s.bytes, peer, stream));
    }
    return absl::OkStatus();
  }));
  return WaitStreamInterruptible(ops, comm, stream, deadline, interrupt);
}

absl::Status PostRecvTokenSegments(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream,
                                   int peer, char* base, const std::vector<TokenSegment>& segments,
                                   absl::Time deadline) {
  return Grouped(ops, comm, deadline, [&]() -> absl::Status {
    for (const TokenSegment& s : segments) {
      TANDEM_RETURN_IF_ERROR(ops.Recv(comm, base + s.offset, s.bytes, peer, stream));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> LoopbackKvBlocks(NcclOps& ops, NcclOps::Comm comm,
                                             NcclOps::Stream stream, int self,
                                             const KvBlockLayout& layout,
                                             int64_t blocks_per_segment, const char* payload,
                                             NcclStaging& send_staging, NcclStaging& recv_staging,
                                             absl::Time deadline) {
  TANDEM_RETURN_IF_ERROR(CheckBlocksPerSegment(layout, blocks_per_segment));
  TANDEM_RETURN_IF_ERROR(send_staging.Reserve(layout.staging_bytes()));
  TANDEM_RETURN_IF_ERROR(recv_staging.Reserve(layout.staging_bytes()));
  TANDEM_RETURN_IF_ERROR(StageForSend(ops, layout, payload, send_staging, stream));
  const std::vector<KvSegment> segments = KvSegments(layout, blocks_per_segment);
  TANDEM_RETURN_IF_ERROR(Grouped(ops, comm, deadline, [&]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(EnqueueSends(ops, comm, self, send_staging, segments, stream));
    return EnqueueRecvs(ops, comm, self, recv_staging, segments, stream);
  }));
  TANDEM_RETURN_IF_ERROR(EnqueueDownload(ops, layout, recv_staging, stream));
  TANDEM_RETURN_IF_ERROR(ops.WaitStream(comm, stream, deadline));
  std::string out(static_cast<size_t>(layout.payload_bytes()), '\0');
  UnpackKvBlocks(layout, recv_staging.host(), out.data());
  return out;
}

}  // namespace tandem::transfer
