// The `tandem` binary: one entry point, one subcommand per role.
#include <cstdio>
#include <cstring>
#include <string>

#include "services/cli/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: tandem <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve      start a router plus prefill and decode workers on loopback\n"
    "  router     run the router (public gRPC API) alone\n"
    "  prefill    run a prefill worker\n"
    "  decode     run a decode worker\n"
    "  client     call a running server's Generate API\n"
    "  bench      serving benchmark: TTFT, TPOT, ITL, throughput, goodput vs request rate\n"
    "  generate   generate text from a prompt with a local model\n"
    "  plan       capacity estimate: memory, batch, throughput, $/token, worker ratio\n"
    "  perplexity perplexity / KL divergence on a text file (llama-perplexity convention)\n"
    "  quantize   quantize a GGUF model (rtn, awq, gptq; Q4_0 .. Q6_K)\n"
    "  tokenize   print the token ids of a text\n"
    "  version    print the version and build configuration\n"
    "\n"
    "`tandem <command> --help` lists a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return tandem::cli::kExitUsage;
  }
  const std::string command = argv[1];
  if (command == "generate") return tandem::cli::RunGenerate(argc, argv);
  if (command == "serve") return tandem::cli::RunServe(argc, argv);
  if (command == "router") return tandem::cli::RunRouter(argc, argv);
  if (command == "prefill") return tandem::cli::RunPrefill(argc, argv);
  if (command == "decode") return tandem::cli::RunDecode(argc, argv);
  if (command == "client") return tandem::cli::RunClient(argc, argv);
  if (command == "bench") return tandem::cli::RunBench(argc, argv);
  if (command == "plan") return tandem::cli::RunPlan(argc, argv);
  if (command == "perplexity") return tandem::cli::RunPerplexity(argc, argv);
  if (command == "quantize") return tandem::cli::RunQuantize(argc, argv);
  if (command == "tokenize") return tandem::cli::RunTokenize(argc, argv);
  if (command == "version" || command == "--version") return tandem::cli::RunVersion(argc, argv);
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return tandem::cli::kExitOk;
  }
  std::fprintf(stderr, "tandem: unknown command '%s' (try tandem --help)\n", command.c_str());
  return tandem::cli::kExitUsage;
}
