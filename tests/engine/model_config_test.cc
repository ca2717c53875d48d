#include "engine/model_config.h"

#include "common/gguf/gguf.h"
#include "engine/kv_cache.h"
#include "gtest/gtest.h"
#include "tests/util/tiny_llama.h"

namespace tandem::engine {
namespace {

using testing::MakeRandomLlamaGguf;
using testing::TinyLlamaShape;

absl::StatusOr<ModelConfig> ConfigOf(const TinyLlamaShape& shape) {
  auto file = gguf::GgufFile::FromBuffer(MakeRandomLlamaGguf(shape, 1));
  if (!file.ok()) return file.status();
  return ModelConfig::FromGguf(**file);
}

TEST(ModelConfigTest, ReadsTinyModel) {
  TinyLlamaShape shape;
  absl::StatusOr<ModelConfig> c = ConfigOf(shape);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_dim, 16);
  EXPECT_EQ(c->vocab_size, 96);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_FALSE(c->has_qkv_bias);
  EXPECT_EQ(c->rope_style, kernels::RopeStyle::kAdjacentPairs);
  EXPECT_EQ(c->KvBytesPerToken(4), 2 * 2 * 2 * 16 * 4);
}

TEST(ModelConfigTest, SmolLm2KvBytesPerToken) {
  ModelConfig c;
  c.num_layers = 30;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  EXPECT_EQ(c.KvBytesPerToken(4), 46080);
}

TEST(ModelConfigTest, Qwen2UsesNeoxRopeAndBias) {
  TinyLlamaShape shape;
  shape.arch = "qwen2";
  shape.qkv_bias = true;
  absl::StatusOr<ModelConfig> c = ConfigOf(shape);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_style, kernels::RopeStyle::kNeox);
  EXPECT_TRUE(c->has_qkv_bias);
}

TEST(ModelConfigTest, HostileFilesAreErrors) {
  {
    TinyLlamaShape s;
    s.omit_tensors = {"blk.1.ffn_up.weight"};
    absl::StatusOr<ModelConfig> c = ConfigOf(s);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("blk.1.ffn_up.weight"), std::string::npos) << c.status();
  }
  {
    TinyLlamaShape s;
    s.shape_override["blk.0.attn_k.weight"] = {64, 64};
    absl::StatusOr<ModelConfig> c = ConfigOf(s);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("shape"), std::string::npos) << c.status();
  }
  {
    TinyLlamaShape s;
    s.num_kv_heads = 3;  // does not divide 4 heads
    absl::StatusOr<ModelConfig> c = ConfigOf(s);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("divide"), std::string::npos) << c.status();
  }
  {
    TinyLlamaShape s;
    s.num_heads = 5;  // does not divide hidden 64
    s.num_kv_heads = 5;
    EXPECT_FALSE(ConfigOf(s).ok());
  }
  {
    TinyLlamaShape s;
    s.arch = "gpt2";
    absl::StatusOr<ModelConfig> c = ConfigOf(s);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  }
  {
    TinyLlamaShape s;
    s.omit_tensors = {"token_embd.weight"};
    EXPECT_FALSE(ConfigOf(s).ok());
  }
  {
    TinyLlamaShape s;
    s.write_head_count_kv = false;  // defaults to head_count: then shapes mismatch
    EXPECT_FALSE(ConfigOf(s).ok());
  }
}

TEST(KvCacheStorageTest, GeometryAndErrors) {
  auto cache = KvCacheStorage::Create(3, 10, 16, 2, 8);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->num_slots(), 160);
  EXPECT_EQ((*cache)->block_floats(), 16 * 2 * 8);
  EXPECT_EQ((*cache)->total_bytes(), 2 * 3 * 160 * 2 * 8 * 4);
  EXPECT_EQ((*cache)->v(0) - (*cache)->k(0), 160 * 16);
  EXPECT_EQ((*cache)->k(1) - (*cache)->k(0), 2 * 160 * 16);
  EXPECT_FALSE(KvCacheStorage::Create(3, 0, 16, 2, 8).ok());
  EXPECT_FALSE(KvCacheStorage::Create(1 << 20, 1 << 20, 1 << 10, 64, 128).ok());
}

}  // namespace
}  // namespace tandem::engine
