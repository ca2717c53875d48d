// PrefillWorker.Prefill is a server stream (the first token as soon as it is
// sampled, then kv_landed or a finish_reason); tests that only care about
// the outcome fold it into one PrefillResponse: the token fields of the
// first message, the transfer fields and finish of the later one.
#ifndef TANDEM_TESTS_UTIL_PREFILL_CALL_H_
#define TANDEM_TESTS_UTIL_PREFILL_CALL_H_

#include <string>

#include "grpcpp/client_context.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::testing {

inline grpc::Status CallPrefill(tandem::v1::PrefillWorker::StubInterface& stub,
                                grpc::ClientContext* ctx, const tandem::v1::PrefillRequest& req,
                                tandem::v1::PrefillResponse* out, int* num_messages = nullptr) {
  out->Clear();
  auto reader = stub.Prefill(ctx, req);
  tandem::v1::PrefillResponse m;
  int n = 0;
  while (reader->Read(&m)) {
    if (n++ == 0) {
      *out = m;
      continue;
    }
    const int32_t token = out->first_token_id();
    const std::string text = out->first_text() + m.first_text();
    const tandem::v1::PositionLogprobs logprobs = out->first_logprobs();
    out->MergeFrom(m);
    if (token >= 0) out->set_first_token_id(token);
    out->set_first_text(text);
    *out->mutable_first_logprobs() = logprobs;
  }
  if (num_messages != nullptr) *num_messages = n;
  return reader->Finish();
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_PREFILL_CALL_H_
