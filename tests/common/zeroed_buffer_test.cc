// ZeroedBuffer: zero-filled, writable, page-aligned, movable without a
// double release, and a clear error for a size the kernel refuses.
#include "common/zeroed_buffer.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ZeroedBufferTest, ReadsZeroAndKeepsWrites) {
  constexpr size_t kBytes = (size_t{3} << 20) + 123;
  absl::StatusOr<ZeroedBuffer> buf = ZeroedBuffer::Allocate(kBytes);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_EQ(buf->size(), kBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 4096, 0u);
  for (size_t i = 0; i < kBytes; i += 997) ASSERT_EQ(buf->data()[i], 0) << i;
  EXPECT_EQ(buf->data()[kBytes - 1], 0);
  buf->data()[0] = 7;
  buf->data()[kBytes - 1] = 9;
  ZeroedBuffer moved = std::move(*buf);
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_EQ(buf->size(), 0u);
  ASSERT_EQ(moved.size(), kBytes);
  EXPECT_EQ(moved.data()[0], 7);
  EXPECT_EQ(moved.data()[kBytes - 1], 9);
  ZeroedBuffer other = *ZeroedBuffer::Allocate(4096);
  other = std::move(moved);  // releases other's own mapping
  EXPECT_EQ(other.data()[kBytes - 1], 9);
}

TEST(ZeroedBufferTest, EmptyAndRefused) {
  absl::StatusOr<ZeroedBuffer> empty = ZeroedBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0u);
  // More than any address space: the mapping fails with a message.
  absl::StatusOr<ZeroedBuffer> huge = ZeroedBuffer::Allocate(size_t{1} << 62);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("cannot map"), std::string::npos);
}

}  // namespace
}  // namespace tandem
