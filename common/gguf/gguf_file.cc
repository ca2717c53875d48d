// GgufFile's file plumbing: mmap-backed Open(), buffer-backed FromBuffer(),
// lookup and Prefault(). Parsing itself is in gguf_reader.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/status.h"

namespace tandem::gguf {
namespace {

absl::Status ErrnoError(int err, const std::string& what, const std::string& path) {
  const std::string msg = absl::StrFormat("gguf: %s '%s': %s", what, path, std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("gguf: '%s' is not a regular file", path));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::OutOfRangeError(absl::StrFormat("gguf: '%s' is empty", path));
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) return ErrnoError(err, "cannot mmap", path);

  std::unique_ptr<GgufFile> f(new GgufFile());
  f->mapping_ = map;
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (absl::Status s = f->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("%s (file '%s')", s.message(), path));
  }
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(std::string bytes) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->buffer_ = std::move(bytes);
  f->base_ = reinterpret_cast<const uint8_t*>(f->buffer_.data());
  f->size_ = f->buffer_.size();
  TANDEM_RETURN_IF_ERROR(f->Parse());
  return f;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(size_));
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void GgufFile::Prefault(const ProgressFn& progress) const {
  const uint64_t begin = std::min(data_offset_, size_);
  const uint64_t total = size_ - begin;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kReportEvery = uint64_t{16} << 20;
  if (mapping_ != nullptr && total > 0) {
    const uint64_t aligned = begin / page * page;
    ::madvise(static_cast<uint8_t*>(mapping_) + aligned, size_ - aligned, MADV_WILLNEED);
  }
  uint8_t sum = 0;
  uint64_t last_report = 0;
  for (uint64_t off = 0; off < total; off += page) {
    sum ^= base_[begin + off];
    if (progress && off - last_report >= kReportEvery) {
      progress(off, total);
      last_report = off;
    }
  }
  // Keeps the loads from being optimized away.
  asm volatile("" : : "r"(sum) : "memory");
  if (progress) progress(total, total);
}

}  // namespace tandem::gguf
