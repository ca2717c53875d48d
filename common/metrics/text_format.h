// Pieces of the Prometheus text exposition format 0.0.4, shared by the metric
// types and tested on their own. Stateless and thread-safe.
#ifndef TANDEM_COMMON_METRICS_TEXT_FORMAT_H_
#define TANDEM_COMMON_METRICS_TEXT_FORMAT_H_

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem::metrics {

// This Abseil build's string_view is its own type: absl::StrCat and
// heterogeneous flat_hash_map lookups need it.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Appends a sample value: "+Inf", "-Inf", "NaN"; integral values below 1e15
// in plain digits ("800000"); anything else in the shortest digits that parse
// back to the same double, laid out like Go's strconv.FormatFloat(v, 'g', -1)
// ("0.0001", "2.5", "1e-05", "1.5e+300").
void AppendValue(double v, std::string* out);
std::string FormatValue(double v);

// Label values escape backslash, double quote and line feed.
void AppendEscapedLabelValue(std::string_view v, std::string* out);
// HELP text escapes backslash and line feed only.
void AppendEscapedHelp(std::string_view v, std::string* out);

// Appends `name{labels,extra} value\n`; braces are left out when both `labels`
// and `extra` are empty. `labels` and `extra` are already escaped.
void AppendSample(std::string_view name, std::string_view labels, std::string_view extra,
                  double value, std::string* out);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_TEXT_FORMAT_H_
