// The KV dtype in the compatibility header: a worker's KvCompatibility
// carries its real --kv-cache-dtype, and a prefill worker whose dtype
// differs from the decode worker's is refused before any KV byte moves
// (ValidateKvHeader, the check of every PushKv / NCCL handoff header), even
// where the bytes per token agree (f16 vs bf16, int8 vs fp8).
#include <string>

#include "gtest/gtest.h"
#include "services/common/compat.h"
#include "services/common/worker_runtime.h"
#include "services/transfer/kv_lease_table.h"
#include "tests/engine/engine_test_util.h"

namespace tandem {
namespace {

using engine::KvDtype;

TEST(KvDtypeCompatTest, MismatchedDtypesAreRefused) {
  const engine::TinyModel tiny = engine::LoadTinyModel(engine::DefaultTinyShape());
  const auto compat = [&](KvDtype d) {
    return services::MakeCompat(*tiny.file, *tiny.model, "tiny", 16, d);
  };
  for (KvDtype ours :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
    EXPECT_EQ(compat(ours).kv_dtype(), kernels::KvDtypeName(ours));
    for (KvDtype theirs :
         {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
      const absl::Status st = services::CheckCompat(compat(ours), compat(theirs));
      if (ours == theirs) {
        EXPECT_TRUE(st.ok()) << st;
        continue;
      }
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(
          st.message().find(std::string("compat.kv_dtype is ") + kernels::KvDtypeName(theirs)),
          std::string::npos)
          << st;
    }
  }
}

// A decode worker's runtime started with kv dtype int8 advertises it and
// refuses an fp8 prefill worker's header although both have the same bytes
// per token.
TEST(KvDtypeCompatTest, DecodeWorkerRefusesAnotherDtypesHandoff) {
  const engine::TinyModel tiny = engine::LoadTinyModel(engine::DefaultTinyShape());
  services::WorkerServerConfig c;
  c.file = tiny.file.get();
  c.model = tiny.model.get();
  c.model_name = "tiny";
  c.engine = engine::TinyEngineConfig(64);
  c.engine.kv_cache_dtype = KvDtype::kInt8;
  auto decode = services::WorkerRuntime::Create(c, "decode");
  ASSERT_TRUE(decode.ok()) << decode.status();
  const int64_t bpt = (*decode)->engine().kv_bytes_per_token();
  const engine::ModelConfig& mc = tiny.model->config();
  EXPECT_EQ(bpt,
            kernels::KvBytesPerToken(KvDtype::kInt8, mc.num_layers, mc.num_kv_heads, mc.head_dim));
  const v1::KvCompatibility& ours = (*decode)->compat();
  EXPECT_EQ(ours.kv_dtype(), "int8");
  v1::KvTransferHeader h;
  h.set_kv_handle("h");
  h.set_num_tokens(2);
  h.set_bytes_per_token(bpt);
  h.set_total_bytes(2 * bpt);
  h.add_token_ids(1);
  h.add_token_ids(2);
  *h.mutable_compat() = ours;
  EXPECT_TRUE(transfer::ValidateKvHeader(h, ours, bpt, 64, mc.vocab_size).ok());
  *h.mutable_compat() =
      services::MakeCompat(*tiny.file, *tiny.model, "tiny", c.engine.block_size, KvDtype::kFp8);
  const absl::Status st = transfer::ValidateKvHeader(h, ours, bpt, 64, mc.vocab_size);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("compat.kv_dtype is fp8, this worker has int8"), std::string::npos)
      << st;
}

}  // namespace
}  // namespace tandem
