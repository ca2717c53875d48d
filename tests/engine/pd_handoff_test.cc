// Prefill/decode handoff at the engine level: export the prompt's K/V from
// engine A (export_kv), import it into engine B (import_kv +
// prefix_output_token_ids {first token}) and compare with one engine doing
// everything: tokens and logprobs must be bit-identical.
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

struct Handoff {
  CollectedOutput prefill;  // one token + finish (with kv_export)
  CollectedOutput decode;   // the rest
};

// Runs `request` disaggregated over two engines on `model`.
Handoff RunDisaggregated(Engine& prefill, Engine& decode, const EngineRequest& request) {
  Handoff h;
  EngineRequest p = request;
  p.export_kv = true;
  auto ph = prefill.Submit(p);
  TANDEM_CHECK(ph.ok());
  h.prefill = Collect(**ph);
  TANDEM_CHECK(h.prefill.finish.has_value());
  if (h.prefill.finish->kv_export == nullptr) return h;
  EngineRequest d = request;
  d.import_kv = h.prefill.finish->kv_export;
  d.prefix_output_token_ids = h.prefill.token_ids;
  auto dh = decode.Submit(d);
  TANDEM_CHECK(dh.ok());
  h.decode = Collect(**dh);
  return h;
}

CollectedOutput Concat(const Handoff& h) {
  CollectedOutput out = h.prefill;
  if (h.prefill.finish->kv_export == nullptr) return out;
  out.token_ids.insert(out.token_ids.end(), h.decode.token_ids.begin(), h.decode.token_ids.end());
  out.logprobs.insert(out.logprobs.end(), h.decode.logprobs.begin(), h.decode.logprobs.end());
  out.text += h.decode.text;
  out.finish = h.decode.finish;
  return out;
}

void ExpectAllFree(Engine& engine) {
  EXPECT_EQ(engine.Stats().num_blocks_used, 0);
  engine.Shutdown();
  EXPECT_TRUE(engine.CheckIntegrity().ok()) << engine.CheckIntegrity();
}

class PdHandoffTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tiny_ = new TinyModel(LoadTinyModel(DefaultTinyShape())); }
  static void TearDownTestSuite() { delete tiny_; }
  static const LlamaModel* model() { return tiny_->model.get(); }
  // Chunked prefill in steps of 16 tokens.
  static EngineConfig ChunkedConfig() {
    EngineConfig config = TinyEngineConfig(64);
    config.scheduler.max_num_batched_tokens = 16;
    return config;
  }
  // `r` (export_kv set) exported in one piece on a fresh engine (kept in
  // *engine for the caller's ExpectAllFree).
  static CollectedOutput ExportWhole(const EngineRequest& r, std::unique_ptr<Engine>* engine) {
    *engine = MakeEngine(ChunkedConfig(), model());
    CollectedOutput whole = Collect(**(*engine)->Submit(r));
    EXPECT_TRUE(whole.finish.has_value() && whole.finish->kv_export != nullptr);
    return whole;
  }
  static TinyModel* tiny_;
};
TinyModel* PdHandoffTest::tiny_ = nullptr;

TEST_F(PdHandoffTest, ExportCarriesPromptKv) {
  auto engine = MakeEngine(TinyEngineConfig(64), model());
  auto h = engine->Submit([] {
    EngineRequest r = MakeRequest(RandomPrompt(37, 256, 1), 8);
    r.export_kv = true;
    return r;
  }());
  ASSERT_TRUE(h.ok());
  CollectedOutput out = Collect(**h);
  ASSERT_TRUE(out.finish.has_value());
  ASSERT_EQ(out.token_ids.size(), 1u);
  ASSERT_NE(out.finish->kv_export, nullptr);
  const KvExport& kv = *out.finish->kv_export;
  EXPECT_TRUE(kv.Validate().ok()) << kv.Validate();
  EXPECT_EQ(kv.num_tokens(), 37);
  EXPECT_EQ(kv.bytes_per_token, engine->kv_bytes_per_token());
  EXPECT_EQ(kv.token_ids, RandomPrompt(37, 256, 1));
  ExpectAllFree(*engine);
}

TEST_F(PdHandoffTest, MaxTokensOneNeedsNoTransfer) {
  auto engine = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(20, 256, 2), 1);
  r.export_kv = true;
  CollectedOutput out = Collect(**engine->Submit(r));
  ASSERT_TRUE(out.finish.has_value());
  EXPECT_EQ(out.finish->reason, FinishReason::kLength);
  EXPECT_EQ(out.finish->kv_export, nullptr);
  ExpectAllFree(*engine);
}

TEST_F(PdHandoffTest, DisaggregatedMatchesColocatedGreedyAndSampled) {
  for (int i = 0; i < 6; ++i) {
    const double temperature = i % 2 ? 0.9 : 0.0;
    EngineRequest r = MakeRequest(RandomPrompt(5 + 13 * i, 256, 10 + i), 10, temperature, 77 + i);
    if (i == 5) {
      r.params.repetition_penalty = 1.3;
      r.params.frequency_penalty = 0.5;
    }
    const CollectedOutput colocated = RunAlone(model(), r);
    auto prefill = MakeEngine(TinyEngineConfig(64), model());
    auto decode = MakeEngine(TinyEngineConfig(64), model());
    const Handoff h = RunDisaggregated(*prefill, *decode, r);
    ExpectSameOutput(Concat(h), colocated, "request " + std::to_string(i));
    ExpectAllFree(*prefill);
    ExpectAllFree(*decode);
  }
}

TEST_F(PdHandoffTest, ImportWithPrefixCacheHitAndChunkedPrefill) {
  // Decode engine already caches part of the prompt; prefill chunks the prompt.
  EngineConfig pc = TinyEngineConfig(64);
  pc.scheduler.max_num_batched_tokens = 16;
  auto prefill = MakeEngine(pc, model());
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  std::vector<int32_t> prompt = RandomPrompt(70, 256, 5);
  std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
  Collect(**decode->Submit(MakeRequest(head, 2)));
  EngineRequest r = MakeRequest(prompt, 9, 0.7, 3);
  const Handoff h = RunDisaggregated(*prefill, *decode, r);
  ExpectSameOutput(Concat(h), RunAlone(model(), r), "prefix hit");
  EXPECT_GT(h.decode.finish->usage.num_cached_tokens, 0);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, ImportedSequenceSurvivesPreemption) {
  // 10 blocks of 16: three imported sequences of 40 tokens growing to 100
  // (7 blocks each) must preempt as soon as any two overlap, however the
  // engine thread interleaves with the submits.
  EngineConfig dc = TinyEngineConfig(10);
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  auto decode = MakeEngine(dc, model());
  std::vector<EngineRequest> reqs;
  std::vector<EngineRequest> imports;
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = MakeRequest(RandomPrompt(40, 256, 30 + i), 60, i % 2 ? 0.8 : 0.0, i);
    EngineRequest p = r;
    p.export_kv = true;
    CollectedOutput first = Collect(**prefill->Submit(p));
    ASSERT_NE(first.finish->kv_export, nullptr);
    EngineRequest d = r;
    d.import_kv = first.finish->kv_export;
    d.prefix_output_token_ids = first.token_ids;
    reqs.push_back(r);
    imports.push_back(d);
  }
  for (EngineRequest& d : imports) handles.push_back(*decode->Submit(d));
  for (int i = 0; i < 3; ++i) {
    CollectedOutput got = Collect(*handles[i]);
    const CollectedOutput alone = RunAlone(model(), reqs[i]);
    ASSERT_TRUE(got.finish.has_value());
    EXPECT_EQ(got.token_ids,
              std::vector<int32_t>(alone.token_ids.begin() + 1, alone.token_ids.end()));
  }
  EXPECT_GT(decode->Stats().num_preemptions, 0);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, CancelImportedFreesBlocks) {
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(30, 256, 9), 500);
  EngineRequest p = r;
  p.export_kv = true;
  CollectedOutput first = Collect(**prefill->Submit(p));
  EngineRequest d = r;
  d.import_kv = first.finish->kv_export;
  d.prefix_output_token_ids = first.token_ids;
  auto h = decode->Submit(d);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Next().has_value());
  decode->Cancel(*h);
  CollectedOutput rest = Collect(**h);
  ASSERT_TRUE(rest.finish.has_value());
  EXPECT_EQ(rest.finish->reason, FinishReason::kCancelled);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, RejectsMismatchedImport) {
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(20, 256, 4), 5);
  EngineRequest p = r;
  p.export_kv = true;
  auto kv = Collect(**prefill->Submit(p)).finish->kv_export;
  EngineRequest d = r;
  d.import_kv = kv;  // covers every token: nothing left to compute
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  d.prefix_output_token_ids = {1};
  d.prompt_token_ids[3] ^= 1;  // tokens differ
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = std::make_shared<KvExport>(*kv);
  bad->bytes.resize(bad->bytes.size() - 4);
  d = r;
  d.prefix_output_token_ids = {1};
  d.import_kv = bad;
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

// Migration (a decode worker died after k delivered tokens): the replay
// computes prompt + those k tokens and continues with exactly the tokens
// and logprobs the uninterrupted run produced, through a prefill engine
// (export, then import on a decode engine) or by decode-side prefill.
TEST_F(PdHandoffTest, MigrationReplayContinuesTheSameStream) {
  for (int variant = 0; variant < 2; ++variant) {
    EngineRequest r = MakeRequest(RandomPrompt(23 + 17 * variant, 256, 40 + variant), 16,
                                  variant ? 0.9 : 0.0, 500 + variant);
    r.params.repetition_penalty = 1.2;
    r.params.presence_penalty = 0.3;
    const CollectedOutput alone = RunAlone(model(), r);
    ASSERT_EQ(alone.token_ids.size(), 16u);
    const size_t lp = alone.logprobs.size() / alone.token_ids.size();
    for (size_t k : {1u, 2u, 7u, 15u}) {
      const std::string what = "variant " + std::to_string(variant) + " k " + std::to_string(k);
      const std::vector<int32_t> delivered(alone.token_ids.begin(), alone.token_ids.begin() + k);
      const std::vector<int32_t> rest(alone.token_ids.begin() + k, alone.token_ids.end());
      const std::vector<float> rest_lp(alone.logprobs.begin() + k * lp, alone.logprobs.end());
      auto prefill = MakeEngine(TinyEngineConfig(64), model());
      auto decode = MakeEngine(TinyEngineConfig(64), model());
      // Through a prefill engine.
      EngineRequest p = r;
      p.export_kv = true;
      p.prefix_output_token_ids = delivered;
      CollectedOutput first = Collect(**prefill->Submit(p));
      ASSERT_TRUE(first.finish.has_value()) << what;
      ASSERT_EQ(first.token_ids.size(), 1u) << what;
      EXPECT_EQ(first.token_ids[0], rest[0]) << what;
      CollectedOutput migrated = first;
      if (first.finish->kv_export != nullptr) {
        EXPECT_EQ(first.finish->kv_export->num_tokens(),
                  static_cast<int64_t>(r.prompt_token_ids.size() + k));
        EngineRequest d = r;
        d.import_kv = first.finish->kv_export;
        d.prefix_output_token_ids = delivered;
        d.prefix_output_token_ids.push_back(first.token_ids[0]);
        CollectedOutput tail = Collect(**decode->Submit(d));
        ASSERT_TRUE(tail.finish.has_value()) << what;
        migrated.token_ids.insert(migrated.token_ids.end(), tail.token_ids.begin(),
                                  tail.token_ids.end());
        migrated.logprobs.insert(migrated.logprobs.end(), tail.logprobs.begin(),
                                 tail.logprobs.end());
        migrated.finish = tail.finish;
      }
      EXPECT_EQ(migrated.token_ids, rest) << what;
      EXPECT_EQ(migrated.logprobs, rest_lp) << what;
      EXPECT_EQ(migrated.finish->reason, alone.finish->reason) << what;
      // Decode-side prefill (no prefill worker left).
      EngineRequest d = r;
      d.prefix_output_token_ids = delivered;
      CollectedOutput direct = Collect(**decode->Submit(d));
      ASSERT_TRUE(direct.finish.has_value()) << what;
      EXPECT_EQ(direct.token_ids, rest) << what;
      EXPECT_EQ(direct.logprobs, rest_lp) << what;
      EXPECT_EQ(direct.finish->usage.num_completion_tokens, 16) << what;
      ExpectAllFree(*prefill);
      ExpectAllFree(*decode);
    }
  }
}

// The worker died after the last token but before the finish: the replay
// finishes at once with the same reason and no tokens; a finishing token
// followed by more is refused.
TEST_F(PdHandoffTest, ReplayThatAlreadyFinishesEndsAtOnce) {
  EngineRequest r = MakeRequest(RandomPrompt(19, 256, 61), 6, 0.8, 9);
  const CollectedOutput alone = RunAlone(model(), r);
  ASSERT_EQ(alone.token_ids.size(), 6u);
  auto engine = MakeEngine(TinyEngineConfig(64), model());
  for (bool export_kv : {false, true}) {
    EngineRequest d = r;
    d.export_kv = export_kv;
    d.prefix_output_token_ids = alone.token_ids;
    CollectedOutput out = Collect(**engine->Submit(d));
    ASSERT_TRUE(out.finish.has_value());
    EXPECT_TRUE(out.token_ids.empty());
    EXPECT_EQ(out.finish->reason, FinishReason::kLength);
    EXPECT_EQ(out.finish->kv_export, nullptr);
  }
  EngineRequest bad = r;
  bad.params.stop.stop_token_ids = {alone.token_ids[2]};
  bad.params.stop.ignore_eos = true;
  bad.prefix_output_token_ids = alone.token_ids;
  CollectedOutput out = Collect(**engine->Submit(bad));
  ASSERT_TRUE(out.finish.has_value());
  // Token 2 (or an earlier copy of it) stops the request with tokens after it.
  EXPECT_EQ(out.finish->reason, FinishReason::kError);
  EXPECT_EQ(out.finish->status.code(), absl::StatusCode::kInvalidArgument);
  ExpectAllFree(*engine);
}

TEST(PdHandoffRealModelTest, DisaggregatedMatchesColocated) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no model at " << path;
  EngineConfig config;
  config.model_path = path;
  config.kv_cache_memory_bytes = 32 << 20;
  config.num_threads = 2;
  config.check_integrity_every_step = true;
  auto colocated = Engine::Create(config);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  const tokenizer::Tokenizer& tok = *(*colocated)->tokenizer();
  auto prefill = Engine::Create(config, &(*colocated)->model(), &tok);
  auto decode = Engine::Create(config, &(*colocated)->model(), &tok);
  ASSERT_TRUE(prefill.ok() && decode.ok());
  const char* kPrompts[] = {"The capital of France is", "Once upon a time, in a land"};
  for (int i = 0; i < 2; ++i) {
    for (double temperature : {0.0, 0.8}) {
      EngineRequest r = MakeRequest(tok.Encode(kPrompts[i], true, true), 10, temperature, 5 + i);
      const CollectedOutput alone = Collect(**(*colocated)->Submit(r));
      const Handoff h = RunDisaggregated(**prefill, **decode, r);
      ExpectSameOutput(Concat(h), alone, kPrompts[i]);
      EXPECT_EQ(Concat(h).text, alone.text);
    }
  }
  ExpectAllFree(**prefill);
  ExpectAllFree(**decode);
  ExpectAllFree(**colocated);
}

// stream_kv_export: the K/V leaves in ordered, contiguous chunks as chunked
// prefill computes them (one per step), the first token comes before the
// last chunk, and the chunks put together are exactly the one-piece export.
TEST_F(PdHandoffTest, StreamedExportMatchesOnePieceAndLeadsWithTheToken) {
  const EngineConfig config = ChunkedConfig();  // 53 tokens: 4 steps
  EngineRequest r = MakeRequest(RandomPrompt(53, 256, 5), 8);
  r.export_kv = true;
  std::unique_ptr<Engine> whole_engine;
  const CollectedOutput whole = ExportWhole(r, &whole_engine);
  ASSERT_NE(whole.finish->kv_export, nullptr);

  auto engine = MakeEngine(config, model());
  r.stream_kv_export = true;
  auto h = engine->Submit(r);
  ASSERT_TRUE(h.ok());
  std::string bytes;
  std::vector<std::string> order;  // "kv[b,e)", "token", "finish"
  int64_t next = 0;
  std::optional<FinishEvent> finish;
  std::vector<int32_t> tokens;
  while (!finish.has_value()) {
    std::optional<EngineEvent> ev = (*h)->Next(absl::Seconds(60));
    ASSERT_TRUE(ev.has_value());
    if (auto* c = std::get_if<KvChunkEvent>(&*ev)) {
      EXPECT_EQ(c->begin, next);
      EXPECT_GT(c->end, c->begin);
      EXPECT_EQ(static_cast<int64_t>(c->bytes.size()),
                (c->end - c->begin) * engine->kv_bytes_per_token());
      next = c->end;
      bytes += c->bytes;
      order.push_back("kv");
    } else if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      tokens.push_back(t->token_id);
      order.push_back("token");
    } else {
      finish = std::get<FinishEvent>(std::move(*ev));
    }
  }
  EXPECT_EQ(finish->reason, FinishReason::kLength);
  EXPECT_EQ(finish->kv_export, nullptr);
  EXPECT_TRUE(finish->kv_exported);
  EXPECT_TRUE(whole.finish->kv_exported);
  EXPECT_EQ(tokens, whole.token_ids);
  EXPECT_EQ(next, 53);
  EXPECT_TRUE(bytes == whole.finish->kv_export->bytes);
  // Chunks of the first 3 steps (48 tokens), then the token, then the tail.
  const std::vector<std::string> expected = {"kv", "kv", "kv", "token", "kv"};
  EXPECT_EQ(order, expected);
  ExpectAllFree(*engine);
  ExpectAllFree(*whole_engine);
}

// kv_export_on_device: the chunks come in the executor's own memory domain
// (host memory on the CPU executor; CUDA device memory on the CUDA one),
// byte for byte the host export; a KvExport holding such a payload imports
// (WriteKvDevice) with the same tokens as host bytes, and one from another
// domain is refused with nothing leaked.
TEST_F(PdHandoffTest, DeviceDomainExportAndImportEqualTheHostOnes) {
  const EngineConfig config = ChunkedConfig();  // 41 tokens: 3 steps
  const std::vector<int32_t> prompt = RandomPrompt(41, 256, 9);
  EngineRequest r = MakeRequest(prompt, 8);
  r.export_kv = true;
  std::unique_ptr<Engine> whole_engine;
  const CollectedOutput whole = ExportWhole(r, &whole_engine);
  ASSERT_NE(whole.finish->kv_export, nullptr);
  const KvExport& host = *whole.finish->kv_export;

  auto engine = MakeEngine(config, model());
  EXPECT_EQ(engine->kv_memory_domain(), "cpu");
  r.stream_kv_export = true;
  r.kv_export_on_device = true;
  auto h = engine->Submit(r);
  ASSERT_TRUE(h.ok());
  std::string bytes;
  int chunks = 0;
  while (true) {
    std::optional<EngineEvent> ev = (*h)->Next(absl::Seconds(60));
    ASSERT_TRUE(ev.has_value());
    if (auto* c = std::get_if<KvChunkEvent>(&*ev)) {
      EXPECT_TRUE(c->bytes.empty());
      ASSERT_NE(c->device, nullptr);
      EXPECT_EQ(c->device->domain(), "cpu");
      EXPECT_EQ(c->size(), (c->end - c->begin) * engine->kv_bytes_per_token());
      bytes.append(static_cast<const char*>(c->device->data()), c->device->size());
      ++chunks;
    } else if (std::holds_alternative<FinishEvent>(*ev)) {
      break;
    }
  }
  EXPECT_EQ(chunks, 3);
  EXPECT_TRUE(bytes == host.bytes);

  // The same payload as a device-domain import continues like the host one.
  auto payload = std::make_shared<KvExport>(host);
  payload->bytes.clear();
  char* mem = new char[host.bytes.size()];
  std::memcpy(mem, host.bytes.data(), host.bytes.size());
  payload->device =
      std::make_shared<KvDeviceBytes>(mem, static_cast<int64_t>(host.bytes.size()), "cpu",
                                      [](void* p) { delete[] static_cast<char*>(p); });
  ASSERT_TRUE(payload->Validate().ok()) << payload->Validate();
  EngineRequest d = MakeRequest(prompt, 8);
  d.prefix_output_token_ids = whole.token_ids;
  d.import_kv = std::make_shared<KvExport>(host);
  auto decode_host = MakeEngine(config, model());
  const CollectedOutput want = Collect(**decode_host->Submit(d));
  d.import_kv = payload;
  auto decode_device = MakeEngine(config, model());
  const CollectedOutput got = Collect(**decode_device->Submit(d));
  ASSERT_TRUE(got.finish.has_value());
  EXPECT_EQ(got.finish->reason, want.finish->reason);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.token_ids.size(), 7u);

  // A payload of another memory domain is refused at Submit.
  auto foreign = std::make_shared<KvExport>(*payload);
  foreign->device = std::make_shared<KvDeviceBytes>(
      payload->device->data(), payload->device->size(), "cuda:3", KvDeviceBytes::FreeFn());
  d.import_kv = foreign;
  const auto refused = decode_device->Submit(d);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("cuda:3"), std::string::npos) << refused.status();
  // Host and device payloads at once are not a valid export.
  KvExport both = *payload;
  both.bytes = host.bytes;
  EXPECT_EQ(both.Validate().code(), absl::StatusCode::kInvalidArgument);
  ExpectAllFree(*engine);
  ExpectAllFree(*whole_engine);
  ExpectAllFree(*decode_host);
  ExpectAllFree(*decode_device);
}

// When the first token ends the request, no final chunk follows it.
TEST_F(PdHandoffTest, StreamedExportStopsWhenTheFirstTokenFinishes) {
  EngineConfig config = TinyEngineConfig(64);
  config.scheduler.max_num_batched_tokens = 16;
  auto engine = MakeEngine(config, model());
  EngineRequest r = MakeRequest(RandomPrompt(40, 256, 6), 1);
  r.export_kv = true;
  r.stream_kv_export = true;
  auto h = engine->Submit(r);
  ASSERT_TRUE(h.ok());
  int64_t streamed = 0;
  bool token_seen = false;
  while (true) {
    std::optional<EngineEvent> ev = (*h)->Next(absl::Seconds(60));
    ASSERT_TRUE(ev.has_value());
    if (auto* c = std::get_if<KvChunkEvent>(&*ev)) {
      EXPECT_FALSE(token_seen) << "a chunk after a finishing token";
      streamed = c->end;
    } else if (std::holds_alternative<TokenEvent>(*ev)) {
      token_seen = true;
    } else {
      const FinishEvent& f = std::get<FinishEvent>(*ev);
      EXPECT_EQ(f.reason, FinishReason::kLength);
      EXPECT_EQ(f.kv_export, nullptr);
      EXPECT_FALSE(f.kv_exported);  // max_tokens 1 really ended it
      break;
    }
  }
  EXPECT_TRUE(token_seen);
  EXPECT_EQ(streamed, 32);  // the two full steps before the sampling one
  ExpectAllFree(*engine);
}

// Every KV dtype hands off its native bytes (scales included): the export
// shrinks with the dtype, disaggregated output equals one engine of the same
// dtype doing everything, and an engine of another dtype refuses the import.
TEST_F(PdHandoffTest, EveryKvDtypeHandsOffItsNativeBytes) {
  const ModelConfig& mc = model()->config();
  const int64_t f32_bytes =
      kernels::KvBytesPerToken(KvDtype::kF32, mc.num_layers, mc.num_kv_heads, mc.head_dim);
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
    SCOPED_TRACE(kernels::KvDtypeName(d));
    EngineConfig config = TinyEngineConfig(64);
    config.kv_cache_dtype = d;
    const EngineRequest r = MakeRequest(RandomPrompt(41, 256, 90), 12);
    auto alone = MakeEngine(config, model());
    const CollectedOutput colocated = Collect(**alone->Submit(r));
    auto prefill = MakeEngine(config, model());
    auto decode = MakeEngine(config, model());
    const Handoff h = RunDisaggregated(*prefill, *decode, r);
    ASSERT_NE(h.prefill.finish->kv_export, nullptr);
    const KvExport& kv = *h.prefill.finish->kv_export;
    EXPECT_TRUE(kv.Validate().ok()) << kv.Validate();
    EXPECT_EQ(kv.bytes_per_token,
              kernels::KvBytesPerToken(d, mc.num_layers, mc.num_kv_heads, mc.head_dim));
    EXPECT_EQ(kv.bytes_per_token, prefill->kv_bytes_per_token());
    EXPECT_EQ(static_cast<int64_t>(kv.bytes.size()), 41 * kv.bytes_per_token);
    if (d != KvDtype::kF32) {
      EXPECT_LT(kv.bytes_per_token, f32_bytes);
    }
    ExpectSameOutput(Concat(h), colocated, kernels::KvDtypeName(d));
    // Another dtype's engine refuses these bytes.
    EngineConfig other = config;
    other.kv_cache_dtype = kernels::KvHasScales(d) ? KvDtype::kF32 : KvDtype::kInt8;
    auto foreign = MakeEngine(other, model());
    EngineRequest imp = r;
    imp.import_kv = h.prefill.finish->kv_export;
    imp.prefix_output_token_ids = h.prefill.token_ids;
    auto refused = foreign->Submit(imp);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("bytes per token"), std::string::npos)
        << refused.status();
    ExpectAllFree(*alone);
    ExpectAllFree(*prefill);
    ExpectAllFree(*decode);
    ExpectAllFree(*foreign);
  }
}

}  // namespace
}  // namespace tandem::engine
