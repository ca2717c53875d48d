// ZeroedBuffer: a large, page-aligned, zero-filled byte buffer whose pages
// the kernel zeroes on first touch (an anonymous private mapping) instead of
// the constructor writing every byte. The KV cache is the user: a 1 GiB
// cache built as std::vector<char>(n, 0) cost about a second of start-up in
// memset and page faults before the first request; mapped, it costs nothing
// until blocks are written, and resident memory grows with the blocks used.
//
// Move-only; the mapping is released on destruction.
#ifndef TANDEM_COMMON_ZEROED_BUFFER_H_
#define TANDEM_COMMON_ZEROED_BUFFER_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace tandem {

class ZeroedBuffer {
 public:
  ZeroedBuffer() = default;
  // `bytes` zero bytes (none for 0); ResourceExhausted when the mapping fails.
  static absl::StatusOr<ZeroedBuffer> Allocate(size_t bytes);

  ZeroedBuffer(ZeroedBuffer&& other) noexcept;
  ZeroedBuffer& operator=(ZeroedBuffer&& other) noexcept;
  ZeroedBuffer(const ZeroedBuffer&) = delete;
  ZeroedBuffer& operator=(const ZeroedBuffer&) = delete;
  ~ZeroedBuffer();

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ZeroedBuffer(char* data, size_t size) : data_(data), size_(size) {}
  void Release();

  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ZEROED_BUFFER_H_
