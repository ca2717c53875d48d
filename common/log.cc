#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status InitLogging(const std::string& component) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(component, std::move(sink));
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  logger->flush_on(spdlog::level::info);
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  const spdlog::level::level_enum level = spdlog::level::from_str(env);
  // from_str answers "off" for any name it does not know.
  if (level == spdlog::level::off && std::string(env) != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("TANDEM_LOG_LEVEL: unknown level '", env,
                     "' (trace, debug, info, warn, error, critical or off); logging at info"));
  }
  logger->set_level(level);
  return absl::OkStatus();
}

}  // namespace tandem
