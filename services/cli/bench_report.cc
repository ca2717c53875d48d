#include "services/cli/bench_report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json.h"

namespace tandem::cli::bench {
namespace {

std::string RateText(double rate) {
  return rate > 0 ? absl::StrFormat("%.3g req/s", rate) : std::string("inf");
}

void PrintDist(std::FILE* out, const char* name, const Distribution& d) {
  std::fprintf(out, "  %-12s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, d.mean, d.p50, d.p90,
               d.p99, d.max);
}

std::string DistJson(const std::string& name, const Distribution& d) {
  return absl::StrFormat(
      "\"mean_%s_ms\":%s,\"p50_%s_ms\":%s,\"p90_%s_ms\":%s,\"p99_%s_ms\":%s,\"max_%s_ms\":%s", name,
      json::Number(d.mean), name, json::Number(d.p50), name, json::Number(d.p90), name,
      json::Number(d.p99), name, json::Number(d.max));
}

std::string DoubleArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? "," : "", json::Number(v[i]));
  return out + "]";
}

// The metric fields of one run (tandem.bench.v1 names where the schema has
// them).
std::string MetricsJson(const RunSummary& r) {
  std::string errors = "{";
  for (const auto& [code, n] : r.errors) {
    absl::StrAppend(&errors, errors.size() > 1 ? "," : "", json::Quote(code), ":", n);
  }
  errors += "}";
  return absl::StrCat(
      absl::StrFormat(
          "\"request_rate\":%s,\"max_concurrency\":%d,\"burstiness\":%s,\"num_requests\":%d,"
          "\"completed\":%d,\"failed\":%d,\"duration_s\":%s,\"concurrency\":%s,"
          "\"mean_in_flight\":%s,\"request_throughput\":%s,\"output_tokens_per_second\":%s,"
          "\"total_tokens_per_second\":%s,\"goodput\":%s,\"good_requests\":%d,"
          "\"total_prompt_tokens\":%d,\"total_cached_tokens\":%d,\"total_output_tokens\":%d,"
          "\"prompt_tokens_mean\":%s,\"output_tokens_mean\":%s,\"errors\":%s,",
          r.request_rate > 0 ? json::Number(r.request_rate) : std::string("null"),
          r.max_concurrency, json::Number(r.burstiness), r.num_requests, r.completed, r.failed,
          json::Number(r.wall_s), json::Number(std::max(1.0, r.mean_in_flight)),
          json::Number(r.mean_in_flight), json::Number(r.request_throughput),
          json::Number(r.output_tokens_per_second), json::Number(r.total_tokens_per_second),
          json::Number(r.goodput), r.good_requests, r.total_prompt_tokens, r.total_cached_tokens,
          r.total_output_tokens, json::Number(r.prompt_tokens_mean),
          json::Number(r.output_tokens_mean), errors),
      DistJson("ttft", r.ttft), ",", DistJson("tpot", r.tpot), ",", DistJson("itl", r.itl), ",",
      DistJson("e2e", r.e2e));
}

std::string RecordJson(const RequestRecord& q) {
  return absl::StrFormat(
      "{\"index\":%d,\"ok\":%s,\"code\":%s,\"error\":%s,\"finish_reason\":%s,\"start_ms\":%s,"
      "\"ttft_ms\":%s,\"tpot_ms\":%s,\"e2e_ms\":%s,\"prompt_tokens\":%d,\"cached_tokens\":%d,"
      "\"output_tokens\":%d,\"num_chunks\":%d,\"itl_ms\":%s}",
      q.index, q.ok ? "true" : "false", json::Quote(q.error_code), json::Quote(q.error_message),
      json::Quote(q.finish_reason), json::Number(q.start_ms), json::Number(q.ttft_ms),
      json::Number(q.TpotMs()), json::Number(q.e2e_ms), q.prompt_tokens, q.cached_tokens,
      q.output_tokens, q.num_chunks, DoubleArray(q.itl_ms));
}

}  // namespace

void PrintRun(const RunSummary& r, const ReportContext& ctx, std::FILE* out) {
  std::fprintf(out, "bench: %s %s, model %s, %s workload, rate %s", ctx.backend.c_str(),
               ctx.target.c_str(), ctx.model.c_str(), ctx.workload.c_str(),
               RateText(r.request_rate).c_str());
  if (r.max_concurrency > 0) std::fprintf(out, ", max concurrency %d", (int)r.max_concurrency);
  std::fprintf(out, "\n");
  std::fprintf(out, "  requests          %d ok / %d sent in %.2f s (%d failed)\n", (int)r.completed,
               (int)r.num_requests, r.wall_s, (int)r.failed);
  std::fprintf(out, "  request rate      %.3f req/s  (goodput %.3f req/s, %d meet the SLOs)\n",
               r.request_throughput, r.goodput, (int)r.good_requests);
  std::fprintf(out, "  output tokens     %d  (%.1f tokens/s; prompt+output %.1f tokens/s)\n",
               (int)r.total_output_tokens, r.output_tokens_per_second, r.total_tokens_per_second);
  std::fprintf(out, "  prompt tokens     %d  (%d from the prefix cache)\n",
               (int)r.total_prompt_tokens, (int)r.total_cached_tokens);
  std::fprintf(out, "  mean in flight    %.2f\n", r.mean_in_flight);
  std::fprintf(out, "  %-12s %10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99", "max");
  PrintDist(out, "TTFT", r.ttft);
  PrintDist(out, "TPOT", r.tpot);
  PrintDist(out, "ITL", r.itl);
  PrintDist(out, "e2e", r.e2e);
  if (!r.errors.empty()) {
    std::vector<std::string> parts;
    for (const auto& [code, n] : r.errors) parts.push_back(absl::StrCat(code, " x", n));
    std::fprintf(out, "  errors            %s\n", absl::StrJoin(parts, ", ").c_str());
    for (const RequestRecord& q : r.records) {
      if (!q.ok) {
        std::fprintf(out, "  first error       %s: %s\n", q.error_code.c_str(),
                     q.error_message.c_str());
        break;
      }
    }
  }
}

void PrintSweep(const std::vector<RunSummary>& runs, std::FILE* out) {
  std::fprintf(out, "%10s %6s %9s %10s %9s %9s %9s %9s %9s %9s\n", "rate", "ok", "req/s", "tok/s",
               "goodput", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "e2e p99");
  for (const RunSummary& r : runs) {
    std::fprintf(out, "%10s %6d %9.3f %10.1f %9.3f %9.1f %9.1f %9.2f %9.2f %9.1f\n",
                 RateText(r.request_rate).c_str(), (int)r.completed, r.request_throughput,
                 r.output_tokens_per_second, r.goodput, r.ttft.p50, r.ttft.p99, r.tpot.p50,
                 r.tpot.p99, r.e2e.p99);
  }
}

std::string ToJson(const std::vector<RunSummary>& runs, const ReportContext& ctx) {
  std::string out =
      absl::StrFormat("{\"schema\":\"tandem.bench.v1\",\"backend\":%s,\"target\":%s,\"model\":%s,",
                      json::Quote(ctx.backend), json::Quote(ctx.target), json::Quote(ctx.model));
  if (!ctx.device.empty()) absl::StrAppend(&out, "\"device\":", json::Quote(ctx.device), ",");
  absl::StrAppend(&out, "\"workload\":", json::Quote(ctx.workload), ",\"seed\":", ctx.seed,
                  ",\"slo_ttft_ms\":", json::Number(ctx.slo.ttft_ms),
                  ",\"slo_tpot_ms\":", json::Number(ctx.slo.tpot_ms));
  if (!runs.empty()) absl::StrAppend(&out, ",", MetricsJson(runs.back()));
  out += ",\"runs\":[";
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", "{", MetricsJson(runs[i]), ",\"requests\":[");
    for (size_t k = 0; k < runs[i].records.size(); ++k) {
      absl::StrAppend(&out, k ? "," : "", RecordJson(runs[i].records[k]));
    }
    out += "]}";
  }
  return out + "]}\n";
}

absl::Status Plot(const std::string& json_path, const std::string& png_path) {
  const std::string src = TANDEM_SOURCE_DIR;
  std::string python = "python3";
  if (const char* env = std::getenv("TANDEM_PYTHON"); env != nullptr && *env) {
    python = env;
  } else if (access((src + "/.venv/bin/python").c_str(), X_OK) == 0) {
    python = src + "/.venv/bin/python";
  }
  const std::string script = src + "/tools/plot_bench.py";
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    execlp(python.c_str(), python.c_str(), script.c_str(), json_path.c_str(), png_path.c_str(),
           static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(python, " ", script, " failed (exit ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                            "); pip install -r tools/requirements.txt"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cli::bench
