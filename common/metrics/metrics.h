// Tandem's thin facade over prometheus-cpp (core): a MetricsRegistry of
// labelled counter, gauge and histogram families whose Serialize() is
// prometheus-cpp's text exposition format 0.0.4 (what Prometheus scrapes from
// /metrics). prometheus-cpp stores the values and renders them; the facade adds
// what Tandem relies on and the library lacks:
//  - absl::Status errors instead of exceptions: a bad metric / label name,
//    help text the library would print unescaped (newline, backslash), or a
//    re-registration with another schema is InvalidArgument / AlreadyExists,
//    never a throw. Registering the same family twice with an identical schema
//    returns the existing family, so several components (e.g. the router and a
//    worker in one process) can share a registry.
//  - Fixed label names per family, child lookup by label values, label values
//    checked to be UTF-8 (Prometheus drops a whole scrape that is not), and at
//    most Options::max_children_per_family children per family, so a label fed
//    from untrusted input cannot exhaust memory.
//  - Inc of a negative or NaN value and Observe(NaN) are ignored (one bad
//    value cannot poison a counter or a histogram's _sum).
//  - Gauges computed at scrape time (Gauge::SetCallback).
//
// Thread safety: everything is thread-safe. Families and children live as long
// as the registry and never move: returned pointers stay valid until the
// registry is destroyed (cache them on hot paths; lookups take a mutex).
#ifndef TANDEM_COMMON_METRICS_METRICS_H_
#define TANDEM_COMMON_METRICS_METRICS_H_

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

class MetricsRegistry;

enum class MetricType { kCounter, kGauge, kHistogram };

// One child of a family (one label-value combination); a handle on the
// prometheus-cpp metric, which its family owns.
class Metric {
 public:
  virtual ~Metric() = default;
};

// Monotonic counter.
class Counter final : public Metric {
 public:
  explicit Counter(prometheus::Counter* counter) : counter_(counter) {}
  void Inc(double v = 1.0) {
    if (v > 0) counter_->Increment(v);  // false for NaN
  }
  double Value() const { return counter_->Value(); }

 private:
  prometheus::Counter* counter_;
};

// A value that goes up and down, or is computed at scrape time by a callback.
class Gauge final : public Metric {
 public:
  // registry: where SetCallback registers; null = callbacks are ignored.
  Gauge(prometheus::Gauge* gauge, MetricsRegistry* registry) : gauge_(gauge), registry_(registry) {}
  void Set(double v) { gauge_->Set(v); }
  void Inc(double v = 1.0) { gauge_->Increment(v); }
  void Dec(double v = 1.0) { gauge_->Decrement(v); }
  // Every MetricsRegistry::Serialize() sets the gauge to fn() before it
  // renders (a Set in between is overwritten at the next scrape). fn runs on
  // the scraping thread: it must be thread-safe and fast, must not call
  // SetCallback / ClearCallback, and must not outlive what it captures: call
  // ClearCallback() before destroying that (it waits for a running fn).
  void SetCallback(std::function<double()> fn);
  void ClearCallback();
  double Value() const { return gauge_->Value(); }

 private:
  prometheus::Gauge* gauge_;
  MetricsRegistry* registry_;
};

// Cumulative histogram with the family's upper bounds (+Inf implicit).
class Histogram final : public Metric {
 public:
  explicit Histogram(prometheus::Histogram* histogram) : histogram_(histogram) {}
  void Observe(double v) {
    if (!std::isnan(v)) histogram_->Observe(v);
  }

 private:
  prometheus::Histogram* histogram_;
};

// Type-erased part of a family: schema and the children's handles.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bounds() const { return bounds_; }  // histograms only

 protected:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, std::vector<double> bounds, int max_children);
  // Values in the order of label_names(). Errors: InvalidArgument (wrong
  // count, not UTF-8), ResourceExhausted (family full).
  absl::StatusOr<Metric*> GetOrCreate(absl::Span<const std::string_view> values)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the prometheus-cpp child for `labels` and wraps it.
  virtual std::unique_ptr<Metric> NewChild(const prometheus::Labels& labels) = 0;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;
  const int max_children_;
  absl::Mutex mu_;
  // Key: label values joined by '\xff' (never part of valid UTF-8).
  absl::flat_hash_map<std::string, std::unique_ptr<Metric>> children_ ABSL_GUARDED_BY(mu_);
};

// A family of T (Counter, Gauge or Histogram) children on a prometheus-cpp
// family P.
template <typename T, typename P>
class Family final : public FamilyBase {
 public:
  // Positional: values in the order of label_names().
  absl::StatusOr<T*> WithLabelValues(absl::Span<const std::string_view> values) {
    absl::StatusOr<Metric*> m = GetOrCreate(values);
    if (!m.ok()) return m.status();
    return static_cast<T*>(*m);
  }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::vector<double> bounds, int max_children, prometheus::Family<P>* family,
         MetricsRegistry* registry)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names),
                   std::move(bounds), max_children),
        family_(family),
        registry_(registry) {}
  std::unique_ptr<Metric> NewChild(const prometheus::Labels& labels) override {
    if constexpr (std::is_same_v<T, Histogram>) {
      return std::make_unique<T>(&family_->Add(labels, bounds()));
    } else if constexpr (std::is_same_v<T, Gauge>) {
      return std::make_unique<T>(&family_->Add(labels), registry_);
    } else {
      return std::make_unique<T>(&family_->Add(labels));
    }
  }

  prometheus::Family<P>* family_;  // owned by the prometheus::Registry
  MetricsRegistry* registry_;
};

using CounterFamily = Family<Counter, prometheus::Counter>;
using GaugeFamily = Family<Gauge, prometheus::Gauge>;
using HistogramFamily = Family<Histogram, prometheus::Histogram>;

class MetricsRegistry {
 public:
  struct Options {
    int max_children_per_family = 1024;
  };
  MetricsRegistry() : MetricsRegistry(Options{}) {}
  explicit MetricsRegistry(Options options);
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Get-or-create. Errors: InvalidArgument (bad name, label name, help or
  // bounds; a counter not ending in "_total"), AlreadyExists (the same name
  // with another type, help, labels or bounds, or a name that collides with
  // another family's series, such as foo_count vs histogram foo).
  absl::StatusOr<CounterFamily*> AddCounter(std::string_view name, std::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names = {});
  // bounds: strictly increasing, no NaN; a trailing +Inf is dropped (implicit).
  absl::StatusOr<HistogramFamily*> AddHistogram(std::string_view name, std::string_view help,
                                                std::vector<std::string> label_names,
                                                absl::Span<const double> bounds);

  // Runs the gauge callbacks, then renders the registry with
  // prometheus::TextSerializer (families grouped by type: counters, gauges,
  // histograms; a labelled family with no children renders nothing).
  std::string Serialize() const ABSL_LOCKS_EXCLUDED(mu_, callbacks_mu_);

 private:
  friend class Gauge;
  template <typename T, typename P>
  absl::StatusOr<Family<T, P>*> Add(std::string_view name, std::string_view help, MetricType type,
                                    std::vector<std::string> label_names,
                                    std::vector<double> bounds) ABSL_LOCKS_EXCLUDED(mu_);
  void SetCallback(prometheus::Gauge* gauge, std::function<double()> fn)
      ABSL_LOCKS_EXCLUDED(callbacks_mu_);

  const Options options_;
  const std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  // Every series name a family emits (histogram foo: foo, foo_bucket, ...).
  absl::flat_hash_set<std::string> series_names_ ABSL_GUARDED_BY(mu_);
  // Held while callbacks run, so ClearCallback waits for a running one.
  mutable absl::Mutex callbacks_mu_;
  absl::flat_hash_map<prometheus::Gauge*, std::function<double()>> callbacks_
      ABSL_GUARDED_BY(callbacks_mu_);
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_H_
