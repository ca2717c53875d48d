// Paths that tests use: goldens under tests/data and the default model.
#ifndef TANDEM_TESTS_UTIL_TEST_PATHS_H_
#define TANDEM_TESTS_UTIL_TEST_PATHS_H_

#include <cstdlib>
#include <string>

namespace tandem::testing {

inline std::string TestDataPath(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/" + name;
}

// $TANDEM_MODEL if set, else models/SmolLM2-135M-Instruct.Q4_1.gguf in the
// source tree (scripts/bootstrap.sh puts it there).
inline std::string DefaultModelPath() {
  const char* env = std::getenv("TANDEM_MODEL");
  if (env != nullptr && *env != '\0') return env;
  return TANDEM_DEFAULT_MODEL;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_TEST_PATHS_H_
