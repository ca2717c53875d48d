// `tandem client`: a gRPC client of the public tandem.v1.Generation API.
// One request (--prompt), or a small load (--num-requests N --concurrency C,
// seeds --seed + i) with a TTFT / TPOT summary on stderr.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "grpcpp/create_channel.h"
#include "services/cli/args.h"
#include "services/cli/command_status.h"
#include "services/cli/commands.h"
#include "services/cli/run_stats.h"
#include "services/cli/security_flags.h"
#include "services/common/api_key.h"
#include "services/common/convert.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::cli {
namespace {

struct ClientFlags {
  std::string server = "127.0.0.1:50051";
  std::string prompt;
  std::string system;
  std::string request_id;
  int64_t max_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t seed = 0;
  bool chat = false;
  bool json = false;
  bool stream = false;
  bool ignore_eos = false;
  int64_t timeout_ms = 0;
  int64_t cancel_after_tokens = 0;
  int64_t num_requests = 1;
  int64_t concurrency = 1;
  std::string api_key;       // --api-key, else $TANDEM_API_KEY
  services::TlsOptions tls;  // --tls-ca [--tls-cert --tls-key]
};

struct Result {
  std::string request_id;
  std::vector<int32_t> token_ids;
  std::string text;
  std::string finish_reason;
  tandem::v1::Usage usage;
  tandem::v1::Timings timings;
  grpc::Status status;
};

Result RunOne(tandem::v1::Generation::Stub& stub, const ClientFlags& f, int64_t index,
              bool print_stream) {
  tandem::v1::GenerateRequest req;
  if (!f.request_id.empty()) {
    req.set_request_id(f.num_requests > 1 ? absl::StrCat(f.request_id, "-", index) : f.request_id);
  }
  if (f.chat) {
    auto* msgs = req.mutable_messages();
    if (!f.system.empty()) {
      auto* m = msgs->add_messages();
      m->set_role("system");
      m->set_content(f.system);
    }
    auto* m = msgs->add_messages();
    m->set_role("user");
    m->set_content(f.prompt);
  } else {
    req.set_text(f.prompt);
  }
  req.mutable_sampling()->set_temperature(f.temperature);
  req.mutable_sampling()->set_top_p(f.top_p);
  req.mutable_sampling()->set_top_k(static_cast<int32_t>(f.top_k));
  req.mutable_sampling()->set_seed(static_cast<uint64_t>(f.seed + index));
  req.mutable_stop()->set_max_tokens(static_cast<int32_t>(f.max_tokens));
  req.mutable_stop()->set_ignore_eos(f.ignore_eos);

  grpc::ClientContext ctx;
  if (!f.api_key.empty()) {
    ctx.AddMetadata(services::kAuthorizationMetadataKey, "Bearer " + f.api_key);
  }
  if (f.timeout_ms > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(f.timeout_ms));
  }
  Result r;
  auto reader = stub.Generate(&ctx, req);
  tandem::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    r.request_id = resp.request_id();
    r.token_ids.insert(r.token_ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    r.text += resp.text();
    if (print_stream && !resp.text().empty()) {
      std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
      std::fflush(stdout);
    }
    if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      r.finish_reason = services::FinishReasonName(resp.finish_reason());
      r.usage = resp.usage();
      r.timings = resp.timings();
    }
    if (f.cancel_after_tokens > 0 &&
        static_cast<int64_t>(r.token_ids.size()) >= f.cancel_after_tokens) {
      ctx.TryCancel();
    }
  }
  r.status = reader->Finish();
  return r;
}

std::string JsonLine(const Result& r) {
  const json::OrderedJson line = {{"request_id", r.request_id},
                                  {"token_ids", r.token_ids},
                                  {"text", r.text},
                                  {"finish_reason", r.finish_reason},
                                  {"prompt_tokens", r.usage.prompt_tokens()},
                                  {"cached_tokens", r.usage.cached_tokens()},
                                  {"completion_tokens", r.usage.completion_tokens()},
                                  {"queue_ms", r.timings.queue_seconds() * 1e3},
                                  {"ttft_ms", r.timings.ttft_seconds() * 1e3},
                                  {"tpot_ms", r.timings.mean_tpot_seconds() * 1e3},
                                  {"e2e_ms", r.timings.e2e_seconds() * 1e3}};
  return json::Dump(line) + "\n";
}

}  // namespace

namespace {

void AddClientFlags(ArgParser& p, ClientFlags& f) {
  p.AddString("server", &f.server, "router address host:port");
  p.AddString("prompt", &f.prompt, "prompt text (required)");
  p.AddBool("chat", &f.chat,
            "send the prompt as a user chat message (server applies the template)");
  p.AddString("system", &f.system, "system message for --chat");
  p.AddString("request-id", &f.request_id, "request id (default: assigned by the server)");
  p.AddInt("max-tokens", &f.max_tokens, 1, 1 << 20, "tokens to generate at most");
  p.AddDouble("temperature", &f.temperature, 0.0, 100.0, "sampling temperature, 0 = greedy");
  p.AddDouble("top-p", &f.top_p, 1e-9, 1.0, "nucleus sampling mass, 1 = off");
  p.AddInt("top-k", &f.top_k, 0, 1 << 30, "keep the k most likely tokens, 0 = off");
  p.AddInt("seed", &f.seed, 0, INT64_MAX, "random seed (request i uses seed + i)");
  p.AddBool("ignore-eos", &f.ignore_eos, "generate past EOS until --max-tokens");
  p.AddBool("json", &f.json, "print one JSON object per request (token_ids, text, usage, timings)");
  p.AddBool("stream", &f.stream, "print text deltas as they arrive (single request)");
  p.AddInt("timeout-ms", &f.timeout_ms, 0, INT64_MAX / 2, "gRPC deadline, 0 = none");
  p.AddInt("cancel-after-tokens", &f.cancel_after_tokens, 0, 1 << 20,
           "cancel the call after this many tokens (testing), 0 = never");
  p.AddInt("num-requests", &f.num_requests, 1, 100000, "requests to send");
  p.AddInt("concurrency", &f.concurrency, 1, 1024, "requests in flight at once");
  p.AddString("api-key", &f.api_key,
              "bearer key for a router started with --api-key-file (default $TANDEM_API_KEY)");
  AddClientTlsFlags(p, f.tls);
}

// Prints each result (JSON lines, or the text) and the summary on stderr;
// exit 1 when any request failed.
int Report(const ClientFlags& f, const std::vector<Result>& results, double wall_s,
           bool print_stream) {
  int exit_code = kExitOk;
  std::vector<double> ttft, tpot;
  int64_t tokens = 0;
  for (const Result& r : results) {
    if (!r.status.ok()) {
      std::fprintf(stderr, "tandem client: request failed: gRPC status %d: %s\n",
                   static_cast<int>(r.status.error_code()), r.status.error_message().c_str());
      exit_code = kExitFailure;
      continue;
    }
    ttft.push_back(r.timings.ttft_seconds() * 1e3);
    if (r.usage.completion_tokens() > 1) tpot.push_back(r.timings.mean_tpot_seconds() * 1e3);
    tokens += r.usage.completion_tokens();
    if (f.json) {
      std::fputs(JsonLine(r).c_str(), stdout);
    } else if (print_stream) {
      std::fputc('\n', stdout);
    } else if (f.num_requests == 1) {
      std::printf("%s\n", r.text.c_str());
    }
  }
  std::fflush(stdout);
  if (f.num_requests > 1 || !f.json) {
    std::fprintf(stderr,
                 "[client] %d requests, %d tokens in %.2f s (%.1f tokens/s); TTFT ms p50 %.1f "
                 "p99 %.1f; TPOT ms p50 %.2f p99 %.2f\n",
                 static_cast<int>(f.num_requests), static_cast<int>(tokens), wall_s,
                 wall_s > 0 ? tokens / wall_s : 0.0, Quantile(ttft, 0.5), Quantile(ttft, 0.99),
                 Quantile(tpot, 0.5), Quantile(tpot, 0.99));
  }
  return exit_code;
}

}  // namespace

int RunClient(int argc, char** argv) {
  ClientFlags f;
  ArgParser p("client", "Calls tandem.v1.Generation/Generate on a running server.");
  AddClientFlags(p, f);
  if (absl::Status s = p.Parse(argc, argv, 2); !s.ok()) return ExitFor("client", UsageStatus(s));
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!p.WasSet("prompt")) return ExitFor("client", UsageStatus("--prompt is required"));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  f.api_key = ResolveApiKey(f.api_key);
  auto security = services::MakeChannelSecurity(f.tls);
  if (!security.ok()) return ExitFor("client", UsageStatus(security.status()));
  auto channel = services::CreateChannel(f.server, *security, args);
  auto stub = tandem::v1::Generation::NewStub(channel);

  std::vector<Result> results(static_cast<size_t>(f.num_requests));
  std::atomic<int64_t> next{0};
  const bool print_stream = f.stream && !f.json && f.num_requests == 1;
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < std::min(f.concurrency, f.num_requests); ++t) {
    threads.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < f.num_requests;) {
        results[i] = RunOne(*stub, f, i, print_stream);
      }
    });
  }
  for (auto& t : threads) t.join();
  return Report(f, results, absl::ToDoubleSeconds(absl::Now() - start), print_stream);
}

}  // namespace tandem::cli
