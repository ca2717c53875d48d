// What a client submits to the Engine and what it gets back.
//
// A request's output is a stream of EngineEvents: zero or more TokenEvents
// then exactly one FinishEvent, delivered in order through its
// RequestStream. The engine thread pushes; any thread consumes, either by
// polling Next() (blocking, with a timeout) or by a callback given in the
// request (then Next() sees nothing). The callback runs on the engine thread:
// it must be quick and must not call back into the Engine except Cancel().
//
// Thread safety: RequestStream is thread-safe. EngineRequest and the event
// structs are plain values.
#ifndef TANDEM_ENGINE_REQUEST_STREAM_H_
#define TANDEM_ENGINE_REQUEST_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/finish_reason.h"
#include "engine/kv_export.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace tandem::engine {

struct TokenEvent {
  int32_t token_id = 0;
  std::string text;  // UTF-8 text delta (may be empty: held back or no tokenizer)
  // Set when SamplingParams::num_logprobs is set: logprob of token_id and the
  // top alternatives (see SampleResult).
  std::optional<SampleResult> logprobs;
};

struct Usage {
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  int64_t num_completion_tokens = 0;
  int64_t num_preemptions = 0;
  double queue_time_s = 0;            // submit -> first scheduled
  double ttft_s = 0;                  // submit -> first token (0 when none)
  double e2e_s = 0;                   // submit -> finish
  std::vector<double> token_times_s;  // [num_completion_tokens] submit -> each token
};

struct FinishEvent {
  FinishReason reason = FinishReason::kLength;
  absl::Status status;  // non-OK only for kError
  std::string text;     // held-back text released at the end (cancel), usually empty
  Usage usage;
  // EngineRequest::export_kv only: the K/V of every computed token (the
  // prompt, plus prefix_output_token_ids) taken before the blocks were freed,
  // when the request ends after its first token only because it was
  // exported; then `reason` is kLength and means "continues elsewhere". Null
  // when the first token already finished the request (EOS / stop /
  // max_tokens == 1: reason is the real one), on cancel and on error.
  std::shared_ptr<const KvExport> kv_export;
  // EngineRequest::export_kv only: true when the request ends here only
  // because its K/V was exported (kv_export, or the KvChunkEvents, cover
  // every computed token); false when the first token really ended it.
  bool kv_exported = false;
};

// EngineRequest::stream_kv_export only: the K/V of tokens [begin, end) of
// prompt + prefix_output_token_ids in engine/kv_export.h's layout
// (bytes.size() == (end - begin) * bytes_per_token), pushed as soon as a step
// has computed them, so a prefill worker can ship them while the rest of the
// prompt is still being computed. Chunks are contiguous and in order, start
// at 0 and, when the request continues elsewhere (its FinishEvent is kLength
// after one token), the last one ends at the export's token count and comes
// after that TokenEvent, before the FinishEvent. When the first token ends
// the request (EOS, stop, max_tokens 1), on cancel and on error the chunks
// stop early: the receiver must drop what it got.
// With EngineRequest::kv_export_on_device the chunk is in `device` (the
// executor's KV memory domain) and `bytes` is empty.
struct KvChunkEvent {
  int64_t begin = 0;
  int64_t end = 0;
  std::string bytes;
  std::shared_ptr<const KvDeviceBytes> device;
  int64_t size() const {
    return device != nullptr ? device->size() : static_cast<int64_t>(bytes.size());
  }
};

using EngineEvent = std::variant<TokenEvent, KvChunkEvent, FinishEvent>;
using EventCallback = std::function<void(const EngineEvent&)>;

struct EngineRequest {
  std::string request_id;  // for logs and clients; the engine keys on its own ids
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;   // includes params.stop
  uint64_t extra_key = 0;  // prefix-cache namespace (cache salt)
  EventCallback on_event;  // optional: events go here instead of Next()

  // Disaggregation (prefill / decode workers, migration).
  //
  // Prefill-only: run the prompt, sample one token, emit it, finish; the
  // FinishEvent carries the K/V (FinishEvent::kv_export).
  bool export_kv = false;
  // With export_kv: the K/V goes out as KvChunkEvents while the prompt is
  // computed instead of as FinishEvent::kv_export (which stays null).
  bool stream_kv_export = false;
  // With stream_kv_export: each chunk is copied into new memory of the
  // executor's KV memory domain (KvChunkEvent::device: device memory on CUDA,
  // for the NCCL handoff without host staging) instead of host bytes.
  bool kv_export_on_device = false;
  // K/V of the leading tokens of prompt + prefix_output_token_ids (its
  // token_ids must equal them; fewer than all of them, so at least one token
  // is computed here to produce logits). The engine writes it into freshly
  // allocated blocks at admission instead of computing those tokens; a cache
  // prefix hit is used where it covers more. Geometry must match the model.
  std::shared_ptr<const KvExport> import_kv;
  // Output tokens already generated and delivered elsewhere (the prefill
  // worker's first token; the tokens before a migration). They count as
  // output for positions, the RNG, penalties, stop checks, max_tokens and the
  // detokenizer state, but are not emitted as events. When the last of them
  // already ends the request (max_tokens, EOS, a stop), the request finishes
  // at once with that reason and no tokens; an earlier one that ends it is
  // InvalidArgument.
  std::vector<int32_t> prefix_output_token_ids;
};

// One request's event stream (the handle Submit returns).
class RequestStream {
 public:
  RequestStream(int64_t id, std::string request_id, EventCallback callback);

  int64_t id() const { return id_; }
  const std::string& request_id() const { return request_id_; }

  // The next event, waiting up to `timeout`; nullopt on timeout, or once the
  // FinishEvent has been returned.
  std::optional<EngineEvent> Next(absl::Duration timeout = absl::InfiniteDuration());

  // True once the FinishEvent has been pushed (maybe not yet consumed).
  bool finished() const;

  // Engine side. REQUIRES: nothing after a FinishEvent.
  void Push(EngineEvent event);

 private:
  const int64_t id_;
  const std::string request_id_;
  const EventCallback callback_;
  mutable absl::Mutex mu_;
  std::deque<EngineEvent> events_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

using RequestHandle = std::shared_ptr<RequestStream>;

// Drains a stream (test and CLI helper): the tokens and the finish event.
struct CollectedOutput {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // when requested
  std::string text;
  std::optional<FinishEvent> finish;  // nullopt on timeout
};
CollectedOutput Collect(RequestStream& stream, absl::Duration timeout = absl::Seconds(120));

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_REQUEST_STREAM_H_
