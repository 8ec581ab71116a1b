// A trainer-like program for the loader tests (and for measuring): it calls
// RunWorkerIfRequested first, so it also serves as its own loader worker, then iterates
// epochs and prints one line per batch:
//   batch epoch=E index=B worker=W indices=i,j,k ok=1
// ("ok" checks that every field's values encode the sample index). Then "stats {json}"
// and "done". Errors go to stderr as "error: ..." with exit code 1.
//   --dataset NAME --arg ARG --workers N|auto --batch B --epochs E --shuffle --seed S
//   --sleep-ms M (per batch: a slow consumer) --no-worker-entry --print-pids
//   --measure (prints a JSON line of timings instead of batch lines) --sum (read every byte)
//   --maps-of NAME (once the loader exists: "maps rank=R worker=W,W": 1 where this process
//   and each worker map a file whose path contains NAME, else 0)
// Built twice: as one executable, and as the torch half of a split trainer
// (SPLIT_TRAINER: spawnpoint-loader-test-split, agent/loader/split_trainer.h), the module
// having no torch here either, only the split.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "agent/loader/loader.h"

using namespace spawnpoint::loader;
using spawnpoint::Status;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool ValuesEncodeIndices(const Batch& b) {
  const BatchField* idx = b.Find("index");
  const BatchField* val = b.Find("value");
  if (idx == nullptr || idx->As<int64_t>().size() != b.size()) return false;
  for (size_t i = 0; i < b.size(); ++i) {
    if (idx->As<int64_t>()[i] != b.sample_indices[i]) return false;
  }
  if (val != nullptr && b.size() > 0) {
    auto v = val->As<float>();
    const size_t per = v.size() / b.size();
    for (size_t i = 0; i < b.size(); ++i) {
      if (v[i * per] != static_cast<float>(b.sample_indices[i])) return false;
    }
  }
  return true;
}

double SumBytes(const Batch& b) {
  double total = 0;
  for (const BatchField& f : b.fields) {
    const auto* p = static_cast<const unsigned char*>(f.data);
    uint64_t s = 0;
    for (size_t i = 0; i < f.nbytes; i += 64) s += p[i];
    total += static_cast<double>(s);
  }
  return total;
}

// 1 if process `pid` maps a file whose path contains `name`.
int Maps(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(name) != std::string::npos) return 1;
  }
  return 0;
}

}  // namespace

#ifdef SPLIT_TRAINER
extern "C" int spawnpoint_trainer_main(int argc, char** argv) {
#else
int main(int argc, char** argv) {
#endif
  bool worker_entry = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-worker-entry") == 0) worker_entry = false;
  }
  if (worker_entry) {
    if (int rc = RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  }

  LoaderOptions o;
  o.dataset = "index";
  int epochs = 1, sleep_ms = 0;
  bool print_pids = false, measure = false, sum = false;
  std::string maps_of;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--dataset")
      o.dataset = next();
    else if (a == "--arg")
      o.dataset_arg = next();
    else if (a == "--workers") {
      std::string w = next();
      o.workers = w == "auto" ? kAutoWorkers : std::stoi(w);
    } else if (a == "--batch")
      o.batch_size = std::stoll(next());
    else if (a == "--epochs")
      epochs = std::stoi(next());
    else if (a == "--shuffle")
      o.shuffle = true;
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--sleep-ms")
      sleep_ms = std::stoi(next());
    else if (a == "--print-pids")
      print_pids = true;
    else if (a == "--measure")
      measure = true;
    else if (a == "--sum")
      sum = true;
    else if (a == "--maps-of")
      maps_of = next();
    else if (a == "--prefetch")
      o.prefetch_factor = std::stoi(next());
  }

  const auto t0 = Clock::now();
  auto loader = Loader::Create(o);
  if (!loader.ok()) {
    std::fprintf(stderr, "error: %s\n", loader.status().ToString().c_str());
    return 1;
  }
  const double create_s = Since(t0);
  if (print_pids) {
    std::printf("pids");
    for (pid_t p : (*loader)->WorkerPids()) std::printf(" %d", p);
    std::printf("\n");
    std::fflush(stdout);
  }
  if (!maps_of.empty()) {
    std::printf("maps rank=%d worker=", Maps(getpid(), maps_of));
    const char* sep = "";
    for (pid_t p : (*loader)->WorkerPids()) {
      std::printf("%s%d", sep, Maps(p, maps_of));
      sep = ",";
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  double first_batch_s = -1, boundary_max_ms = 0, sink = 0;
  int64_t steady_batches = 0;
  Clock::time_point steady_start{}, last_batch{};
  bool epoch_end_pending = false;
  for (int e = 0; e < epochs; ++e) {
    Status st = (*loader)->StartEpoch(e);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
      return 1;
    }
    int64_t in_epoch = 0;
    while (true) {
      auto b = (*loader)->Next();
      if (!b.ok()) {
        std::fprintf(stderr, "error: %s\n", b.status().ToString().c_str());
        return 1;
      }
      if (*b == nullptr) break;
      const Batch& batch = **b;
      const auto now = Clock::now();
      if (first_batch_s < 0) {
        first_batch_s = Since(t0);
        steady_start = now;
      } else {
        ++steady_batches;
      }
      if (epoch_end_pending && in_epoch == 0) {
        // From the previous epoch's last batch to this epoch's first.
        boundary_max_ms = std::max(
            boundary_max_ms, std::chrono::duration<double, std::milli>(now - last_batch).count());
        epoch_end_pending = false;
      }
      last_batch = now;
      ++in_epoch;
      if (sum) sink += SumBytes(batch);
      if (!measure) {
        std::printf("batch epoch=%lld index=%lld worker=%d indices=", (long long)batch.epoch,
                    (long long)batch.index, batch.worker_id);
        for (size_t i = 0; i < batch.size(); ++i) {
          std::printf("%s%lld", i ? "," : "", (long long)batch.sample_indices[i]);
        }
        std::printf(" ok=%d\n", ValuesEncodeIndices(batch) ? 1 : 0);
        std::fflush(stdout);
      }
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    epoch_end_pending = true;
  }
  const LoaderStats s = (*loader)->Stats();
  if (measure) {
    const double steady_s = std::chrono::duration<double>(last_batch - steady_start).count();
    std::printf(
        "{\"create_s\":%.4f,\"first_batch_s\":%.4f,\"batches_per_s\":%.2f,"
        "\"epoch_boundary_ms\":%.3f,\"stall\":%.3f,\"slot_bytes\":%zu,\"sink\":%g}\n",
        create_s, first_batch_s, steady_s > 0 ? steady_batches / steady_s : 0, boundary_max_ms,
        s.stall_fraction, s.slot_bytes, sink > 0 ? 1.0 : 0.0);
  }
  std::printf("stats %s\n", s.ToJson().dump().c_str());
  std::printf("done\n");
  return 0;
}
