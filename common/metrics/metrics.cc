#include "common/metrics/metrics.h"

#include <algorithm>
#include <exception>

#include "common/utf8.h"
#include "prometheus/check_names.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

absl::Status Invalid(std::string_view name, std::string_view what) {
  return absl::InvalidArgumentError(std::string(name) + ": " + std::string(what));
}

// What the registry checks before prometheus-cpp sees the schema (the library
// throws on bad names, and prints help verbatim).
absl::Status ValidateSchema(std::string_view name, std::string_view help, MetricType type,
                            const std::vector<std::string>& label_names,
                            const std::vector<double>& bounds) {
  if (!prometheus::CheckMetricName(std::string(name))) return Invalid(name, "invalid metric name");
  if (type == MetricType::kCounter && !name.ends_with("_total")) {
    return Invalid(name, "a counter's name must end in _total");
  }
  if (!utf8::IsValidUtf8(help) || help.find_first_of("\\\n") != std::string_view::npos) {
    return Invalid(name, "help must be UTF-8 without backslash or newline");
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!prometheus::CheckLabelName(l)) return Invalid(name, "invalid label name \"" + l + "\"");
    if (l == "le" && type == MetricType::kHistogram)
      return Invalid(name, "label \"le\" is reserved");
    if (std::find(label_names.begin(), label_names.begin() + i, l) != label_names.begin() + i) {
      return Invalid(name, "duplicate label name \"" + l + "\"");
    }
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (std::isnan(bounds[i]) || std::isinf(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return Invalid(name, "bucket bounds must be finite and strictly increasing");
    }
  }
  return absl::OkStatus();
}

// The series names a family of `type` called `name` emits.
std::vector<std::string> SeriesNames(const std::string& name, MetricType type) {
  if (type != MetricType::kHistogram) return {name};
  return {name, name + "_bucket", name + "_sum", name + "_count"};
}

template <typename P>
prometheus::detail::Builder<P> Builder() {
  if constexpr (std::is_same_v<P, prometheus::Counter>) {
    return prometheus::BuildCounter();
  } else if constexpr (std::is_same_v<P, prometheus::Gauge>) {
    return prometheus::BuildGauge();
  } else {
    return prometheus::BuildHistogram();
  }
}

}  // namespace

void Gauge::SetCallback(std::function<double()> fn) {
  if (registry_ != nullptr) registry_->SetCallback(gauge_, std::move(fn));
}

void Gauge::ClearCallback() {
  if (registry_ != nullptr) registry_->SetCallback(gauge_, nullptr);
}

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names, std::vector<double> bounds,
                       int max_children)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)),
      max_children_(max_children) {}

absl::StatusOr<Metric*> FamilyBase::GetOrCreate(absl::Span<const std::string_view> values) {
  if (values.size() != label_names_.size()) {
    return Invalid(name_, "expected " + std::to_string(label_names_.size()) +
                              " label values, got " + std::to_string(values.size()));
  }
  std::string key;
  for (std::string_view v : values) {
    if (!utf8::IsValidUtf8(v)) return Invalid(name_, "label value is not valid UTF-8");
    key.append(v);
    key.push_back('\xff');
  }
  absl::MutexLock lock(&mu_);
  if (auto it = children_.find(key); it != children_.end()) return it->second.get();
  if (static_cast<int>(children_.size()) >= max_children_) {
    return absl::ResourceExhaustedError(name_ + ": too many label combinations (" +
                                        std::to_string(max_children_) + ")");
  }
  prometheus::Labels labels;
  for (size_t i = 0; i < values.size(); ++i) labels.emplace(label_names_[i], values[i]);
  std::unique_ptr<Metric> child;
  try {
    child = NewChild(labels);
  } catch (const std::exception& e) {  // the names were validated; belt and braces
    return Invalid(name_, e.what());
  }
  Metric* out = child.get();
  children_.emplace(std::move(key), std::move(child));
  return out;
}

MetricsRegistry::MetricsRegistry(Options options)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {}

template <typename T, typename P>
absl::StatusOr<Family<T, P>*> MetricsRegistry::Add(std::string_view name, std::string_view help,
                                                   MetricType type,
                                                   std::vector<std::string> label_names,
                                                   std::vector<double> bounds) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) bounds.pop_back();
  if (absl::Status s = ValidateSchema(name, help, type, label_names, bounds); !s.ok()) return s;
  const std::string key(name);
  absl::MutexLock lock(&mu_);
  if (auto it = families_.find(key); it != families_.end()) {
    FamilyBase* f = it->second.get();
    if (f->type() != type || f->help() != help || f->label_names() != label_names ||
        f->bounds() != bounds) {
      return absl::AlreadyExistsError(key + ": registered before with another schema");
    }
    return static_cast<Family<T, P>*>(f);
  }
  const std::vector<std::string> series = SeriesNames(key, type);
  for (const std::string& n : series) {
    if (series_names_.contains(n)) {
      return absl::AlreadyExistsError(key + ": series " + n + " collides with another family");
    }
  }
  prometheus::Family<P>* family = nullptr;
  try {
    family = &Builder<P>().Name(key).Help(std::string(help)).Register(*registry_);
  } catch (const std::exception& e) {  // e.g. the name is taken by a foreign family
    return absl::AlreadyExistsError(key + ": " + e.what());
  }
  std::unique_ptr<Family<T, P>> f(new Family<T, P>(key, std::string(help), type,
                                                   std::move(label_names), std::move(bounds),
                                                   options_.max_children_per_family, family, this));
  Family<T, P>* out = f.get();
  families_.emplace(key, std::move(f));
  series_names_.insert(series.begin(), series.end());
  return out;
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounter(std::string_view name,
                                                           std::string_view help,
                                                           std::vector<std::string> label_names) {
  return Add<Counter, prometheus::Counter>(name, help, MetricType::kCounter, std::move(label_names),
                                           {});
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(std::string_view name, std::string_view help,
                                                       std::vector<std::string> label_names) {
  return Add<Gauge, prometheus::Gauge>(name, help, MetricType::kGauge, std::move(label_names), {});
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(std::string_view name,
                                                               std::string_view help,
                                                               std::vector<std::string> label_names,
                                                               absl::Span<const double> bounds) {
  return Add<Histogram, prometheus::Histogram>(name, help, MetricType::kHistogram,
                                               std::move(label_names),
                                               std::vector<double>(bounds.begin(), bounds.end()));
}

void MetricsRegistry::SetCallback(prometheus::Gauge* gauge, std::function<double()> fn) {
  absl::MutexLock lock(&callbacks_mu_);
  if (fn) {
    callbacks_[gauge] = std::move(fn);
  } else {
    callbacks_.erase(gauge);
  }
}

std::string MetricsRegistry::Serialize() const {
  {
    absl::MutexLock lock(&callbacks_mu_);
    for (const auto& [gauge, fn] : callbacks_) gauge->Set(fn());
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace tandem::metrics
