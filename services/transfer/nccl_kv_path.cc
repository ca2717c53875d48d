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
