#include "operator/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace spawnpoint::op {
namespace {

constexpr size_t kRecent = 200'000;

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatSample(const Sample& s) {
  std::string line = s.name;
  if (!s.labels.empty()) {
    line += "{";
    for (size_t i = 0; i < s.labels.size(); ++i) {
      if (i > 0) line += ",";
      line += s.labels[i].first + "=\"" + EscapeLabelValue(s.labels[i].second) + "\"";
    }
    line += "}";
  }
  return line + " " + Number(s.value) + "\n";
}

Metrics::Metrics()
    : bounds_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}),
      buckets_(bounds_.size(), 0) {}

void Metrics::ObserveReconcile(double seconds, const std::string& result) {
  std::lock_guard<std::mutex> lock(mu_);
  ++results_[result];
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (seconds <= bounds_[i]) ++buckets_[i];
  }
  latency_sum_ += seconds;
  ++latency_count_;
  recent_.push_back(seconds);
  if (recent_.size() > kRecent) recent_.pop_front();
}

void Metrics::SetQueueDepth(int64_t depth) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = depth;
}

void Metrics::SetLeader(bool leader) {
  std::lock_guard<std::mutex> lock(mu_);
  leader_ = leader;
}

void Metrics::IncStatusWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  ++results_["status_write"];
}

void Metrics::AddCollector(Collector collector, std::map<std::string, std::string> help,
                           std::map<std::string, std::string> types) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.push_back({std::move(collector), std::move(help), std::move(types)});
}

std::string Metrics::Exposition() const {
  std::vector<CollectorEntry> collectors;
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    collectors = collectors_;
    out += "# HELP spawnpoint_operator_reconcile_total Reconciles by result.\n";
    out += "# TYPE spawnpoint_operator_reconcile_total counter\n";
    for (const char* r : {"success", "requeue", "error"}) {
      auto it = results_.find(r);
      out += FormatSample({"spawnpoint_operator_reconcile_total",
                           {{"result", r}},
                           static_cast<double>(it == results_.end() ? 0 : it->second)});
    }
    auto writes = results_.find("status_write");
    out += "# HELP spawnpoint_operator_status_writes_total TrainingJob status writes.\n";
    out += "# TYPE spawnpoint_operator_status_writes_total counter\n";
    out += FormatSample({"spawnpoint_operator_status_writes_total",
                         {},
                         static_cast<double>(writes == results_.end() ? 0 : writes->second)});
    out += "# HELP spawnpoint_operator_reconcile_duration_seconds Time per reconcile.\n";
    out += "# TYPE spawnpoint_operator_reconcile_duration_seconds histogram\n";
    for (size_t i = 0; i < bounds_.size(); ++i) {
      out += FormatSample({"spawnpoint_operator_reconcile_duration_seconds_bucket",
                           {{"le", Number(bounds_[i])}},
                           static_cast<double>(buckets_[i])});
    }
    out += FormatSample({"spawnpoint_operator_reconcile_duration_seconds_bucket",
                         {{"le", "+Inf"}},
                         static_cast<double>(latency_count_)});
    out += FormatSample({"spawnpoint_operator_reconcile_duration_seconds_sum", {}, latency_sum_});
    out += FormatSample({"spawnpoint_operator_reconcile_duration_seconds_count",
                         {},
                         static_cast<double>(latency_count_)});
    out += "# HELP spawnpoint_operator_reconcile_latency_seconds Quantiles of recent reconciles.\n";
    out += "# TYPE spawnpoint_operator_reconcile_latency_seconds summary\n";
    std::vector<double> recent(recent_.begin(), recent_.end());
    std::sort(recent.begin(), recent.end());
    for (double q : {0.5, 0.9, 0.99}) {
      double value = 0;
      if (!recent.empty()) {
        size_t rank = static_cast<size_t>(std::max(1.0, std::ceil(q * recent.size())));
        value = recent[std::min(recent.size(), rank) - 1];
      }
      out += FormatSample(
          {"spawnpoint_operator_reconcile_latency_seconds", {{"quantile", Number(q)}}, value});
    }
    out += FormatSample({"spawnpoint_operator_reconcile_latency_seconds_sum", {}, latency_sum_});
    out += FormatSample({"spawnpoint_operator_reconcile_latency_seconds_count",
                         {},
                         static_cast<double>(latency_count_)});
    out += "# HELP spawnpoint_operator_workqueue_depth Keys waiting for a worker.\n";
    out += "# TYPE spawnpoint_operator_workqueue_depth gauge\n";
    out += FormatSample(
        {"spawnpoint_operator_workqueue_depth", {}, static_cast<double>(queue_depth_)});
    out += "# HELP spawnpoint_operator_leader 1 while this replica leads (or runs alone).\n";
    out += "# TYPE spawnpoint_operator_leader gauge\n";
    out += FormatSample({"spawnpoint_operator_leader", {}, leader_ ? 1.0 : 0.0});
  }
  for (const auto& c : collectors) {
    std::map<std::string, std::vector<Sample>> by_name;
    for (auto& s : c.collect()) by_name[s.name].push_back(std::move(s));
    for (const auto& [name, samples] : by_name) {
      auto help = c.help.find(name);
      if (help != c.help.end()) out += "# HELP " + name + " " + help->second + "\n";
      auto type = c.types.find(name);
      out += "# TYPE " + name + " " + (type != c.types.end() ? type->second : "gauge") + "\n";
      for (const auto& s : samples) out += FormatSample(s);
    }
  }
  return out;
}

int64_t Metrics::Reconciles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latency_count_;
}

double Metrics::ReconcileLatencyQuantile(double q) const {
  std::vector<double> v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v.assign(recent_.begin(), recent_.end());
  }
  if (v.empty()) return 0;
  double rank = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size()));
  size_t index = std::min(v.size() - 1, static_cast<size_t>(std::max(1.0, rank)) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(index), v.end());
  return v[index];
}

}  // namespace spawnpoint::op
