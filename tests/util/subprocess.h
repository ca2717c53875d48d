// Runs a child process and captures its output (for tests that drive the
// real `tandem` binary).
#ifndef TANDEM_TESTS_UTIL_SUBPROCESS_H_
#define TANDEM_TESTS_UTIL_SUBPROCESS_H_

#include <string>
#include <vector>

namespace tandem::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal number if killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] (a path) with the given arguments and environment additions
// ("NAME=value"), waits for it, and returns its exit code and output.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::vector<std::string>& extra_env = {});

// Path of the built `tandem` binary ($TANDEM_TEST_BINARY when set: another
// build's, e.g. to measure an older tree with the same test).
std::string TandemBinary();

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_SUBPROCESS_H_
