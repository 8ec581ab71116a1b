// Counters, gauges and histograms with label sets, kept in a Registry that renders them in
// the Prometheus text format 0.0.4 (exposition.h) for a /metrics endpoint (server.h).
//
//   Registry registry;
//   auto* reconciles = registry.AddCounter({.name = "spawnpoint_reconciles_total",
//                                           .help = "Reconciles by result.",
//                                           .labels = {"result"}}).value();
//   reconciles->WithLabels({"success"})->Inc();
//   auto* latency = registry.AddHistogram({.name = "spawnpoint_reconcile_duration_seconds",
//                                          .help = "Time per reconcile."},
//                                         ExponentialBuckets(0.001, 2, 15)).value();
//   latency->WithLabels({})->Observe(0.012);
//   registry.RemoveMatching({{"namespace", "ml"}, {"job", "done"}});  // a finished job
//   std::string text = registry.Render();
//
// Thread-safety: every class here is thread-safe. Updating a series (Counter::Inc,
// Gauge::Set, Histogram::Observe) is lock-free, so hold on to the shared_ptr WithLabels()
// returns on hot paths; looking a series up takes a family's reader lock, creating one its
// writer lock. A series removed from its family stays valid for whoever still holds it, but
// is no longer exported. Rendering takes each family's reader lock in turn, so a scrape is
// consistent per family, not across families.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "metrics/exposition.h"

namespace spawnpoint::metrics {

// A value that only goes up (or restarts from zero with the process).
class Counter {
 public:
  // Adds `delta`. A negative or NaN delta is ignored: a counter never goes down, and a
  // decrease would read as a process restart to Prometheus' rate().
  void Inc(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  void Inc(double delta = 1.0) { Add(delta); }
  void Dec(double delta = 1.0) { Add(-delta); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets by upper bound (le, inclusive), plus their sum and
// count. The +Inf bucket is implicit.
class Histogram {
 public:
  // `bounds`: finite, strictly increasing upper bounds (Registry::AddHistogram checks them).
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);

  // A NaN observation is ignored (it would make the sum NaN for the process's lifetime).
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Counts and sum as of about now; the buckets are always consistent with the count
  // (count is the +Inf bucket), the sum may lag concurrent observations slightly.
  Snapshot Take() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  template <typename>
  friend class Family;

  std::shared_ptr<const std::vector<double>> bounds_;
  // Per bucket, not cumulative, so Observe touches one counter; bounds_->size() + 1 long.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// 0.005 .. 10 seconds: the Prometheus client libraries' default latency buckets.
std::vector<double> DefaultBuckets();
// start, start*factor, ... (count bounds); start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// start, start+width, ... (count bounds); width > 0.
std::vector<double> LinearBuckets(double start, double width, int count);

// What a metric family is called and how it is labelled.
struct MetricSpec {
  std::string name;
  std::string help;
  std::vector<std::string> labels;  // label names, in the order WithLabels takes values
  // Set to false only for names another exporter defined (DCGM's), kept for dashboards.
  bool check_conventions = true;
};

// The series of one metric family, one per label set. Obtained from a Registry, which owns
// it; valid as long as the Registry.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Removes the series with exactly these label values; false if there was none.
  virtual bool Remove(const std::vector<std::string>& values) = 0;
  // Removes every series whose labels include all of `subset` (name = value) and returns
  // how many. A family that lacks one of the subset's label names removes nothing.
  virtual size_t RemoveMatching(const Labels& subset) = 0;
  virtual void Clear() = 0;
  virtual size_t Size() const = 0;
  // Appends "# HELP", "# TYPE" and every series; nothing for a family without series.
  virtual void RenderTo(std::string* out) const = 0;

 protected:
  FamilyBase(MetricSpec spec, MetricType type);
  // The HELP and TYPE lines, escaped once at registration.
  std::string header_;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

// T is Counter, Gauge or Histogram.
template <typename T>
class Family final : public FamilyBase {
 public:
  // The series for these label values (in label_names() order), created at zero if new.
  // kInvalidArgument if the number of values differs from the number of label names.
  StatusOr<std::shared_ptr<T>> Get(const std::vector<std::string>& values);
  // Like Get, for call sites whose label count is fixed in the code: with the wrong number
  // of values it returns a series that is never exported (and counts a misuse) instead of
  // an error, so a metrics bug never takes the caller down.
  std::shared_ptr<T> WithLabels(const std::vector<std::string>& values);
  int64_t Misuses() const { return misuses_.load(std::memory_order_relaxed); }

  bool Remove(const std::vector<std::string>& values) override;
  size_t RemoveMatching(const Labels& subset) override;
  void Clear() override;
  size_t Size() const override;
  void RenderTo(std::string* out) const override;

 private:
  friend class Registry;
  struct Series {
    std::vector<std::string> values;
    std::string label_text;  // `a="x",b="y"`, escaped once when the series is created
    std::shared_ptr<T> metric;
  };

  Family(MetricSpec spec, MetricType type, std::shared_ptr<const std::vector<double>> bounds);
  std::shared_ptr<T> Make() const;

  const std::shared_ptr<const std::vector<double>> bounds_;  // histograms only
  std::vector<std::string> bound_text_;                      // formatted le values
  mutable std::shared_mutex mu_;
  // Keyed by the label values joined into one string (see Key() in registry.cc), so the
  // output is sorted by label values and a lookup costs one string compare per level.
  std::map<std::string, Series> series_;
  std::atomic<int64_t> misuses_{0};
};

// Values read when Prometheus scrapes rather than kept up to date (GPU samples, another
// process's statistics): a Collector appends families of counters, gauges or untyped values.
struct CollectedFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;  // kCounter, kGauge or kUntyped
  std::vector<std::string> label_names;
  struct Sample {
    std::vector<std::string> label_values;  // one per label name
    double value = 0;
  };
  std::vector<Sample> samples;
  bool check_conventions = true;

  void Add(std::vector<std::string> label_values, double value) {
    samples.push_back({std::move(label_values), value});
  }
};
// Called on every render, possibly from several scrapes at once: must be thread-safe.
using Collector = std::function<void(std::vector<CollectedFamily>* out)>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family. Errors: kInvalidArgument for a bad name, label name or convention
  // (exposition.h), duplicate label names, or "le" on a histogram; kAlreadyExists when the
  // name (or a histogram's _bucket/_sum/_count) is taken. A family without labels starts
  // with its one series at zero, so it is exported from the first scrape.
  StatusOr<Family<Counter>*> AddCounter(const MetricSpec& spec);
  StatusOr<Family<Gauge>*> AddGauge(const MetricSpec& spec);
  // `bounds`: finite and strictly increasing; a trailing +Inf is dropped (it is implicit).
  StatusOr<Family<Histogram>*> AddHistogram(const MetricSpec& spec,
                                            std::vector<double> bounds = DefaultBuckets());

  // Returns an id for RemoveCollector.
  int AddCollector(Collector collector);
  // Once it returns, the collector is not running and never runs again (it waits for
  // renders in progress), so what it reads may be destroyed. Not from within a collector.
  bool RemoveCollector(int id);

  // Removes, from every registered family, the series whose labels include `subset`;
  // returns how many (e.g. everything of a finished job).
  size_t RemoveMatching(const Labels& subset);

  // Appends the exposition of every family: registered ones in registration order, then
  // collected ones; a collected family with a registered family's name (same type and
  // labels) is written within that family's group. Collected families or samples that are
  // invalid are skipped and counted in CollectErrors().
  void RenderTo(std::string* out) const;
  std::string Render() const;

  int64_t CollectErrors() const { return collect_errors_.load(std::memory_order_relaxed); }
  std::string LastCollectError() const;

 private:
  Status CheckNew(const MetricSpec& spec, MetricType type) const;
  template <typename T>
  StatusOr<Family<T>*> Add(const MetricSpec& spec, MetricType type,
                           std::shared_ptr<const std::vector<double>> bounds);
  void CollectError(const std::string& message) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
  std::map<std::string, FamilyBase*> by_name_;
  std::map<std::string, std::string> sample_names_;  // every sample name -> its family's
  std::map<int, Collector> collectors_;
  int next_collector_ = 1;
  mutable std::shared_mutex collecting_;  // held shared while collectors run
  mutable std::atomic<int64_t> collect_errors_{0};
  mutable std::atomic<size_t> last_size_{0};  // a reserve hint for Render()
  mutable std::mutex error_mu_;
  mutable std::string last_collect_error_;
};

}  // namespace spawnpoint::metrics
