// `tandem bench`: a serving benchmark in the manner of `vllm bench serve`.
// Drives a running Tandem router over gRPC (or an OpenAI-compatible
// completions server) with fixed concurrency or Poisson / gamma arrivals,
// and reports TTFT, TPOT, ITL, e2e, throughput, goodput and errors as a
// table, a tandem.bench.v1 JSON file and a PNG plot.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/serve/backend.h"
#include "bench/serve/report.h"
#include "bench/serve/stats.h"
#include "bench/serve/workload.h"
#include "common/status.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/output_file.h"
#include "services/cli/security_flags.h"

namespace tandem::cli {
namespace {

using bench::Backend;
using bench::BenchRequest;
using bench::RequestRecord;
using bench::RunSummary;

constexpr int64_t kMaxThreads = 1024;

struct BenchFlags {
  std::string server = "127.0.0.1:50051";
  std::string backend = "grpc";
  std::string url;
  std::string model;
  std::string device;
  int64_t concurrency = 0;
  std::string request_rate;
  std::string request_rates;
  double burstiness = 1.0;
  int64_t num_requests = 64;
  int64_t warmup_requests = 0;
  int64_t seed = 0;
  int64_t input_len = 64;
  int64_t output_len = 32;
  double range_ratio = 0;
  std::string dataset;
  int64_t shared_prefix_len = 0;
  int64_t num_prefixes = 1;
  bool ignore_eos = true;
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  std::string out;
  std::string plot;
  double max_duration_s = 600;
  double timeout_s = 300;
  bool no_progress = false;
  std::string api_key;       // gRPC: --api-key, else $TANDEM_API_KEY
  services::TlsOptions tls;  // gRPC: --tls-ca [--tls-cert --tls-key]
};

absl::StatusOr<double> ParseRate(absl::string_view s) {
  if (s == "inf") return 0.0;
  double v = 0;
  if (!absl::SimpleAtod(s, &v) || !(v > 0) || !std::isfinite(v) || v > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("request rate '", s, "' must be a number in (0, 1e6] or inf"));
  }
  return v;
}

// Progress bar on stderr: requests done / total, elapsed.
class Progress {
 public:
  Progress(bool enabled, std::string label, int64_t total)
      : enabled_(enabled), label_(std::move(label)), total_(total), start_(absl::Now()) {
    if (enabled_) thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    Draw();
    std::fputc('\n', stderr);
  }
  void Done() { done_.fetch_add(1); }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!cv_.wait_for(l, std::chrono::milliseconds(250), [this] { return stop_; })) Draw();
  }
  void Draw() {
    const int64_t done = done_.load();
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::fprintf(stderr, "\r[bench] %s |%s%s| %lld/%lld requests, %.1f s", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '-').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_),
                 absl::ToDoubleSeconds(absl::Now() - start_));
    std::fflush(stderr);
  }
  bool enabled_;
  std::string label_;
  int64_t total_;
  absl::Time start_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Sends `requests`: request i is due at its arrival time (all at once for
// rate 0) and goes out when due and one of `workers` senders is free, so
// `workers` caps the concurrency. Nothing is sent after `run_deadline`, and
// every request's deadline is min(send + timeout, run_deadline).
RunSummary RunLoad(Backend& backend, const std::vector<BenchRequest>& requests, double rate,
                   double burstiness, int64_t workers, uint64_t seed, absl::Duration timeout,
                   absl::Duration max_duration, const bench::Slo& slo, Progress* progress) {
  const int64_t n = static_cast<int64_t>(requests.size());
  std::vector<double> due_s(static_cast<size_t>(n));
  bench::ArrivalGenerator arrivals(rate, burstiness, seed);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    due_s[i] = t;
    t += arrivals.NextGapSeconds();
  }
  std::vector<RequestRecord> records(static_cast<size_t>(n));
  std::vector<char> sent(static_cast<size_t>(n), 0);
  std::atomic<int64_t> next{0};
  const absl::Time start = absl::Now();
  const absl::Time run_deadline = start + max_duration;
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < std::min(workers, n); ++w) {
    threads.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        const absl::Time due = start + absl::Seconds(due_s[i]);
        if (due >= run_deadline) return;
        absl::SleepFor(due - absl::Now());
        const absl::Time now = absl::Now();
        if (now >= run_deadline) return;
        RequestRecord r = backend.Send(requests[i], std::min(now + timeout, run_deadline));
        r.index = i;
        r.start_ms = absl::ToDoubleMilliseconds(now - start);
        records[i] = std::move(r);
        sent[i] = 1;
        if (progress != nullptr) progress->Done();
      }
    });
  }
  for (auto& th : threads) th.join();
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<RequestRecord> done;
  for (int64_t i = 0; i < n; ++i) {
    if (sent[i]) done.push_back(std::move(records[i]));
  }
  RunSummary s = bench::Aggregate(std::move(done), wall_s, slo);
  s.request_rate = rate;
  s.burstiness = burstiness;
  return s;
}

// `--backend openai-http URL`: takes the URL that follows out of argv.
std::vector<char*> ExtractBackendUrl(int argc, char** argv, std::string* url) {
  std::vector<char*> out(argv, argv + argc);
  for (size_t i = 2; i + 2 < out.size(); ++i) {
    if (std::string(out[i]) == "--backend" && std::string(out[i + 1]) == "openai-http" &&
        std::string(out[i + 2]).rfind("--", 0) != 0) {
      *url = out[i + 2];
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      break;
    }
  }
  return out;
}

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "tandem bench: %s\n", msg.c_str());
  return code;
}

void AddBenchFlags(ArgParser& p, BenchFlags& f) {
  p.AddString("server", &f.server, "Tandem router address host:port (gRPC backend)");
  p.AddString("backend", &f.backend,
              "grpc | openai-http (then the URL: --backend openai-http URL)");
  p.AddString("url", &f.url, "OpenAI-compatible server, http://host:port (openai-http)");
  p.AddString("model", &f.model, "model name sent to an OpenAI-compatible server");
  p.AddString("device", &f.device, "device label written to the JSON (for tandem plan)");
  p.AddInt("concurrency", &f.concurrency, 0, kMaxThreads,
           "requests in flight at most (fixed-concurrency mode without a rate; default 4)");
  p.AddString("request-rate", &f.request_rate, "Poisson arrivals at R requests/s (or inf)");
  p.AddString("request-rates", &f.request_rates, "a sweep: R1,R2,R3 (one run per rate)");
  p.AddDouble("burstiness", &f.burstiness, 0.01, 100, "gamma shape of the arrivals, 1 = Poisson");
  p.AddInt("num-requests", &f.num_requests, 1, 100000, "requests per run");
  p.AddInt("warmup-requests", &f.warmup_requests, 0, 10000, "requests sent first, not measured");
  p.AddInt("seed", &f.seed, 0, INT64_MAX / 2, "seed of prompts, lengths and arrivals");
  p.AddInt("input-len", &f.input_len, 1, 1 << 20, "synthetic prompt tokens");
  p.AddInt("output-len", &f.output_len, 1, 1 << 20, "max_tokens per request");
  p.AddDouble("range-ratio", &f.range_ratio, 0, 0.999, "lengths uniform in len x [1-r, 1+r]");
  p.AddString("dataset", &f.dataset, "JSONL / text file of prompts (as tandem generate)");
  p.AddInt("shared-prefix-len", &f.shared_prefix_len, 0, 1 << 20,
           "tokens of a shared system prompt before each synthetic question");
  p.AddInt("num-prefixes", &f.num_prefixes, 1, 10000, "distinct shared prefixes");
  p.AddBool("ignore-eos", &f.ignore_eos, "generate exactly max_tokens (default true)");
  p.AddDouble("slo-ttft-ms", &f.slo_ttft_ms, 0, 1e9, "goodput: TTFT bound, 0 = none");
  p.AddDouble("slo-tpot-ms", &f.slo_tpot_ms, 0, 1e9, "goodput: TPOT bound, 0 = none");
  p.AddString("out", &f.out, "write the JSON (tandem.bench.v1 + runs) here");
  p.AddString("plot", &f.plot, "PNG of latency percentiles vs request rate (needs matplotlib)");
  p.AddDouble("max-duration-s", &f.max_duration_s, 0.1, 86400, "bound on each run's time");
  p.AddDouble("timeout-s", &f.timeout_s, 0.1, 86400, "deadline of every request");
  p.AddBool("no-progress", &f.no_progress, "no progress bar on stderr");
  p.AddString("api-key", &f.api_key,
              "gRPC: bearer key for a router with --api-key-file (default $TANDEM_API_KEY)");
  AddClientTlsFlags(p, f.tls);
}

// --request-rate and --request-rates as one list; empty in fixed-concurrency
// mode.
absl::StatusOr<std::vector<double>> ParseRates(const BenchFlags& f) {
  std::vector<double> rates;
  for (const std::string& list : {f.request_rate, f.request_rates}) {
    if (list.empty()) continue;
    for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      absl::StatusOr<double> r = ParseRate(absl::StripAsciiWhitespace(part));
      if (!r.ok()) return r.status();
      rates.push_back(*r);
    }
  }
  if (rates.size() > 32) return absl::InvalidArgumentError("at most 32 request rates");
  return rates;
}

// The client of --backend; InvalidArgument for bad flags.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BenchFlags& f) {
  if (f.backend == "grpc") {
    auto security = services::MakeChannelSecurity(f.tls);
    if (!security.ok()) return absl::InvalidArgumentError(security.status().message());
    return bench::MakeGrpcBackend(f.server, *security, ResolveApiKey(f.api_key));
  }
  if (f.backend == "openai-http") {
    if (f.url.empty()) return absl::InvalidArgumentError("--backend openai-http needs a URL");
    return bench::MakeOpenAiHttpBackend(f.url, f.model.empty() ? "default" : f.model);
  }
  return absl::InvalidArgumentError("--backend must be grpc or openai-http");
}

bench::WorkloadOptions WorkloadFor(const BenchFlags& f, const bench::ServerInfo& info) {
  bench::WorkloadOptions wo;
  wo.num_requests = f.num_requests + f.warmup_requests;
  wo.input_len = f.input_len;
  wo.output_len = f.output_len;
  wo.range_ratio = f.range_ratio;
  wo.shared_prefix_len = f.shared_prefix_len;
  wo.num_prefixes = f.num_prefixes;
  wo.dataset = f.dataset;
  wo.ignore_eos = f.ignore_eos;
  wo.seed = static_cast<uint64_t>(f.seed);
  wo.vocab_size = info.vocab_size;
  wo.context_length = info.context_length;
  return wo;
}

bench::ReportContext ContextFor(const BenchFlags& f, const bench::ServerInfo& info) {
  bench::ReportContext ctx;
  ctx.backend = f.backend;
  ctx.target = f.backend == "grpc" ? f.server : f.url;
  ctx.model = f.model.empty() ? info.model : f.model;
  ctx.device = f.device;
  ctx.workload = !f.dataset.empty()        ? "dataset"
                 : f.shared_prefix_len > 0 ? "shared-prefix"
                                           : "synthetic";
  ctx.slo = {f.slo_ttft_ms, f.slo_tpot_ms};
  ctx.seed = static_cast<uint64_t>(f.seed);
  return ctx;
}

// One measured run per rate (rate 0: closed loop at `workers`), each printed
// as it ends.
std::vector<RunSummary> RunRates(Backend& backend, const std::vector<BenchRequest>& measured,
                                 const std::vector<double>& rates, int64_t workers,
                                 const BenchFlags& f, const bench::ReportContext& ctx) {
  std::vector<RunSummary> runs;
  for (double rate : rates) {
    RunSummary s;
    {
      Progress progress(!f.no_progress,
                        rate > 0 ? absl::StrCat("rate ", rate) : absl::StrCat("c=", workers),
                        static_cast<int64_t>(measured.size()));
      s = RunLoad(backend, measured, rate, f.burstiness, workers, static_cast<uint64_t>(f.seed) + 1,
                  absl::Seconds(f.timeout_s), absl::Seconds(f.max_duration_s), ctx.slo, &progress);
    }
    s.max_concurrency = workers;
    bench::PrintRun(s, ctx, stdout);
    std::fflush(stdout);
    runs.push_back(std::move(s));
  }
  if (runs.size() > 1) bench::PrintSweep(runs, stdout);
  return runs;
}

// --out (the JSON) and --plot (the PNG, from that JSON).
absl::Status WriteOutputs(const std::vector<RunSummary>& runs, const bench::ReportContext& ctx,
                          const BenchFlags& f) {
  if (!f.out.empty()) {
    std::ofstream out(f.out, std::ios::binary | std::ios::trunc);
    out << bench::ToJson(runs, ctx);
    if (!out.good()) return absl::UnavailableError("cannot write " + f.out);
  }
  if (!f.plot.empty()) {
    TANDEM_RETURN_IF_ERROR(bench::Plot(f.out, f.plot));
    std::fprintf(stderr, "[bench] wrote %s\n", f.plot.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunBench(int argc, char** argv) {
  BenchFlags f;
  std::vector<char*> args = ExtractBackendUrl(argc, argv, &f.url);
  ArgParser p("bench", "Serving benchmark against a running endpoint (vllm bench serve style).");
  AddBenchFlags(p, f);
  if (absl::Status s = p.Parse(static_cast<int>(args.size()), args.data(), 2); !s.ok()) {
    return Fail(kExitUsage, std::string(s.message()));
  }
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<std::vector<double>> rates = ParseRates(f);
  if (!rates.ok()) return Fail(kExitUsage, std::string(rates.status().message()));
  const bool rate_mode = !rates->empty();
  if (!rate_mode) rates->push_back(0);
  const int64_t workers =
      f.concurrency > 0 ? f.concurrency : (rate_mode ? std::min<int64_t>(256, f.num_requests) : 4);
  if (!f.plot.empty() && f.out.empty()) f.out = f.plot + ".json";
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--plot", f.plot}, {"--out", f.out}}) {
    if (path.empty()) continue;
    if (absl::Status s = CheckOutputFile(flag, path); !s.ok()) {
      return Fail(kExitUsage, std::string(s.message()));
    }
  }

  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(f);
  if (!backend.ok()) return Fail(kExitUsage, std::string(backend.status().message()));
  absl::StatusOr<bench::ServerInfo> info =
      (*backend)->Probe(absl::Now() + std::min(absl::Seconds(10), absl::Seconds(f.timeout_s)));
  if (!info.ok()) return Fail(kExitFailure, std::string(info.status().message()));

  absl::StatusOr<std::vector<BenchRequest>> all = bench::BuildWorkload(WorkloadFor(f, *info));
  if (!all.ok()) return Fail(kExitUsage, std::string(all.status().message()));
  std::vector<BenchRequest> warmup(all->begin(), all->begin() + f.warmup_requests);
  std::vector<BenchRequest> measured(all->begin() + f.warmup_requests, all->end());
  const bench::ReportContext ctx = ContextFor(f, *info);

  if (!warmup.empty()) {
    Progress progress(!f.no_progress, "warmup", static_cast<int64_t>(warmup.size()));
    RunLoad(**backend, warmup, 0, 1, workers, 0, absl::Seconds(f.timeout_s),
            absl::Seconds(f.max_duration_s), ctx.slo, &progress);
  }
  const std::vector<RunSummary> runs = RunRates(**backend, measured, *rates, workers, f, ctx);
  if (absl::Status s = WriteOutputs(runs, ctx, f); !s.ok()) {
    return Fail(kExitFailure, std::string(s.message()));
  }
  const bool any_ok =
      std::any_of(runs.begin(), runs.end(), [](const RunSummary& r) { return r.completed > 0; });
  return any_ok ? kExitOk : kExitFailure;
}

}  // namespace tandem::cli
