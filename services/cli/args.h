// The flag parser of the `tandem` subcommands, on CLI11 (Debian
// libcli11-dev): this class keeps the project's conventions on top of it.
//
// Accepts `--name value` and `--name=value`; boolean flags take no value
// (`--json`) or an explicit `--json=true|false`. Every malformed input
// (unknown flag, missing value, number out of range or with trailing junk,
// a positional argument) is an InvalidArgument naming the flag, so the caller
// can print one line and exit 2.
#ifndef TANDEM_SERVICES_CLI_ARGS_H_
#define TANDEM_SERVICES_CLI_ARGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);
  ~ArgParser();
  ArgParser(const ArgParser&) = delete;
  ArgParser& operator=(const ArgParser&) = delete;

  // `out` keeps its value when the flag is absent (that is the default).
  void AddString(const std::string& name, std::string* out, const std::string& help);
  void AddInt(const std::string& name, int64_t* out, int64_t min, int64_t max,
              const std::string& help);
  void AddDouble(const std::string& name, double* out, double min, double max,
                 const std::string& help);
  void AddBool(const std::string& name, bool* out, const std::string& help);

  // Parses argv[first..argc). --help / -h sets help_requested() and stops.
  absl::Status Parse(int argc, char** argv, int first);
  bool help_requested() const { return help_requested_; }
  // True if the flag appeared on the command line.
  bool WasSet(const std::string& name) const;
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
  };

  std::string command_;
  std::string summary_;
  std::unique_ptr<CLI::App> app_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_ARGS_H_
