// Counter, Gauge and Histogram: the hot-path updates (inline in metrics.h) and
// their rendering.
#include <algorithm>
#include <cmath>
#include <string>

#include "common/metrics/metrics.h"
#include "common/metrics/text_format.h"

namespace tandem::metrics {

void Counter::AppendSamples(std::string_view name, std::string_view labels,
                            std::string* out) const {
  AppendSample(name, labels, "", Value(), out);
}

void Gauge::SetCallback(std::function<double()> fn) {
  absl::MutexLock lock(&callback_mu_);
  callback_ = std::move(fn);
  has_callback_.store(callback_ != nullptr, std::memory_order_release);
}

void Gauge::ClearCallback() { SetCallback(nullptr); }

double Gauge::Value() const {
  if (has_callback_.load(std::memory_order_acquire)) {
    // Held while fn runs so that ClearCallback() returning means fn is done.
    absl::MutexLock lock(&callback_mu_);
    if (callback_) return callback_();
  }
  return value_.load(std::memory_order_relaxed);
}

void Gauge::AppendSamples(std::string_view name, std::string_view labels, std::string* out) const {
  AppendSample(name, labels, "", Value(), out);
}

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_->size() + 1)) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // First bound >= v: Prometheus buckets are "le" (v <= bound).
  size_t i = std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.cumulative_counts.resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative_counts[i] = total;
  }
  // _count is derived from the buckets so that +Inf == _count always holds,
  // even while other threads observe.
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

void Histogram::AppendSamples(std::string_view name, std::string_view labels,
                              std::string* out) const {
  Snapshot s = Collect();
  std::string bucket_name = std::string(name) + "_bucket";
  std::string le;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    le = "le=\"";
    AppendValue(i < bounds_->size() ? (*bounds_)[i] : INFINITY, &le);
    le.push_back('"');
    AppendSample(bucket_name, labels, le, static_cast<double>(s.cumulative_counts[i]), out);
  }
  AppendSample(std::string(name) + "_sum", labels, "", s.sum, out);
  AppendSample(std::string(name) + "_count", labels, "", static_cast<double>(s.count), out);
}

}  // namespace tandem::metrics
