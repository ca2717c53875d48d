#include "services/cli/prompt_file.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status.h"

namespace tandem::cli {
namespace {

using json::Json;

absl::Status LineError(const std::string& name, int64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", name, line, what));
}

// Reads an optional number field; an integer field must hold an integer.
absl::Status GetNumber(const Json& obj, const char* key, bool integer, double* out, bool* present) {
  *present = false;
  auto it = obj.find(key);
  if (it == obj.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" must be a number", key));
  }
  const double v = it->get<double>();
  if (integer && (std::floor(v) != v || std::fabs(v) > 9.0e15)) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" must be an integer", key));
  }
  *out = v;
  *present = true;
  return absl::OkStatus();
}

absl::Status ApplyObject(const Json& obj, PromptSpec* spec) {
  if (!obj.is_object())
    return absl::InvalidArgumentError("a line starting with '{' must be an object");
  static const char* const kKnown[] = {"prompt", "max_tokens", "temperature", "top_k", "top_p",
                                       "min_p",  "seed",       "ignore_eos",  "stop"};
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) return absl::InvalidArgumentError(absl::StrFormat("unknown field \"%s\"", key));
  }
  auto prompt = obj.find("prompt");
  if (prompt == obj.end() || !prompt->is_string()) {
    return absl::InvalidArgumentError("\"prompt\" (a string) is required");
  }
  spec->text = prompt->get<std::string>();
  engine::SamplingParams& p = spec->params;
  double d;
  bool present;
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "max_tokens", true, &d, &present));
  if (present) p.stop.max_tokens = static_cast<int64_t>(d);
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "temperature", false, &d, &present));
  if (present) p.temperature = d;
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "top_k", true, &d, &present));
  if (present) p.top_k = static_cast<int64_t>(d);
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "top_p", false, &d, &present));
  if (present) p.top_p = d;
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "min_p", false, &d, &present));
  if (present) p.min_p = d;
  TANDEM_RETURN_IF_ERROR(GetNumber(obj, "seed", true, &d, &present));
  if (present) {
    if (d < 0) return absl::InvalidArgumentError("\"seed\" must be >= 0");
    p.seed = static_cast<uint64_t>(d);
  }
  if (auto v = obj.find("ignore_eos"); v != obj.end()) {
    if (!v->is_boolean()) return absl::InvalidArgumentError("\"ignore_eos\" must be a bool");
    p.stop.ignore_eos = v->get<bool>();
  }
  if (auto v = obj.find("stop"); v != obj.end()) {
    if (!v->is_array()) {
      return absl::InvalidArgumentError("\"stop\" must be an array of strings");
    }
    p.stop.stop_strings.clear();
    for (const Json& s : *v) {
      if (!s.is_string()) {
        return absl::InvalidArgumentError("\"stop\" must be an array of strings");
      }
      p.stop.stop_strings.push_back(s.get<std::string>());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PromptSpec>> ParsePrompts(const std::string& contents,
                                                     const std::string& name,
                                                     const engine::SamplingParams& defaults) {
  std::vector<PromptSpec> out;
  std::istringstream in(contents);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (static_cast<int64_t>(out.size()) >= kMaxPromptsPerFile) {
      return LineError(name, line_no, absl::StrFormat("more than %d prompts", kMaxPromptsPerFile));
    }
    PromptSpec spec;
    spec.line = line_no;
    spec.params = defaults;
    if (line.front() == '{') {
      auto obj = json::Parse(line);
      if (!obj.ok()) return LineError(name, line_no, std::string(obj.status().message()));
      if (absl::Status s = ApplyObject(*obj, &spec); !s.ok()) {
        return LineError(name, line_no, std::string(s.message()));
      }
    } else {
      spec.text = line;
    }
    if (absl::Status s = spec.params.Validate(); !s.ok()) {
      return LineError(name, line_no, std::string(s.message()));
    }
    out.push_back(std::move(spec));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrFormat("%s: no prompts", name));
  return out;
}

absl::StatusOr<std::vector<PromptSpec>> ReadPromptsFile(const std::string& path,
                                                        const engine::SamplingParams& defaults) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrFormat("--prompts-file: no regular file at '%s'", path));
  }
  constexpr uintmax_t kMaxBytes = uintmax_t{256} << 20;
  if (std::filesystem::file_size(path, ec) > kMaxBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--prompts-file: '%s' is larger than 256 MiB", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("--prompts-file: cannot read '%s'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParsePrompts(ss.str(), path, defaults);
}

}  // namespace tandem::cli
