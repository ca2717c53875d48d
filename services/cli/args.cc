#include "services/cli/args.h"

#include <CLI/CLI.hpp>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::cli {
namespace {

// CLI11 validators that keep the project's messages ("--name: 0 is out of
// range [1, 100]"); CLI11 prefixes the flag name.
CLI::Validator IntIn(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        int64_t v;
        if (!absl::SimpleAtoi(value, &v)) return absl::StrFormat("'%s' is not an integer", value);
        if (v < lo || v > hi) return absl::StrFormat("%d is out of range [%d, %d]", v, lo, hi);
        return "";
      },
      absl::StrFormat("INT in [%d, %d]", lo, hi));
}

CLI::Validator DoubleIn(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        double v;
        if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
          return absl::StrFormat("'%s' is not a finite number", value);
        }
        if (v < lo || v > hi) return absl::StrFormat("%g is out of range [%g, %g]", v, lo, hi);
        return "";
      },
      absl::StrFormat("NUMBER in [%g, %g]", lo, hi));
}

}  // namespace

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)),
      summary_(std::move(summary)),
      app_(std::make_unique<CLI::App>(summary_, "tandem " + command_)) {
  // -h / --help is handled in Parse (Help() below lists the flags).
  app_->set_help_flag();
  app_->allow_extras(false);
}

ArgParser::~ArgParser() = default;

void ArgParser::AddString(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, help, *out, false});
  app_->add_option("--" + name, *out, help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void ArgParser::AddInt(const std::string& name, int64_t* out, int64_t min, int64_t max,
                       const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*out), false});
  app_->add_option("--" + name, *out, help)
      ->check(IntIn(min, max))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void ArgParser::AddDouble(const std::string& name, double* out, double min, double max,
                          const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*out), false});
  app_->add_option("--" + name, *out, help)
      ->check(DoubleIn(min, max))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void ArgParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, help, *out ? "true" : "false", true});
  app_->add_flag("--" + name, *out, help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

bool ArgParser::WasSet(const std::string& name) const {
  const CLI::Option* o = app_->get_option_no_throw("--" + name);
  return o != nullptr && o->count() > 0;
}

absl::Status ArgParser::Parse(int argc, char** argv, int first) {
  // CLI11 parses argv[1..]; hand it [program, argv[first]..].
  std::vector<std::string> args;
  for (int i = argc - 1; i >= first; --i) args.emplace_back(argv[i]);  // reversed, as CLI11 wants
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      help_requested_ = true;
      return absl::OkStatus();
    }
  }
  try {
    app_->parse(args);
  } catch (const CLI::ExtrasError&) {
    // Name the first argument that is not ours, in the order given.
    for (int i = first; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--", 0) == 0 && a.size() > 2) {
        const std::string name = a.substr(0, a.find('='));
        if (app_->get_option_no_throw(name) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrFormat("unknown flag %s (see tandem %s --help)", name, command_));
        }
        continue;
      }
      bool is_value = false;  // the value of the flag before it
      if (i > first) {
        const std::string prev = argv[i - 1];
        for (const Flag& f : flags_) is_value |= !f.is_bool && prev == "--" + f.name;
      }
      if (!is_value) {
        return absl::InvalidArgumentError(
            absl::StrFormat("unexpected argument '%s' (flags look like --name value)", a));
      }
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("unexpected arguments (see tandem %s --help)", command_));
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

std::string ArgParser::Help() const {
  std::string out = absl::StrFormat("usage: tandem %s [flags]\n%s\n\nflags:\n", command_, summary_);
  for (const Flag& f : flags_) {
    std::string lhs = "  --" + f.name;
    if (!f.is_bool) lhs += " VALUE";
    absl::StrAppendFormat(&out, "%-24s %s", lhs, f.help);
    if (!f.default_text.empty() && !f.is_bool) {
      absl::StrAppendFormat(&out, " (default: %s)", f.default_text);
    }
    out += "\n";
  }
  return out;
}

}  // namespace tandem::cli
