// GGUF reader/writer: round trips, the real model, and one test per hostile
// input (each asserts the status code and a message fragment).
#include "common/gguf/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "tests/util/test_paths.h"

namespace tandem::gguf {
namespace {

using ::testing::HasSubstr;

// Little-endian byte builder for hand-made (often broken) GGUF images.
class Raw {
 public:
  Raw& Bytes(std::string_view b) {
    s_.append(b);
    return *this;
  }
  template <typename T>
  Raw& Put(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    s_.append(buf, sizeof(T));
    return *this;
  }
  Raw& U32(uint32_t v) { return Put(v); }
  Raw& U64(uint64_t v) { return Put(v); }
  Raw& Str(std::string_view v) { return U64(v.size()).Bytes(v); }
  Raw& Header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return Bytes("GGUF").U32(version).U64(tensors).U64(kvs);
  }
  Raw& KvU32(std::string_view key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Raw& TensorInfo(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                  uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  Raw& Pad(size_t alignment = 32) {
    while (s_.size() % alignment != 0) s_.push_back('\0');
    return *this;
  }
  Raw& Zeros(size_t n) {
    s_.append(n, '\0');
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

absl::Status Parse(const std::string& bytes) { return GgufFile::FromBuffer(bytes).status(); }

#define EXPECT_GGUF_ERROR(image, want_code, fragment)       \
  do {                                                      \
    absl::Status st_ = Parse(image);                        \
    EXPECT_EQ(st_.code(), want_code) << st_;                \
    EXPECT_THAT(st_.message(), HasSubstr(fragment)) << st_; \
  } while (0)

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kOutOfRange = absl::StatusCode::kOutOfRange;

std::string Bytes(size_t n, uint8_t seed) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(seed + i * 7);
  return b;
}

// A small writer exercising every value type, nested arrays and several
// tensor types.
GgufWriter RichWriter(uint64_t alignment) {
  GgufWriter w;
  w.SetAlignment(alignment);
  w.Add("u8", Value{ValueType::kUint8, ValueType::kUint8, uint64_t{255}});
  w.Add("i8", Value{ValueType::kInt8, ValueType::kUint8, int64_t{-128}});
  w.Add("u16", Value{ValueType::kUint16, ValueType::kUint8, uint64_t{65535}});
  w.Add("i16", Value{ValueType::kInt16, ValueType::kUint8, int64_t{-32768}});
  w.Add("u32", Value::Uint32(4000000000u));
  w.Add("i32", Value::Int32(-2000000000));
  w.Add("f32", Value::Float32(3.25f));
  w.Add("bool", Value::Bool(true));
  w.Add("str", Value::String(std::string("h\xC3\xA9llo\0x", 8)));
  w.Add("u64", Value::Uint64(std::numeric_limits<uint64_t>::max()));
  w.Add("i64", Value{ValueType::kInt64, ValueType::kUint8, std::numeric_limits<int64_t>::min()});
  w.Add("f64", Value{ValueType::kFloat64, ValueType::kUint8, 1e300});
  w.Add("strs", Value::StringArray({"a", "", "ccc"}));
  w.Add("f32s", Value::Float32Array({1.5f, -0.0f, std::numeric_limits<float>::infinity()}));
  w.Add("i32s", Value::Int32Array({}));
  w.Add("nested", Value::MakeArray(ValueType::kArray,
                                   {Value::Int32Array({1, 2}), Value::Int32Array({3}),
                                    Value::MakeArray(ValueType::kBool, {Value::Bool(false)})}));
  EXPECT_TRUE(w.AddF32Tensor("a.f32", {3, 2}, {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_TRUE(w.AddTensor("b.f16", {5}, TensorType::kF16, Bytes(10, 1)).ok());
  EXPECT_TRUE(w.AddTensor("c.q4_1", {64, 2}, TensorType::kQ4_1, Bytes(80, 2)).ok());
  EXPECT_TRUE(w.AddTensor("d.q8_0", {32}, TensorType::kQ8_0, Bytes(34, 3)).ok());
  EXPECT_TRUE(w.AddTensor("e.q4_k", {256}, TensorType::kQ4_K, Bytes(144, 4)).ok());
  return w;
}

// Rebuilds a writer from a parsed file (same metadata, tensors, alignment).
GgufWriter Rewrite(const GgufFile& f) {
  GgufWriter w;
  w.SetAlignment(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.Add(k, v);
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, t.shape, t.type,
                            std::string(reinterpret_cast<const char*>(t.data), t.num_bytes))
                    .ok());
  }
  return w;
}

TEST(GgufRoundTrip, EveryValueTypeAndTensorType) {
  for (uint64_t alignment : {32, 64, 1}) {
    const std::string bytes = RichWriter(alignment).Serialize();
    auto f = GgufFile::FromBuffer(bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    const GgufFile& g = **f;
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.alignment(), alignment);
    EXPECT_EQ(g.data_offset() % alignment, 0u);
    // Non-default alignments add the general.alignment key.
    EXPECT_EQ(g.metadata().size(), alignment == 32 ? 16u : 17u);

    EXPECT_EQ(*g.Find("u8")->AsUint(), 255u);
    EXPECT_EQ(g.Find("u8")->type, ValueType::kUint8);
    EXPECT_EQ(*g.GetInt("i8"), -128);
    EXPECT_EQ(*g.GetInt("u16"), 65535);
    EXPECT_EQ(*g.GetInt("i16"), -32768);
    EXPECT_EQ(*g.GetInt("u32"), 4000000000);
    EXPECT_EQ(*g.GetInt("i32"), -2000000000);
    EXPECT_EQ(*g.GetFloat("f32"), 3.25);
    EXPECT_EQ(*g.GetBool("bool"), true);
    EXPECT_EQ(*g.GetString("str"), std::string_view("h\xC3\xA9llo\0x", 8));
    EXPECT_EQ(*g.Find("u64")->AsUint(), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(g.GetInt("u64").status().code(), kInvalid);  // does not fit in int64
    EXPECT_EQ(*g.GetInt("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(*g.GetFloat("f64"), 1e300);
    EXPECT_EQ(*g.GetFloat("u32"), 4e9);  // ints widen to float
    const Value::Array* strs = *g.GetArray("strs");
    ASSERT_EQ(strs->size(), 3u);
    EXPECT_EQ(*(*strs)[2].AsString(), "ccc");
    const Value::Array* f32s = *g.GetArray("f32s");
    EXPECT_TRUE(std::signbit(*(*f32s)[1].AsFloat()));
    EXPECT_TRUE(std::isinf(*(*f32s)[2].AsFloat()));
    EXPECT_TRUE((*g.GetArray("i32s"))->empty());
    EXPECT_EQ(g.Find("i32s")->array_type, ValueType::kInt32);
    const Value* nested = g.Find("nested");
    ASSERT_EQ(nested->array_type, ValueType::kArray);
    const Value::Array& outer = **nested->AsArray();
    ASSERT_EQ(outer.size(), 3u);
    EXPECT_EQ(*(**outer[0].AsArray())[1].AsInt(), 2);
    EXPECT_EQ(outer[2].array_type, ValueType::kBool);

    ASSERT_EQ(g.tensors().size(), 5u);
    const TensorInfo* q = g.FindTensor("c.q4_1");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, TensorType::kQ4_1);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{64, 2}));
    EXPECT_EQ(q->num_elements, 128);
    EXPECT_EQ(q->num_bytes, 80u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(q->data), 80), Bytes(80, 2));
    const TensorInfo* a = g.FindTensor("a.f32");
    float vals[6];
    std::memcpy(vals, a->data, sizeof(vals));
    EXPECT_EQ(vals[5], 6.0f);
    for (const TensorInfo& t : g.tensors()) EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    EXPECT_EQ(g.FindTensor("missing"), nullptr);

    // Exact round trip: parse -> write gives the same bytes.
    EXPECT_EQ(Rewrite(g).Serialize(), bytes);
  }
}

TEST(GgufRoundTrip, TypedGettersReportMissingAndMismatch) {
  auto f = GgufFile::FromBuffer(RichWriter(32).Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetInt("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*(*f)->GetIntOr("nope", 7), 7);
  EXPECT_EQ(*(*f)->GetFloatOr("nope", 0.5), 0.5);
  EXPECT_EQ(*(*f)->GetBoolOr("nope", true), true);
  absl::Status s = (*f)->GetString("u32").status();
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("key 'u32'"));
  EXPECT_EQ((*f)->GetIntOr("str", 1).status().code(), kInvalid);
}

TEST(GgufRoundTrip, WriteFileThenOpen) {
  const std::string path = ::testing::TempDir() + "/gguf_test_rt.gguf";
  ASSERT_TRUE(RichWriter(32).WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 5u);
  EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*f)->tensors()[0].data) % 32, 0u);  // mmap is page-aligned
  std::filesystem::remove(path);
}

TEST(GgufWriter, RejectsWrongByteCount) {
  GgufWriter w;
  EXPECT_EQ(w.AddTensor("t", {32}, TensorType::kQ4_0, std::string(17, 'x')).code(), kInvalid);
  EXPECT_EQ(w.AddTensor("t", {16}, TensorType::kQ4_0, std::string(9, 'x')).code(), kInvalid);
  EXPECT_EQ(w.AddTensor("t", {0}, TensorType::kF32, "").code(), kInvalid);
}

TEST(GgufReader, HandBuiltVersion2) {
  Raw r;
  r.Header(1, 2, /*version=*/2).KvU32("general.alignment", 16);
  r.Str("name").U32(8).Str("v2");
  r.TensorInfo("w", {4, 1}, 0, 0).Pad(16);
  const size_t data_at = r.str().size();
  r.Put(1.0f).Put(2.0f).Put(3.0f).Put(4.0f);
  auto f = GgufFile::FromBuffer(r.str());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->alignment(), 16u);
  EXPECT_EQ((*f)->data_offset(), data_at);
  EXPECT_EQ(*(*f)->GetString("name"), "v2");
  const TensorInfo& t = (*f)->tensors()[0];
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 1}));
  float v[4];
  std::memcpy(v, t.data, 16);
  EXPECT_EQ(v[3], 4.0f);
}

TEST(GgufReader, NoTensorsNoPadding) {
  Raw r;
  r.Header(0, 1).KvU32("k", 1);
  auto f = GgufFile::FromBuffer(r.str());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->tensors().empty());
  (*f)->Prefault(nullptr);
}

// Seeds written by gguf-py (tools/make_gguf_seeds.py): an independent writer.
TEST(GgufReader, ParsesGgufPySeeds) {
  const std::filesystem::path dir =
      std::filesystem::path(TANDEM_TEST_DATA_DIR) / "../fuzz/corpus/gguf";
  int parsed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("valid_", 0) != 0) continue;
    auto f = GgufFile::Open(e.path().string());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->version(), 3u);
    EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama") << e.path();
    if (e.path().filename() == "valid_align64.gguf") {
      EXPECT_EQ((*f)->alignment(), 64u);
      EXPECT_EQ((*f)->tensors().size(), 6u);
      EXPECT_EQ((*f)->FindTensor("q4_k")->shape, (std::vector<int64_t>{256, 1}));
      EXPECT_EQ((*f)->FindTensor("q8_0")->num_bytes, 2u * 34);
    }
    if (e.path().filename() == "valid_metadata.gguf") {
      EXPECT_EQ(*(*f)->GetInt("i64"), -(int64_t{1} << 40));
      EXPECT_EQ((**(*f)->GetArray("nested"))[1].array_type, ValueType::kInt32);
    }
    ++parsed;
  }
  EXPECT_EQ(parsed, 4);
}

TEST(GgufRealModel, OpensSmolLM2) {
  const std::string path = testing::DefaultModelPath();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model at " << path;
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 33u);
  ASSERT_EQ(g.tensors().size(), 272u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 30);
  std::map<TensorType, int> by_type;
  for (const TensorInfo& t : g.tensors()) by_type[t.type]++;
  EXPECT_EQ(by_type[TensorType::kQ4_1], 210);
  EXPECT_EQ(by_type[TensorType::kF32], 61);
  EXPECT_EQ(by_type[TensorType::kQ8_0], 1);
  const TensorInfo* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, TensorType::kQ8_0);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->num_bytes, 576u / 32 * 34 * 49152);
  const Value::Array* tokens = *g.GetArray("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens->size(), 49152u);
  EXPECT_EQ(g.Find("tokenizer.ggml.tokens")->array_type, ValueType::kString);
  EXPECT_EQ((*g.GetArray("tokenizer.ggml.token_type"))->size(), 49152u);
  uint64_t last_end = 0;
  for (const TensorInfo& t : g.tensors()) last_end = std::max(last_end, t.offset + t.num_bytes);
  EXPECT_LE(g.data_offset() + last_end, g.file_size());
  EXPECT_GT(g.data_offset() + last_end + g.alignment(), g.file_size());

  uint64_t calls = 0, last_done = 0, total = 0;
  g.Prefault([&](uint64_t done, uint64_t all) {
    EXPECT_GE(done, last_done);
    last_done = done;
    total = all;
    ++calls;
  });
  EXPECT_GE(calls, 2u);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(total, g.file_size() - g.data_offset());
}

// ---- Hostile input ---------------------------------------------------------

TEST(GgufHostile, EveryTruncationFails) {
  const std::string full = RichWriter(32).Serialize();
  auto f = GgufFile::FromBuffer(full);
  ASSERT_TRUE(f.ok());
  uint64_t data_end = 0;
  for (const TensorInfo& t : (*f)->tensors()) {
    data_end = std::max(data_end, (*f)->data_offset() + t.offset + t.num_bytes);
  }
  for (size_t n = 0; n < data_end; ++n) {
    absl::Status s = Parse(full.substr(0, n));
    ASSERT_FALSE(s.ok()) << "prefix " << n << " parsed";
    EXPECT_TRUE(s.code() == kOutOfRange || s.code() == kInvalid) << n << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("gguf: ")) << n;
  }
  EXPECT_GGUF_ERROR(full.substr(0, 3), kOutOfRange, "magic at offset 0");
  EXPECT_GGUF_ERROR(full.substr(0, data_end - 1), kInvalid, "extends past end of file");
}

TEST(GgufHostile, WrongMagic) {
  EXPECT_GGUF_ERROR(Raw().Bytes("GGML").U32(3).U64(0).U64(0).str(), kInvalid, "bad magic");
}

TEST(GgufHostile, UnsupportedVersions) {
  EXPECT_GGUF_ERROR(Raw().Header(0, 0, 1).str(), kInvalid, "unsupported GGUF version 1");
  EXPECT_GGUF_ERROR(Raw().Header(0, 0, 4).str(), kInvalid, "unsupported GGUF version 4");
  EXPECT_GGUF_ERROR(Raw().Header(0, 0, 0x03000000).str(), kInvalid, "big-endian");
}

TEST(GgufHostile, HugeCounts) {
  EXPECT_GGUF_ERROR(Raw().Header(uint64_t{1} << 62, 0).str(), kInvalid, "tensor_count");
  EXPECT_GGUF_ERROR(Raw().Header(0, uint64_t{1} << 62).str(), kInvalid, "kv_count");
  EXPECT_GGUF_ERROR(Raw().Header(0, ~uint64_t{0}).Zeros(64).str(), kInvalid, "kv_count");
}

TEST(GgufHostile, HugeStringLength) {
  Raw key;
  key.Header(0, 1).U64(uint64_t{1} << 60).Zeros(32);
  EXPECT_GGUF_ERROR(key.str(), kOutOfRange, "string length 1152921504606846976");
  Raw val;
  val.Header(0, 1).Str("k").U32(8).U64(~uint64_t{0}).Zeros(8);
  EXPECT_GGUF_ERROR(val.str(), kOutOfRange, "key 'k' at offset 37: string length");
}

TEST(GgufHostile, HugeArrayCount) {
  Raw r;
  r.Header(0, 1).Str("arr").U32(9).U32(4).U64(uint64_t{1} << 61).Zeros(64);
  EXPECT_GGUF_ERROR(r.str(), kOutOfRange, "key 'arr' at offset 39: array count");
  Raw nested;  // arrays of arrays need 12 bytes per element
  nested.Header(0, 1).Str("arr").U32(9).U32(9).U64(10).Zeros(100);
  EXPECT_GGUF_ERROR(nested.str(), kOutOfRange, "array count 10");
}

TEST(GgufHostile, NestingTooDeep) {
  auto nest = [](int levels) {
    Raw r;
    r.Header(0, 1).Str("deep").U32(9);
    for (int i = 1; i < levels; ++i) r.U32(9).U64(1);
    r.U32(4).U64(1).U32(7);
    return r.str();
  };
  EXPECT_TRUE(Parse(nest(8)).ok()) << Parse(nest(8));
  EXPECT_GGUF_ERROR(nest(9), kInvalid, "nested deeper than 8");
}

TEST(GgufHostile, UnknownValueTypes) {
  EXPECT_GGUF_ERROR(Raw().Header(0, 1).Str("k").U32(13).U32(0).str(), kInvalid,
                    "key 'k' at offset 33: unknown value type 13");
  EXPECT_GGUF_ERROR(Raw().Header(0, 1).Str("k").U32(9).U32(77).U64(0).str(), kInvalid,
                    "unknown array element type 77");
  EXPECT_GGUF_ERROR(Raw().Header(0, 1).Str("k").U32(7).Put<uint8_t>(2).str(), kInvalid,
                    "bool byte is 2");
}

TEST(GgufHostile, DuplicateKey) {
  EXPECT_GGUF_ERROR(Raw().Header(0, 2).KvU32("a", 1).KvU32("a", 2).str(), kInvalid,
                    "duplicate key 'a' at offset 41");
}

// One tensor info with the given fields, followed by `data_bytes` of data.
std::string OneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                      size_t data_bytes) {
  Raw r;
  r.Header(1, 0).TensorInfo("t", dims, type, offset).Pad().Zeros(data_bytes);
  return r.str();
}

TEST(GgufHostile, BadTensorInfos) {
  EXPECT_TRUE(Parse(OneTensor({4}, 0, 0, 16)).ok());
  EXPECT_GGUF_ERROR(OneTensor({4}, 99, 0, 16), kInvalid,
                    "tensor 't' (info at offset 24): unknown tensor type 99");
  EXPECT_GGUF_ERROR(OneTensor({1, 1, 1, 1, 1}, 0, 0, 16), kInvalid, "n_dims 5");
  EXPECT_GGUF_ERROR(OneTensor({}, 0, 0, 16), kInvalid, "n_dims 0");
  EXPECT_GGUF_ERROR(OneTensor({4, 0}, 0, 0, 16), kInvalid, "dimension 1 is 0");
  EXPECT_GGUF_ERROR(OneTensor({~uint64_t{0}}, 0, 0, 16), kInvalid, "dimension 0 is -1");
  EXPECT_GGUF_ERROR(OneTensor({uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0, 16), kInvalid,
                    "element count overflows");
  EXPECT_GGUF_ERROR(OneTensor({uint64_t{1} << 62}, 0, 0, 16), kInvalid, "overflows");
  EXPECT_GGUF_ERROR(OneTensor({16}, 2, 0, 32), kInvalid, "not a multiple of the Q4_0 block size");
  EXPECT_GGUF_ERROR(OneTensor({4}, 0, 16, 32), kInvalid,
                    "offset 16 is not a multiple of the alignment 32");
}

TEST(GgufHostile, TensorPastEnd) {
  // Header 24 + info (8+1+4+8+4+8 = 33) -> data at 64; 16 bytes of data needed.
  EXPECT_GGUF_ERROR(OneTensor({4}, 0, 0, 15), kInvalid,
                    "tensor 't': data [64, 80) extends past end of file (size 79)");
  EXPECT_GGUF_ERROR(OneTensor({4}, 0, 32, 16), kInvalid, "data [96, 112) extends past end");
  EXPECT_GGUF_ERROR(OneTensor({4}, 0, ~uint64_t{0} / 32 * 32, 16), kInvalid, "extends past end");
  // Data section start itself past the end (nothing after the infos).
  Raw r;
  r.Header(1, 0).TensorInfo("t", {4}, 0, 0);
  EXPECT_GGUF_ERROR(r.str(), kInvalid, "extends past end of file (size 57)");
}

TEST(GgufHostile, OverlapAndDuplicateName) {
  Raw overlap;
  overlap.Header(2, 0).TensorInfo("a", {16}, 0, 0).TensorInfo("b", {4}, 0, 32).Pad().Zeros(64);
  EXPECT_GGUF_ERROR(overlap.str(), kInvalid, "tensors 'a' [96, 160) and 'b' [128, 144) overlap");
  Raw dup;
  dup.Header(2, 0).TensorInfo("a", {4}, 0, 0).TensorInfo("a", {4}, 0, 32).Pad().Zeros(64);
  EXPECT_GGUF_ERROR(dup.str(), kInvalid, "duplicate tensor name 'a' at offset 57");
}

TEST(GgufHostile, BadAlignment) {
  auto with_alignment = [](uint32_t a) {
    Raw r;
    r.Header(0, 1).KvU32("general.alignment", a);
    return r.str();
  };
  EXPECT_TRUE(Parse(with_alignment(64)).ok());
  EXPECT_GGUF_ERROR(with_alignment(0), kInvalid, "general.alignment = 0");
  EXPECT_GGUF_ERROR(with_alignment(48), kInvalid,
                    "general.alignment = 48 must be a nonzero power of two");
  EXPECT_GGUF_ERROR(with_alignment(1u << 21), kInvalid, "general.alignment = 2097152");
  EXPECT_GGUF_ERROR(Raw().Header(0, 1).Str("general.alignment").U32(8).Str("32").str(), kInvalid,
                    "general.alignment must be an unsigned integer");
}

TEST(GgufHostile, MissingAndOddFiles) {
  absl::Status s = GgufFile::Open("/nonexistent/dir/model.gguf").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("cannot open '/nonexistent/dir/model.gguf'"));
  s = GgufFile::Open(::testing::TempDir()).status();
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("not a regular file"));
  const std::string empty = ::testing::TempDir() + "/gguf_test_empty.gguf";
  std::ofstream(empty).close();
  s = GgufFile::Open(empty).status();
  EXPECT_EQ(s.code(), kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("is empty"));
  const std::string junk = ::testing::TempDir() + "/gguf_test_junk.gguf";
  std::ofstream(junk) << "not a gguf file at all";
  s = GgufFile::Open(junk).status();
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("bad magic"));
  EXPECT_THAT(s.message(), HasSubstr(junk));
  std::filesystem::remove(empty);
  std::filesystem::remove(junk);
}

}  // namespace
}  // namespace tandem::gguf
