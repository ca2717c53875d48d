#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics/text_format.h"
#include "common/utf8.h"

namespace tandem::metrics {
namespace {

bool IsNameChar(char c, bool first, bool allow_colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (allow_colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool IsValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, allow_colon)) return false;
  }
  return true;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    size_t len = utf8::ValidUtf8Len(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

// The series names a family of `type` called `name` emits.
std::vector<std::string> SeriesNames(std::string_view name, MetricType type) {
  if (type != MetricType::kHistogram) return {std::string(name)};
  return {std::string(name), absl::StrCat(Sv(name), "_bucket"), absl::StrCat(Sv(name), "_sum"),
          absl::StrCat(Sv(name), "_count")};
}

}  // namespace

std::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool IsValidMetricName(std::string_view name) { return IsValidName(name, /*allow_colon=*/true); }
bool IsValidLabelName(std::string_view name) { return IsValidName(name, /*allow_colon=*/false); }

// ---- FamilyBase ----

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names, int max_children)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      max_children_(max_children) {}

absl::StatusOr<Metric*> FamilyBase::GetOrCreate(absl::Span<const std::string_view> values) {
  if (values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": expected ", label_names_.size(),
                                                   " label values, got ", values.size()));
  }
  std::string key;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) key.push_back('\xff');
    key.append(values[i]);
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = children_.find(key);
    if (it != children_.end()) return it->second->metric.get();
  }
  for (std::string_view v : values) {
    if (!IsValidUtf8(v)) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": label value is not valid UTF-8"));
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  if (it != children_.end()) return it->second->metric.get();
  if (static_cast<int>(children_.size()) >= max_children_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": more than ", max_children_, " label combinations"));
  }
  auto child = std::make_unique<Child>();
  for (size_t i = 0; i < values.size(); ++i) {
    child->values.emplace_back(values[i]);
    if (i > 0) child->labels_text.push_back(',');
    absl::StrAppend(&child->labels_text, label_names_[i], "=\"");
    AppendEscapedLabelValue(values[i], &child->labels_text);
    child->labels_text.push_back('"');
  }
  child->metric = NewChild();
  Metric* metric = child->metric.get();
  children_.emplace(std::move(key), std::move(child));
  return metric;
}

absl::StatusOr<Metric*> FamilyBase::GetOrCreateByName(absl::Span<const LabelPair> labels) {
  if (labels.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": expected labels {",
                                                   absl::StrJoin(label_names_, ","), "}, got ",
                                                   labels.size(), " labels"));
  }
  std::vector<std::string_view> values(label_names_.size());
  std::vector<bool> seen(label_names_.size(), false);
  for (const LabelPair& label : labels) {
    auto it = std::find(label_names_.begin(), label_names_.end(), label.first);
    if (it == label_names_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": unknown label name \"", Sv(label.first), "\""));
    }
    size_t i = it - label_names_.begin();
    if (seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": label \"", Sv(label.first), "\" given twice"));
    }
    seen[i] = true;
    values[i] = label.second;
  }
  return GetOrCreate(values);
}

void FamilyBase::Serialize(std::string* out) const {
  // Children never move or die, so their pointers outlive the lock; reading
  // values (and calling gauge callbacks) happens without it.
  std::vector<const Child*> children;
  {
    absl::ReaderMutexLock lock(&mu_);
    children.reserve(children_.size());
    for (const auto& [key, child] : children_) children.push_back(child.get());
  }
  if (children.empty()) return;
  std::sort(children.begin(), children.end(),
            [](const Child* a, const Child* b) { return a->values < b->values; });
  absl::StrAppend(out, "# HELP ", name_, " ");
  AppendEscapedHelp(help_, out);
  absl::StrAppend(out, "\n# TYPE ", name_, " ", Sv(MetricTypeName(type_)), "\n");
  for (const Child* child : children) child->metric->AppendSamples(name_, child->labels_text, out);
}

// ---- MetricsRegistry ----

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounter(std::string_view name,
                                                           std::string_view help,
                                                           std::vector<std::string> label_names) {
  absl::StatusOr<FamilyBase*> f = Add(name, help, MetricType::kCounter, std::move(label_names), {});
  if (!f.ok()) return f.status();
  return static_cast<CounterFamily*>(*f);
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(std::string_view name, std::string_view help,
                                                       std::vector<std::string> label_names) {
  absl::StatusOr<FamilyBase*> f = Add(name, help, MetricType::kGauge, std::move(label_names), {});
  if (!f.ok()) return f.status();
  return static_cast<GaugeFamily*>(*f);
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(std::string_view name,
                                                               std::string_view help,
                                                               std::vector<std::string> label_names,
                                                               absl::Span<const double> bounds) {
  absl::StatusOr<FamilyBase*> f =
      Add(name, help, MetricType::kHistogram, std::move(label_names), bounds);
  if (!f.ok()) return f.status();
  return static_cast<HistogramFamily*>(*f);
}

absl::StatusOr<FamilyBase*> MetricsRegistry::Add(std::string_view name, std::string_view help,
                                                 MetricType type,
                                                 std::vector<std::string> label_names,
                                                 absl::Span<const double> bounds) {
  if (!IsValidMetricName(name) || name.substr(0, 2) == "__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid metric name \"", Sv(name), "\""));
  }
  if (type == MetricType::kCounter && !name.ends_with("_total")) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter \"", Sv(name), "\" must end in _total"));
  }
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(name), ": help is not valid UTF-8"));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!IsValidLabelName(l) || l.starts_with("__")) {
      return absl::InvalidArgumentError(absl::StrCat(Sv(name), ": invalid label name \"", l, "\""));
    }
    if (type == MetricType::kHistogram && l == "le") {
      return absl::InvalidArgumentError(absl::StrCat(Sv(name), ": label name \"le\" is reserved"));
    }
    if (std::find(label_names.begin(), label_names.begin() + i, l) != label_names.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(name), ": duplicate label name \"", l, "\""));
    }
  }
  std::vector<double> b(bounds.begin(), bounds.end());
  if (!b.empty() && std::isinf(b.back()) && b.back() > 0) b.pop_back();
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i]) || (i > 0 && !(b[i] > b[i - 1]))) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(name), ": bucket bounds must be finite and strictly increasing"));
    }
  }

  absl::MutexLock lock(&mu_);
  auto existing = series_names_.find(Sv(name));
  if (existing != series_names_.end()) {
    const FamilyBase* f = existing->second;
    bool same = f->name() == name && f->type() == type && f->help() == help &&
                f->label_names() == label_names;
    if (same && type == MetricType::kHistogram) {
      same = *static_cast<const HistogramFamily*>(f)->bounds_ == b;
    }
    if (!same) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric \"", Sv(name), "\" conflicts with the registered ",
                       Sv(MetricTypeName(f->type())), " \"", f->name(), "\""));
    }
    return existing->second;
  }
  std::vector<std::string> series = SeriesNames(name, type);
  for (const std::string& s : series) {
    auto it = series_names_.find(s);
    if (it != series_names_.end()) {
      return absl::AlreadyExistsError(absl::StrCat("metric \"", Sv(name), "\" emits \"", s,
                                                   "\", which \"", it->second->name(),
                                                   "\" already emits"));
    }
  }
  std::unique_ptr<FamilyBase> family;
  std::string n(name), h(help);
  switch (type) {
    case MetricType::kCounter:
      family.reset(new CounterFamily(n, h, type, std::move(label_names),
                                     options_.max_children_per_family, nullptr));
      break;
    case MetricType::kGauge:
      family.reset(new GaugeFamily(n, h, type, std::move(label_names),
                                   options_.max_children_per_family, nullptr));
      break;
    case MetricType::kHistogram:
      family.reset(new HistogramFamily(n, h, type, std::move(label_names),
                                       options_.max_children_per_family,
                                       std::make_shared<const std::vector<double>>(std::move(b))));
      break;
  }
  FamilyBase* raw = family.get();
  // An unlabelled family has exactly one child: create it so it exports 0.
  if (raw->label_names().empty()) (void)raw->GetOrCreate({});
  for (std::string& s : series) series_names_.emplace(std::move(s), raw);
  families_.push_back(std::move(family));
  return raw;
}

std::string MetricsRegistry::Serialize() const {
  std::vector<const FamilyBase*> families;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& f : families_) families.push_back(f.get());
  }
  std::string out;
  for (const FamilyBase* f : families) f->Serialize(&out);
  return out;
}

}  // namespace tandem::metrics
