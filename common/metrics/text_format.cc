#include "common/metrics/text_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <system_error>

namespace tandem::metrics {

void AppendValue(double v, std::string* out) {
  if (std::isnan(v)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "+Inf" : "-Inf");
    return;
  }
  char buf[64];
  std::to_chars_result r;
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    // Counters and token counts read better as integers than as "8e+05".
    r = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(v));
  } else {
    // Shortest round-trip digits, laid out as Go's strconv 'g' (what
    // client_golang emits): scientific only when the exponent is < -4 or >= 6.
    r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    if (r.ec == std::errc()) {
      std::string_view sci(buf, r.ptr - buf);
      const char* e = sci.data() + sci.find('e') + 1;
      if (*e == '+') ++e;  // from_chars takes no leading '+'
      int exp = 0;
      std::from_chars(e, r.ptr, exp);
      if (exp >= -4 && exp < 6) {
        r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
      }
    }
  }
  if (r.ec != std::errc()) {  // cannot happen with 64 bytes; keep output parseable
    out->append("NaN");
    return;
  }
  out->append(buf, r.ptr);
}

std::string FormatValue(double v) {
  std::string s;
  AppendValue(v, &s);
  return s;
}

void AppendEscapedLabelValue(std::string_view v, std::string* out) {
  for (char c : v) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '"':
        out->append("\\\"");
        break;
      case '\n':
        out->append("\\n");
        break;
      default:
        out->push_back(c);
    }
  }
}

void AppendEscapedHelp(std::string_view v, std::string* out) {
  for (char c : v) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

void AppendSample(std::string_view name, std::string_view labels, std::string_view extra,
                  double value, std::string* out) {
  out->append(name);
  if (!labels.empty() || !extra.empty()) {
    out->push_back('{');
    out->append(labels);
    if (!labels.empty() && !extra.empty()) out->push_back(',');
    out->append(extra);
    out->push_back('}');
  }
  out->push_back(' ');
  AppendValue(value, out);
  out->push_back('\n');
}

}  // namespace tandem::metrics
