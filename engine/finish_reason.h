// Why a request (and its sequence) ended: the engine's one finish-reason
// type. The scheduler finishes a sequence with it, the stop checker and the
// output processor decide it, the request stream reports it, and
// services/common/convert maps it to the wire's tandem.v1.FinishReason.
#ifndef TANDEM_ENGINE_FINISH_REASON_H_
#define TANDEM_ENGINE_FINISH_REASON_H_

#include <string_view>

namespace tandem::engine {

enum class FinishReason {
  kEos,        // an end-of-generation token (not emitted as text)
  kStop,       // a stop token id or stop string
  kLength,     // max_tokens or the model's context length
  kCancelled,  // Engine::Cancel, Scheduler::Cancel or engine shutdown
  kError,      // rejected or failed; FinishEvent::status says why
};

// "eos", "stop", "length", "cancelled", "error".
std::string_view FinishReasonName(FinishReason reason);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_FINISH_REASON_H_
