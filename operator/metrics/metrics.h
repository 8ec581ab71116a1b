// The operator's Prometheus metrics in the text exposition format (version 0.0.4):
// reconcile counts by result and a latency histogram, work-queue depth, leadership, plus
// per-job gauges produced at scrape time by a collector (so a deleted job leaves no stale
// series). Also keeps the recent reconcile latencies to answer exact quantiles (the
// benchmark's p99). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace spawnpoint::op {

// One exposition line: name{labels} value.
struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// "spawnpoint_trainingjob_restarts{namespace=\"ml\",name=\"x\"} 1\n"
std::string FormatSample(const Sample& sample);
// Escapes \ " and newlines for a label value.
std::string EscapeLabelValue(const std::string& value);

class Metrics {
 public:
  Metrics();

  // result: "success", "requeue", "error".
  void ObserveReconcile(double seconds, const std::string& result);
  void SetQueueDepth(int64_t depth);
  void SetLeader(bool leader);
  void IncStatusWrites();
  // Adds per-job (or other) samples at scrape time; `help` maps a metric name to its HELP.
  using Collector = std::function<std::vector<Sample>()>;
  void AddCollector(Collector collector, std::map<std::string, std::string> help,
                    std::map<std::string, std::string> types);

  std::string Exposition() const;

  int64_t Reconciles() const;
  // Quantile (0..1) of the most recent reconcile latencies (up to 200k), in seconds.
  double ReconcileLatencyQuantile(double q) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> results_;
  std::vector<double> bounds_;
  std::vector<int64_t> buckets_;
  double latency_sum_ = 0;
  int64_t latency_count_ = 0;
  std::deque<double> recent_;
  int64_t queue_depth_ = 0;
  bool leader_ = false;
  struct CollectorEntry {
    Collector collect;
    std::map<std::string, std::string> help;
    std::map<std::string, std::string> types;
  };
  std::vector<CollectorEntry> collectors_;
};

}  // namespace spawnpoint::op
