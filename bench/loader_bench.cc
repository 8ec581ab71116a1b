// spawnpoint-loader-bench: our side of `make bench-loader`, the counterpart of
// bench/loader_reference.py (PyTorch's DataLoader, spawn + persistent workers), measuring the
// same things the same way on the same workloads (bench/loader_bench_datasets.h).
//
// The Loader runs standalone (it spawns its own workers, as DataLoader does), or, as a rank
// under `spawnpoint-agent run`, on the agent's pool (SPAWNPOINT_LOADER_POOL_DIR); the trainer
// side receives every batch as torch::Tensor views (TorchLoader / ToTensors) and reads one
// element of it, as the reference reads batch[0, 0].
//
// The program is the torch half of a split trainer (spawnpoint_trainer_main, loaded by
// spawnpoint-loader-bench, whose workers load no libtorch) and also the whole of
// spawnpoint-loader-bench-linked (libtorch linked: its workers load it).
//
//   --worker-command PATH   the workers run PATH (a torch-free worker binary, the job's
//                           loader.workerCommand); default: this program itself (the
//                           trainer's own command in worker mode, the product default)
//   --out FILE              also write the result there (a rank under the agent)
//
// Prints one JSON object: first_batch_s (from creating the loader),
// first_batch_from_process_start_s (from this process's start: /proc/self/stat's starttime
// against CLOCK_BOOTTIME, 10 ms resolution, libtorch's load included), batches_per_s,
// epoch_boundary_ms, peak_rss_mb, epoch_boundary_matched_ms, checksum (defined as in the reference,
// whose docstring explains the two boundary measures), and a few details: the configuration, slots,
// slot bytes.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/loader.h"
#include "agent/loader/torch/torch_batch.h"
#include "agent/loader/worker.h"
#include "bench/loader_bench_datasets.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string workload;
  int workers = 2;
  int64_t batch_size = 32;
  int64_t batches = 40;  // per epoch
  int64_t epochs = 3;
  int prefetch = 2;
  int64_t sample_floats = 3 * 224 * 224;
  int64_t work_us = 2000;
  std::string worker_command;  // empty: this program
  bool gaps = false;           // also print every inter-batch gap (diagnostics)
  std::string out;             // also write the JSON result to this file
};

[[noreturn]] void Usage(const char* argv0, const std::string& error) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s --workload transfer|compute [--workers N] [--batch-size N] "
               "[--batches N] [--epochs N] [--prefetch N] [--sample-floats N] [--work-us N] "
               "[--worker-command PATH] [--out FILE] [--gaps]\n",
               argv0, error.c_str(), argv0);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--gaps") {
      f.gaps = true;
      continue;
    }
    if (i + 1 >= argc) Usage(argv[0], name + " needs a value");
    const std::string value = argv[++i];
    auto num = [&]() -> int64_t {
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (*end != '\0' || v < 0) Usage(argv[0], name + ": not a number: " + value);
      return v;
    };
    if (name == "--workload") {
      f.workload = value;
    } else if (name == "--workers") {
      f.workers = static_cast<int>(num());
    } else if (name == "--batch-size") {
      f.batch_size = num();
    } else if (name == "--batches") {
      f.batches = num();
    } else if (name == "--epochs") {
      f.epochs = num();
    } else if (name == "--prefetch") {
      f.prefetch = static_cast<int>(num());
    } else if (name == "--sample-floats") {
      f.sample_floats = num();
    } else if (name == "--work-us") {
      f.work_us = num();
    } else if (name == "--worker-command") {
      f.worker_command = value;
    } else if (name == "--out") {
      f.out = value;
    } else {
      Usage(argv[0], "unknown flag " + name);
    }
  }
  if (f.workload != "transfer" && f.workload != "compute") {
    Usage(argv[0], "--workload must be transfer or compute");
  }
  if (f.epochs < 2 || f.batches < 1 || f.workers < 1) {
    Usage(argv[0], "need --epochs >= 2, --batches >= 1 and --workers >= 1");
  }
  return f;
}

double VmHwmMb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Seconds since this process started, as bench/python_pool_bench.py computes it.
double SinceProcessStart() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 0; i < 20 && fields >> field; ++i) {
  }  // field 22 (starttime) is the 20th after the command
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  return static_cast<double>(now.tv_sec) + now.tv_nsec / 1e9 -
         std::strtod(field.c_str(), nullptr) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

extern "C" int spawnpoint_trainer_main(int argc, char** argv) {
  // First thing: in a worker started with this program's own command, serve batches (the
  // split executable has served its workers already; here it only tells the loader).
  if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  const Flags f = ParseFlags(argc, argv);

  spawnpoint::loader::LoaderOptions o;
  const int64_t size = f.batch_size * f.batches;
  if (f.workload == "transfer") {
    o.dataset = spawnpoint::bench::kTransferDataset;
    o.dataset_arg = "size=" + std::to_string(size) + ",floats=" + std::to_string(f.sample_floats);
  } else {
    o.dataset = spawnpoint::bench::kComputeDataset;
    o.dataset_arg = "size=" + std::to_string(size) + ",work_us=" + std::to_string(f.work_us);
  }
  o.batch_size = f.batch_size;
  o.shuffle = false;  // DataLoader(shuffle=False)
  o.workers = f.workers;
  o.prefetch_factor = f.prefetch;
  o.rank = 0;
  o.world_size = 1;
  if (!f.worker_command.empty()) o.worker_command = {f.worker_command};

  // From creating the loader (workers spawned by it) to the first batch in hand, as the
  // reference times DataLoader(...) to its first batch.
  const auto start = Clock::now();
  auto created = spawnpoint::loader::TorchLoader::Create(o, /*pin_memory=*/false);
  if (!created.ok()) {
    std::fprintf(stderr, "loader-bench: %s\n", created.status().ToString().c_str());
    return 1;
  }
  auto& loader = **created;

  double first_batch_s = -1;
  double first_batch_from_process_start_s = -1;
  double first_batch_monotonic = -1;
  std::vector<double> boundaries;
  std::vector<double> same_position;  // gaps before batches i % workers == 0, i > 0
  std::vector<double> gaps_ms;
  Clock::time_point last{}, steady_start{};
  int64_t steady_batches = 0;
  double checksum = 0;
  for (int64_t epoch = 0; epoch < f.epochs; ++epoch) {
    if (auto st = loader.StartEpoch(epoch); !st.ok()) {
      std::fprintf(stderr, "loader-bench: %s\n", st.ToString().c_str());
      return 1;
    }
    for (int64_t i = 0;; ++i) {
      auto next = loader.Next();
      if (!next.ok()) {
        std::fprintf(stderr, "loader-bench: %s\n", next.status().ToString().c_str());
        return 1;
      }
      if (!next->has_value()) break;
      const auto now = Clock::now();
      if (first_batch_s >= 0) gaps_ms.push_back(Seconds(now - last) * 1000.0);
      if (first_batch_s < 0) {
        first_batch_s = Seconds(now - start);
        first_batch_from_process_start_s = SinceProcessStart();
        first_batch_monotonic = Seconds(now.time_since_epoch());  // CLOCK_MONOTONIC
      } else if (i == 0) {
        boundaries.push_back(Seconds(now - last));
      } else if (epoch > 0 && i % f.workers == 0) {
        same_position.push_back(Seconds(now - last));
      }
      if (epoch > 0) ++steady_batches;  // every epoch after the first one's warm-up
      const torch::Tensor x = (**next)["x"];
      checksum += x.index({0, 0}).item<float>();  // float(batch[0, 0])
      last = now;
    }
    if (epoch == 0) steady_start = last;
  }
  if (steady_batches == 0) {
    std::fprintf(stderr, "loader-bench: no batches after the first epoch\n");
    return 1;
  }
  // Throughput over the steady epochs, epoch boundaries included (as the reference).
  const double steady_s = Seconds(last - steady_start) / static_cast<double>(steady_batches);
  const double median_boundary = Median(boundaries);
  const double peak_main = VmHwmMb(getpid());
  double peak = peak_main;
  for (pid_t pid : loader.loader().WorkerPids()) {
    if (pid > 0) peak += VmHwmMb(pid);
  }
  const auto stats = loader.loader().Stats();
  nlohmann::json out = {
      {"first_batch_s", first_batch_s},
      {"first_batch_from_process_start_s", first_batch_from_process_start_s},
      {"agent_pool", std::getenv("SPAWNPOINT_LOADER_POOL_DIR") != nullptr},
      {"first_batch_monotonic", first_batch_monotonic},
      {"batches_per_s", 1.0 / steady_s},
      {"epoch_boundary_ms", std::max(0.0, (median_boundary - steady_s) * 1000.0)},
      {"peak_rss_mb", peak},
      {"peak_rss_main_mb", peak_main},
      {"epoch_boundary_matched_ms",
       std::max(0.0,
                (median_boundary - (same_position.empty() ? steady_s : Median(same_position))) *
                    1000.0)},
      {"checksum", checksum},
      {"worker_command", f.worker_command.empty() ? "self" : f.worker_command},
      {"phase_spawn_s", stats.first_batch_spawn_s},
      {"phase_connect_s", stats.first_batch_connect_s},
      {"phase_probe_s", stats.first_batch_probe_s},
      {"phase_build_s", stats.first_batch_build_s},
      {"phase_ring_s", stats.first_batch_ring_s},
      {"phase_handover_s", stats.first_batch_handover_s},
      {"first_batch_in_place", stats.first_batch_in_place},
      {"slots", stats.slots},
      {"slot_bytes", stats.slot_bytes},
  };
  // The harness's spawn of the agent (CLOCK_MONOTONIC), as bench/python_pool_bench.py.
  if (const char* t0 = std::getenv("BENCH_T0"); t0 != nullptr && *t0 != '\0') {
    out["first_batch_from_launch_s"] = first_batch_monotonic - std::strtod(t0, nullptr);
  }
  if (f.gaps) out["gaps_ms"] = gaps_ms;
  std::printf("%s\n", out.dump().c_str());
  if (!f.out.empty()) {
    std::ofstream file(f.out + ".tmp");
    file << out.dump() << "\n";
    file.close();
    if (!file || std::rename((f.out + ".tmp").c_str(), f.out.c_str()) != 0) {
      std::fprintf(stderr, "loader-bench: cannot write %s\n", f.out.c_str());
      return 1;
    }
  }
  return 0;
}
