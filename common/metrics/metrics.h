// A small Prometheus metrics library: counters, gauges and histograms grouped
// in labelled families, owned by a MetricsRegistry that renders the text
// exposition format 0.0.4 (what Prometheus scrapes from /metrics).
//
// Contract:
//  - Names are validated at registration (metric names [a-zA-Z_:][a-zA-Z0-9_:]*,
//    label names [a-zA-Z_][a-zA-Z0-9_]*, no "__" prefix, "le" reserved for
//    histograms, counters end in "_total"); a bad name or a conflicting
//    re-registration is an absl::Status error, never a crash. Registering the
//    same family twice with an identical schema returns the existing family, so
//    several components (e.g. the router and a worker in one process) can share
//    a registry.
//  - Label names are fixed per family; a child is created on first use of its
//    label values (positional or by name). Label values must be valid UTF-8 and
//    each family holds at most Options::max_children_per_family children, so a
//    label fed from untrusted input cannot exhaust memory.
//  - Thread safety: everything is thread-safe. Inc / Set / Observe are lock-free
//    atomics; child lookup takes a shared lock (cache the returned pointer on
//    hot paths). Families and children live as long as the registry and never
//    move: returned pointers stay valid until the registry is destroyed.
//  - Serialize() calls gauge callbacks with no registry or family lock held, so
//    a callback may read other metrics; it must be fast and thread-safe.
#ifndef TANDEM_COMMON_METRICS_METRICS_H_
#define TANDEM_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tandem::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };
std::string_view MetricTypeName(MetricType type);  // "counter", "gauge", "histogram"

// One child of a family (one label-value combination). Internal base; use the
// concrete types below.
class Metric {
 public:
  virtual ~Metric() = default;
  // Appends this child's sample lines. `labels` is the escaped, comma-joined
  // label text without braces ("" when the family has no labels).
  virtual void AppendSamples(std::string_view name, std::string_view labels,
                             std::string* out) const = 0;
};

// Monotonic counter. Inc with a negative or NaN value is ignored.
class Counter final : public Metric {
 public:
  void Inc(double v = 1.0) {
    if (v > 0) value_.fetch_add(v, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }
  void AppendSamples(std::string_view name, std::string_view labels,
                     std::string* out) const override;

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down, or is computed at scrape time by a callback.
class Gauge final : public Metric {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Dec(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  // Value() returns fn() from now on (Set/Inc/Dec are then ignored by Value()).
  // fn runs on the scraping thread: it must be thread-safe, fast, and must not
  // outlive what it captures: call ClearCallback() before destroying that.
  void SetCallback(std::function<double()> fn);
  void ClearCallback();
  double Value() const;
  void AppendSamples(std::string_view name, std::string_view labels,
                     std::string* out) const override;

 private:
  std::atomic<double> value_{0.0};
  std::atomic<bool> has_callback_{false};
  mutable absl::Mutex callback_mu_;
  std::function<double()> callback_ ABSL_GUARDED_BY(callback_mu_);
};

// Cumulative histogram with fixed upper bounds (+Inf implicit). Observe(NaN)
// is ignored so that one bad value cannot poison _sum.
class Histogram final : public Metric {
 public:
  // bounds: strictly increasing, finite (validated by the registry).
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative_counts;  // [bounds + 1], last is +Inf
    double sum = 0;
    uint64_t count = 0;  // == cumulative_counts.back()
  };
  Snapshot Collect() const;
  const std::vector<double>& bounds() const { return *bounds_; }
  void AppendSamples(std::string_view name, std::string_view labels,
                     std::string* out) const override;

 private:
  std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [bounds + 1], not cumulative
  std::atomic<double> sum_{0.0};
};

// A label value as given by name ({"phase", "router"}).
using LabelPair = std::pair<std::string_view, std::string_view>;

// Type-erased part of a family: schema, children and rendering.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends # HELP, # TYPE and every child's samples (children sorted by label
  // values). A labelled family with no children appends nothing.
  void Serialize(std::string* out) const ABSL_LOCKS_EXCLUDED(mu_);

 protected:
  friend class MetricsRegistry;
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, int max_children);
  absl::StatusOr<Metric*> GetOrCreate(absl::Span<const std::string_view> values)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Metric*> GetOrCreateByName(absl::Span<const LabelPair> labels);
  virtual std::unique_ptr<Metric> NewChild() const = 0;

 private:
  struct Child {
    std::vector<std::string> values;
    std::string labels_text;  // escaped a="x",b="y"
    std::unique_ptr<Metric> metric;
  };

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const int max_children_;
  mutable absl::Mutex mu_;
  // Key: label values joined by '\xff' (never part of valid UTF-8).
  absl::flat_hash_map<std::string, std::unique_ptr<Child>> children_ ABSL_GUARDED_BY(mu_);
};

// A family of T (Counter, Gauge or Histogram) children.
template <typename T>
class Family final : public FamilyBase {
 public:
  // Positional: values in the order of label_names().
  absl::StatusOr<T*> WithLabelValues(absl::Span<const std::string_view> values) {
    absl::StatusOr<Metric*> m = GetOrCreate(values);
    if (!m.ok()) return m.status();
    return static_cast<T*>(*m);
  }
  // By name, any order; every label name exactly once.
  absl::StatusOr<T*> Labels(absl::Span<const LabelPair> labels) {
    absl::StatusOr<Metric*> m = GetOrCreateByName(labels);
    if (!m.ok()) return m.status();
    return static_cast<T*>(*m);
  }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         int max_children, std::shared_ptr<const std::vector<double>> bounds)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names), max_children),
        bounds_(std::move(bounds)) {}
  std::unique_ptr<Metric> NewChild() const override {
    if constexpr (std::is_same_v<T, Histogram>) {
      return std::make_unique<Histogram>(bounds_);
    } else {
      return std::make_unique<T>();
    }
  }

  std::shared_ptr<const std::vector<double>> bounds_;  // histograms only
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class MetricsRegistry {
 public:
  struct Options {
    int max_children_per_family = 1024;
  };
  MetricsRegistry() : MetricsRegistry(Options{}) {}
  explicit MetricsRegistry(Options options) : options_(options) {}
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Get-or-create. Errors: InvalidArgument (bad name, label name, help or
  // bounds), AlreadyExists (same name with another schema, or a name that
  // collides with another family's series such as foo_count vs histogram foo).
  absl::StatusOr<CounterFamily*> AddCounter(std::string_view name, std::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names = {});
  // bounds: strictly increasing, no NaN; a trailing +Inf is dropped (implicit).
  absl::StatusOr<HistogramFamily*> AddHistogram(std::string_view name, std::string_view help,
                                                std::vector<std::string> label_names,
                                                absl::Span<const double> bounds);

  // The whole registry in Prometheus text format 0.0.4, families in
  // registration order.
  std::string Serialize() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<FamilyBase*> Add(std::string_view name, std::string_view help, MetricType type,
                                  std::vector<std::string> label_names,
                                  absl::Span<const double> bounds) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  // Every series name a family emits (histogram foo: foo, foo_bucket, ...).
  absl::flat_hash_map<std::string, FamilyBase*> series_names_ ABSL_GUARDED_BY(mu_);
};

// Validation helpers (exposed for tests and for services that build names).
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_H_
