// Subcommands of the `tandem` binary. Each returns the process exit code:
// 0 on success, 1 on a runtime failure, 2 on bad flags or unusable input
// (a one-line error on stderr).
#ifndef TANDEM_SERVICES_CLI_COMMANDS_H_
#define TANDEM_SERVICES_CLI_COMMANDS_H_

#include <string>

namespace tandem::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// argv[0] is the binary, argv[1] the subcommand; flags start at argv[2].
int RunGenerate(int argc, char** argv);
int RunPlan(int argc, char** argv);
int RunVersion(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunRouter(int argc, char** argv);      // router_cmd.cc
int RunPrefill(int argc, char** argv);     // workers.cc
int RunDecode(int argc, char** argv);      // workers.cc
int RunServe(int argc, char** argv);       // serve.cc
int RunClient(int argc, char** argv);      // client.cc
int RunBench(int argc, char** argv);       // bench/serve/command.cc (tandem_bench_serve)
int RunPerplexity(int argc, char** argv);  // perplexity.cc
int RunQuantize(int argc, char** argv);    // quantize.cc

// The long-running commands (router, prefill, decode, serve) log through
// spdlog from here on (common/log.h); a bad TANDEM_LOG_LEVEL is a warning.
void LogInit(const std::string& component);  // router_cmd.cc

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_COMMANDS_H_
