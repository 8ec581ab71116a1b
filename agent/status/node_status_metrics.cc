// NodeStatus's Prometheus families (docs/metrics.md): the GPUs in DCGM exporter's names, the
// loader, the ranks' progress and stalls, all from one Read() of the status.
#include "agent/status/node_status.h"

#include <cmath>

namespace spawnpoint::agent {
namespace {

using metrics::CollectedFamily;
using metrics::MetricType;
using nlohmann::json;

double Number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

void NodeStatus::Collect(std::vector<CollectedFamily>* out) {
  const Reading r = Read();
  const auto& id = options_.identity;

  if (!r.gpus.empty()) {
    // DCGM exporter's label names, except model_name: promtool rejects camelCase label
    // names, so only the DCGM-compatible families below carry "modelName".
    const std::vector<std::string> labels = {"gpu",      "UUID",      "pci_bus_id", "model_name",
                                             "Hostname", "namespace", "pod",        "container",
                                             "rank",     "job"};
    auto family = [&](const char* name, const char* help) {
      return CollectedFamily{
          .name = name, .help = help, .type = MetricType::kGauge, .label_names = labels};
    };
    CollectedFamily util = family("spawnpoint_gpu_utilisation_ratio",
                                  "Fraction of the last sample period the GPU was busy (0-1).");
    CollectedFamily used = family("spawnpoint_gpu_memory_used_bytes", "GPU memory in use.");
    CollectedFamily total = family("spawnpoint_gpu_memory_total_bytes", "GPU memory in all.");
    CollectedFamily power = family("spawnpoint_gpu_power_watts", "GPU power draw.");
    CollectedFamily temp = family("spawnpoint_gpu_temperature_celsius", "GPU temperature.");
    // DCGM exporter's names, units and labels (it adds "device"; it has no rank or job,
    // which dashboards written for it simply do not look at).
    std::vector<std::string> dcgm_labels = labels;
    dcgm_labels[3] = "modelName";
    dcgm_labels.insert(dcgm_labels.begin() + 2, "device");
    auto dcgm = [&](const char* name, const char* help) {
      return CollectedFamily{.name = name,
                             .help = help,
                             .type = MetricType::kGauge,
                             .label_names = dcgm_labels,
                             .check_conventions = false};
    };
    CollectedFamily d_util = dcgm("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).");
    CollectedFamily d_used = dcgm("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).");
    CollectedFamily d_free = dcgm("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).");
    CollectedFamily d_temp = dcgm("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).");
    CollectedFamily d_power = dcgm("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).");

    for (const auto& g : r.gpus) {
      if (!g.sample) continue;
      const auto& s = *g.sample;
      const std::string gpu = std::to_string(g.device.index);
      const std::string rank = g.rank >= 0 ? std::to_string(g.rank) : "";
      std::vector<std::string> v = {gpu,           g.device.uuid, g.device.pci_bus_id,
                                    g.device.name, id.hostname,   id.job_namespace,
                                    id.pod,        id.container,  rank,
                                    id.job};
      std::vector<std::string> dv = v;
      dv.insert(dv.begin() + 2, (g.device.vendor == "amd" ? "card" : "nvidia") + gpu);
      // The sample's total, else the one discovery found; 0: unknown.
      const uint64_t mem_total = s.memory_total_bytes.value_or(g.device.memory_total_bytes);
      constexpr double kMiB = 1024.0 * 1024.0;
      if (s.utilisation) {
        util.Add(v, *s.utilisation);
        d_util.Add(dv, std::round(*s.utilisation * 100.0));
      }
      if (s.memory_used_bytes) {
        used.Add(v, static_cast<double>(*s.memory_used_bytes));
        d_used.Add(dv, std::floor(*s.memory_used_bytes / kMiB));
        if (mem_total > 0 && mem_total >= *s.memory_used_bytes) {
          d_free.Add(dv, std::floor((mem_total - *s.memory_used_bytes) / kMiB));
        }
      }
      if (mem_total > 0) total.Add(v, static_cast<double>(mem_total));
      if (s.power_watts) {
        power.Add(v, *s.power_watts);
        d_power.Add(dv, *s.power_watts);
      }
      if (s.temperature_celsius) {
        temp.Add(v, *s.temperature_celsius);
        d_temp.Add(dv, *s.temperature_celsius);
      }
    }
    for (auto* f : {&util, &used, &total, &power, &temp}) out->push_back(std::move(*f));
    if (options_.dcgm_compatible_names) {
      for (auto* f : {&d_util, &d_used, &d_free, &d_temp, &d_power}) out->push_back(std::move(*f));
    }
  }

  const std::vector<std::string> rank_labels = {"namespace", "job", "rank"};
  auto rank_family = [&](const char* name, const char* help, MetricType type,
                         std::vector<std::string> extra = {}) {
    CollectedFamily f{.name = name, .help = help, .type = type, .label_names = rank_labels};
    f.label_names.insert(f.label_names.end(), extra.begin(), extra.end());
    return f;
  };
  CollectedFamily batches =
      rank_family("spawnpoint_loader_batches_total", "Batches the rank's loader delivered.",
                  MetricType::kCounter);
  CollectedFamily samples =
      rank_family("spawnpoint_loader_samples_total", "Samples the rank's loader delivered.",
                  MetricType::kCounter);
  CollectedFamily stall_seconds = rank_family(
      "spawnpoint_loader_data_stall_seconds_total",
      "Time the rank's trainer waited for its next batch (the data stall).", MetricType::kCounter);
  CollectedFamily stall_ratio = rank_family(
      "spawnpoint_loader_data_stall_ratio",
      "Fraction of the rank's run time spent waiting for data, as its loader reports it.",
      MetricType::kGauge);
  CollectedFamily sps = rank_family("spawnpoint_loader_samples_per_second",
                                    "Samples per second the rank consumed over the last ~5 s "
                                    "(0 while the rank is down).",
                                    MetricType::kGauge);
  CollectedFamily queue =
      rank_family("spawnpoint_loader_queue_depth", "Batches built and waiting for the trainer.",
                  MetricType::kGauge);
  CollectedFamily active = rank_family("spawnpoint_loader_active_workers",
                                       "Loader workers the rank uses now.", MetricType::kGauge);
  CollectedFamily restarts =
      rank_family("spawnpoint_loader_worker_restarts_total",
                  "Loader worker restarts the rank's loader asked for, by cause (died, hung, "
                  "oom, shm).",
                  MetricType::kCounter, {"cause"});
  CollectedFamily exits = rank_family(
      "spawnpoint_loader_worker_exits_total",
      "Loader worker exits the agent saw, by classified reason (Killed, OOMKilled, ...).",
      MetricType::kCounter, {"reason"});
  for (const auto& rr : r.ranks) {
    const std::vector<std::string> v = {id.job_namespace, id.job, std::to_string(rr.info.rank)};
    if (rr.stats) {
      const json& s = *rr.stats;
      batches.Add(v, rr.batches);
      samples.Add(v, rr.samples);
      stall_seconds.Add(v, rr.wait_seconds);
      stall_ratio.Add(v, Number(s, "dataStall"));
      sps.Add(v, rr.up ? Number(s, "samplesPerSecond") : 0.0);
      queue.Add(v, Number(s, "queueDepth"));
      active.Add(v, Number(s, "activeWorkers"));
      for (const auto& [cause, n] : rr.worker_restarts) {
        auto with_cause = v;
        with_cause.push_back(cause);
        restarts.Add(with_cause, n);
      }
    }
    if (rr.pool) {
      const json by_reason = rr.pool->value("exitsByReason", json::object());
      for (const auto& [reason, n] : by_reason.items()) {
        if (!n.is_number()) continue;
        auto with_reason = v;
        with_reason.push_back(reason);
        exits.Add(with_reason, n.get<double>());
      }
    }
  }
  for (auto* f : {&batches, &samples, &stall_seconds, &stall_ratio, &sps, &queue, &active,
                  &restarts, &exits}) {
    out->push_back(std::move(*f));
  }
}

}  // namespace spawnpoint::agent
