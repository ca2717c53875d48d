#include "services/cli/args.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::cli {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::AddString(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, Kind::kString, out, 0, 0, 0, 0, help, *out});
}

void ArgParser::AddInt(const std::string& name, int64_t* out, int64_t min, int64_t max,
                       const std::string& help) {
  flags_.push_back({name, Kind::kInt, out, min, max, 0, 0, help, absl::StrCat(*out)});
}

void ArgParser::AddDouble(const std::string& name, double* out, double min, double max,
                          const std::string& help) {
  flags_.push_back({name, Kind::kDouble, out, 0, 0, min, max, help, absl::StrCat(*out)});
}

void ArgParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, Kind::kBool, out, 0, 0, 0, 0, help, *out ? "true" : "false"});
}

ArgParser::Flag* ArgParser::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool ArgParser::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status ArgParser::Assign(Flag& flag, const std::string& value) {
  const std::string flag_name = "--" + flag.name;
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.out) = value;
      break;
    case Kind::kInt: {
      int64_t v;
      if (!absl::SimpleAtoi(value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: '%s' is not an integer", flag_name, value));
      }
      if (v < flag.imin || v > flag.imax) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %d is out of range [%d, %d]", flag_name, v, flag.imin, flag.imax));
      }
      *static_cast<int64_t*>(flag.out) = v;
      break;
    }
    case Kind::kDouble: {
      double v;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: '%s' is not a finite number", flag_name, value));
      }
      if (v < flag.dmin || v > flag.dmax) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %g is out of range [%g, %g]", flag_name, v, flag.dmin, flag.dmax));
      }
      *static_cast<double*>(flag.out) = v;
      break;
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.out) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.out) = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: '%s' is not true or false", flag_name, value));
      }
      break;
  }
  flag.set = true;
  return absl::OkStatus();
}

absl::Status ArgParser::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (arg.size() < 3 || arg[0] != '-' || arg[1] != '-') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unexpected argument '%s' (flags look like --name value)", command_, arg));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unknown flag --%s (see tandem %s --help)", command_, name, command_));
    }
    if (!has_value) {
      if (flag->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
    }
    if (absl::Status s = Assign(*flag, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string ArgParser::Help() const {
  std::string out = absl::StrFormat("usage: tandem %s [flags]\n%s\n\nflags:\n", command_, summary_);
  for (const Flag& f : flags_) {
    std::string lhs = "  --" + f.name;
    if (f.kind != Kind::kBool) lhs += " VALUE";
    absl::StrAppendFormat(&out, "%-24s %s", lhs, f.help);
    if (!f.default_text.empty() && f.kind != Kind::kBool) {
      absl::StrAppendFormat(&out, " (default: %s)", f.default_text);
    }
    out += "\n";
  }
  return out;
}

}  // namespace tandem::cli
