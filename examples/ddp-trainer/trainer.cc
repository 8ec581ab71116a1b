// spawnpoint-example-trainer: a libtorch data-parallel trainer launched like a torchrun
// worker. DDP's Reducer cannot be compiled against Debian's libtorch headers, so gradients
// are averaged here the way the Reducer does it: flattened into buckets, one allreduce per
// bucket, divided by the world size.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "agent/loader/torch/torch_batch.h"
#include "agent/progress/step.h"
#include "examples/ddp-trainer/config.h"
#include "examples/ddp-trainer/dataset.h"
#include "examples/ddp-trainer/net.h"

namespace spawnpoint::trainer {
namespace {

constexpr const char* kProg = "spawnpoint-example-trainer";
constexpr int64_t kInputs = 32;
constexpr int64_t kTeacherHidden = 64;
constexpr int64_t kOutputs = 8;
constexpr double kLabelNoise = 0.05;
static_assert(kInputs == kFeatures && kOutputs == kNoise, "the loader's fields feed the model");

long long UnixNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct DataSet {
  torch::Tensor x;
  torch::Tensor y;
};

// A regression task with real structure: targets come from a fixed random two-layer
// "teacher" network plus a little noise, so the student can learn far below the initial
// loss but not to zero. Every rank builds the same set from the same seed.
DataSet MakeDataSet(int64_t samples, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto w1 = torch::randn({kInputs, kTeacherHidden}, gen) / std::sqrt(double(kInputs));
  auto b1 = torch::randn({kTeacherHidden}, gen) * 0.5;
  auto w2 =
      torch::randn({kTeacherHidden, kOutputs}, gen) * (2.0 / std::sqrt(double(kTeacherHidden)));
  auto x = torch::randn({samples, kInputs}, gen);
  auto y = torch::tanh(x.mm(w1) + b1).mm(w2) + kLabelNoise * torch::randn({samples, kOutputs}, gen);
  return {x, y};
}

uint64_t HashParameters(const std::vector<torch::Tensor>& params) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& p : params) {
    auto t = p.detach().to(torch::kFloat32).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    size_t n = t.numel() * sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      h ^= bytes[i];
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

// Parameter indices per bucket. Reverse parameter order, as DDP does, because that is the
// order backward produces gradients in (what a future overlap of communication and
// backward would need); a parameter larger than the cap gets a bucket of its own.
std::vector<std::vector<size_t>> MakeBuckets(const std::vector<torch::Tensor>& params,
                                             int64_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = params.size(); k-- > 0;) {
    int64_t bytes = params[k].numel() * static_cast<int64_t>(params[k].element_size());
    if (buckets.empty() || (filled > 0 && filled + bytes > cap_bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += bytes;
  }
  return buckets;
}

// All buckets are enqueued before any is waited on, so gloo works on several at once.
void AverageGradients(c10d::ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                      const std::vector<std::vector<size_t>>& buckets, int world_size) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<torch::Tensor>> flats(buckets.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<torch::Tensor> pieces;
    for (size_t k : buckets[b]) {
      auto g = params[k].grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : torch::zeros({params[k].numel()}));
    }
    flats[b] = {torch::cat(pieces)};
    works.push_back(pg.allreduce(flats[b]));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    {
      spawnpoint::PeerWait waiting;  // the agent tells a straggler by its ranks' waits
      works[b]->wait();
    }
    auto flat = flats[b][0].div_(world_size);
    int64_t offset = 0;
    for (size_t k : buckets[b]) {
      auto& p = params[k];
      int64_t n = p.numel();
      auto avg = flat.narrow(0, offset, n).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else {
        p.mutable_grad() = avg.clone();
      }
      offset += n;
    }
  }
}

// Ranks construct their models from different seeds on purpose: only this broadcast
// makes them identical, so the final hash check also proves the broadcast happened.
void BroadcastParameters(c10d::ProcessGroup& pg, const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> pieces;
  for (const auto& p : params) pieces.push_back(p.reshape({-1}));
  std::vector<torch::Tensor> flat = {torch::cat(pieces)};
  c10d::BroadcastOptions opts;
  opts.rootRank = 0;
  pg.broadcast(flat, opts)->wait();
  int64_t offset = 0;
  for (const auto& p : params) {
    p.copy_(flat[0].narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

std::shared_ptr<gloo::transport::Device> MakeGlooDevice(const RankEnv& env) {
  if (!env.gloo_socket_ifname.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(env.gloo_socket_ifname);
  }
  if (IsLoopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr == "::1" ? "::1"
                                                                                    : "127.0.0.1");
  }
  // The address that routes to the master is reachable by peers on other nodes, which the
  // address this machine's hostname resolves to (createDefaultDevice) need not be.
  if (std::string local = LocalAddressFor(env.master_addr, env.master_port); !local.empty()) {
    try {
      return c10d::ProcessGroupGloo::createDeviceForHostname(local);
    } catch (const std::exception&) {
    }
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

void PrintTiming(const Flags& flags, const RankEnv& env, const char* event, long long ns) {
  if (flags.timing) std::printf("timing rank=%d event=%s unix_ns=%lld\n", env.rank, event, ns);
}

// The rank stops making steps, as one does whose filesystem stopped answering. Its name is
// what the agent's stall report should show.
[[noreturn]] __attribute__((noinline)) void HangForever(const RankEnv& env, int64_t step) {
  std::fprintf(stderr, "%s: rank %d: hanging at step %lld (--hang-at-step)\n", kProg, env.rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  for (;;) {
    struct timespec forever = {3600, 0};
    nanosleep(&forever, nullptr);
  }
}

[[noreturn]] void InjectFailure(const Flags& flags, const RankEnv& env, int64_t step) {
  // The moment of death, for measuring how long a launcher takes to get the group back.
  PrintTiming(flags, env, "fail", UnixNs());
  if (flags.fail_signal != 0) {
    std::fprintf(stderr, "%s: rank %d: raising signal %d at step %lld (--fail-at-step)\n", kProg,
                 env.rank, flags.fail_signal, static_cast<long long>(step));
  } else {
    std::fprintf(stderr, "%s: rank %d: exiting with code %d at step %lld (--fail-at-step)\n", kProg,
                 env.rank, flags.fail_exit_code, static_cast<long long>(step));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  if (flags.fail_signal != 0) {
    std::signal(flags.fail_signal, SIG_DFL);
    std::raise(flags.fail_signal);
    // Signals whose default action is to ignore (SIGCHLD, SIGURG, ...) land here.
    _exit(128 + flags.fail_signal);
  }
  // _exit, not exit: a crashing rank does not shut its process group down politely.
  _exit(flags.fail_exit_code);
}

struct Teacher {
  torch::Tensor w1, b1, w2;
  torch::Tensor operator()(const torch::Tensor& x) const {
    return torch::tanh(x.mm(w1) + b1).mm(w2);
  }
};

// The same teacher MakeDataSet uses, for targets of batches that come from the loader.
Teacher MakeTeacher(uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  Teacher t;
  t.w1 = torch::randn({kInputs, kTeacherHidden}, gen) / std::sqrt(double(kInputs));
  t.b1 = torch::randn({kTeacherHidden}, gen) * 0.5;
  t.w2 = torch::randn({kTeacherHidden, kOutputs}, gen) * (2.0 / std::sqrt(double(kTeacherHidden)));
  return t;
}

int Train(const Flags& flags, const RankEnv& env) {
  const auto timeout = std::chrono::milliseconds(int64_t{flags.timeout_seconds} * 1000);
  const int64_t shard = int64_t{flags.steps_per_epoch} * flags.batch_size;
  const int64_t samples = shard * env.world_size;
  // The loader first: its workers warm up while the ranks rendezvous.
  std::unique_ptr<loader::TorchLoader> batches;
  if (flags.data == "loader") {
    loader::LoaderOptions lo;
    lo.dataset = kDatasetName;
    lo.dataset_arg = DatasetArg(samples, flags.seed, flags.decode_passes);
    lo.batch_size = flags.batch_size;
    lo.shuffle = true;
    lo.drop_last = true;
    lo.seed = flags.seed;
    lo.rank = env.rank;
    lo.world_size = env.world_size;
    auto made = loader::TorchLoader::Create(lo);
    if (!made.ok()) {
      std::fprintf(stderr, "%s: rank %d: loader: %s\n", kProg, env.rank,
                   made.status().message().c_str());
      return 1;
    }
    batches = std::move(*made);
  }
  const bool store_server = !env.use_agent_store && env.rank == 0;
  if (!store_server) {
    Status st = WaitForListener(env.master_addr, env.master_port,
                                std::chrono::steady_clock::now() + timeout);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: rank %d: %s\n", kProg, env.rank, st.message().c_str());
      return 1;
    }
  }
  c10d::TCPStoreOptions store_opts;
  store_opts.port = static_cast<uint16_t>(env.master_port);
  store_opts.isServer = store_server;
  // Clients need numWorkers too: that is what makes each of them check in with the server,
  // which waits for all of them (torch.distributed does the same).
  store_opts.numWorkers = static_cast<size_t>(env.world_size);
  store_opts.waitWorkers = true;
  store_opts.timeout = timeout;
  auto tcp_store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);
  // torchrun's prefix: keys of an earlier attempt on a long-lived agent store stay invisible.
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "/worker/attempt_" + std::to_string(env.restart_count), tcp_store);

  auto pg_opts = c10d::ProcessGroupGloo::Options::create(timeout);
  pg_opts->devices.push_back(MakeGlooDevice(env));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, pg_opts);
  PrintTiming(flags, env, "pg_ready", UnixNs());

  DataSet data;
  Teacher teacher;
  if (batches) {
    teacher = MakeTeacher(flags.seed);
  } else {
    data = MakeDataSet(samples, flags.seed);
  }

  torch::manual_seed(flags.seed + 1000003ULL * (env.rank + 1));
  torch::nn::Sequential model(torch::nn::Linear(kInputs, flags.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(flags.hidden, flags.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(flags.hidden, kOutputs));
  std::vector<torch::Tensor> params = model->parameters();
  BroadcastParameters(*pg, params);
  auto buckets = MakeBuckets(params, flags.bucket_bytes);
  int64_t param_count = 0;
  for (const auto& p : params) param_count += p.numel();

  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));

  if (env.rank == 0) {
    std::printf(
        "trainer: world_size=%d restart=%d backend=%s store=%s params=%lld buckets=%zu "
        "threads=%d samples_per_epoch=%lld\n",
        env.world_size, env.restart_count, env.backend.c_str(), store_server ? "rank0" : "agent",
        static_cast<long long>(param_count), buckets.size(), torch::get_num_threads(),
        static_cast<long long>(samples));
  }

  int64_t step = 0;
  bool first_allreduce = true;
  double last_epoch_loss = 0;
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    auto epoch_start = std::chrono::steady_clock::now();
    // DistributedSampler's scheme: one permutation per epoch shared by all ranks, rank r
    // takes every world_size-th index starting at r, so the shards are disjoint.
    torch::Tensor mine;
    if (batches) {
      if (Status st = batches->StartEpoch(epoch); !st.ok()) {
        std::fprintf(stderr, "%s: rank %d: loader: %s\n", kProg, env.rank, st.message().c_str());
        return 1;
      }
      // Which processes load this rank's data: persistent workers keep their pids across
      // epochs and across restarts of the rank.
      std::string pids;
      for (pid_t pid : batches->loader().WorkerPids()) {
        pids += (pids.empty() ? "" : ",") + std::to_string(pid);
      }
      if (!pids.empty()) {
        std::printf("loader rank=%d epoch=%d restart=%d worker_pids=%s\n", env.rank, epoch,
                    env.restart_count, pids.c_str());
      }
    } else {
      auto perm_gen = at::detail::createCPUGenerator(flags.seed ^ (0x9e3779b97f4a7c15ULL + epoch));
      auto perm = torch::randperm(samples, perm_gen, torch::TensorOptions(torch::kLong));
      mine = perm.slice(0, env.rank, samples, env.world_size);
    }
    double loss_sum = 0;
    for (int s = 0; s < flags.steps_per_epoch; ++s, ++step) {
      if (step == flags.fail_at_step && env.rank == flags.fail_rank && env.restart_count == 0) {
        InjectFailure(flags, env, step);
      }
      if (step == flags.hang_at_step && env.rank == flags.fail_rank && env.restart_count == 0) {
        HangForever(env, step);
      }
      torch::Tensor xb, yb;
      if (batches) {
        auto next = batches->Next();
        if (!next.ok() || !next->has_value()) {
          std::fprintf(stderr, "%s: rank %d: loader: %s\n", kProg, env.rank,
                       next.ok() ? "the epoch ended early" : next.status().message().c_str());
          return 1;
        }
        const loader::TensorBatch& b = **next;
        xb = b["x"];
        torch::NoGradGuard no_grad;
        yb = teacher(xb) + kLabelNoise * b["noise"];
      } else {
        auto idx = mine.slice(0, int64_t{s} * flags.batch_size, int64_t{s + 1} * flags.batch_size);
        xb = data.x.index_select(0, idx);
        yb = data.y.index_select(0, idx);
      }
      optimizer.zero_grad();
      auto loss = torch::mse_loss(model->forward(xb), yb);
      loss.backward();
      AverageGradients(*pg, params, buckets, env.world_size);
      if (first_allreduce) {
        PrintTiming(flags, env, "first_allreduce", UnixNs());
        first_allreduce = false;
      }
      optimizer.step();
      spawnpoint::Step();  // the agent counts this rank's steps (stall and straggler reports)
      loss_sum += loss.item<double>();
    }
    last_epoch_loss = loss_sum / flags.steps_per_epoch;
    // The progress line shows the mean over all ranks, not just rank 0's shard.
    std::vector<torch::Tensor> sum = {torch::tensor({loss_sum}, torch::kFloat64)};
    pg->allreduce(sum)->wait();
    if (env.rank == 0) {
      double secs = Seconds(epoch_start);
      double global_loss = sum[0].item<double>() / (double(flags.steps_per_epoch) * env.world_size);
      std::string stall;
      if (batches) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), " data_stall=%.1f%%",
                      100.0 * batches->loader().Stats().stall_fraction);
        stall = buf;
      }
      std::printf("epoch %d/%d loss=%.6f samples/s=%.1f time=%.3fs%s\n", epoch + 1, flags.epochs,
                  global_loss, double(samples) / secs, secs, stall.c_str());
    }
  }

  pg->barrier()->wait();
  std::printf("final rank=%d loss=%.6f params=%016llx\n", env.rank, last_epoch_loss,
              static_cast<unsigned long long>(HashParameters(params)));
  PrintTiming(flags, env, "end", UnixNs());
  std::fflush(stdout);
  pg.reset();
  store.reset();
  tcp_store.reset();
  return 0;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace
}  // namespace spawnpoint::trainer

int main(int argc, char** argv) {
  using namespace spawnpoint::trainer;
  const long long start_ns = UnixNs();
  // Started as a loader worker (by the agent's pool, or by our own standalone Loader):
  // serve batches and never come back here.
  if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  // Progress must reach a supervisor's pipe as it happens, not when a buffer fills.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  auto flags = ParseFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, flags.status().message().c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(Usage(), stdout);
    return 0;
  }
  // Debian's libtorch is CPU-only and has no NCCL process group to call.
  constexpr bool kNcclSupported = false;
  auto env = ReadRankEnv([](const char* name) { return std::getenv(name); }, kNcclSupported);
  if (!env.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, env.status().message().c_str());
    return 2;
  }
  if (auto st = CheckFlagsAgainstEnv(*flags, *env); !st.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, st.message().c_str());
    return 2;
  }
  PrintTiming(*flags, *env, "start", start_ns);
  // One intra-op thread per rank unless asked: N ranks on N cores must not oversubscribe.
  if (!env->omp_num_threads_set) torch::set_num_threads(1);

  try {
    return Train(*flags, *env);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProg, env->rank,
                 FirstLine(e.what_without_backtrace()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProg, env->rank, FirstLine(e.what()).c_str());
  }
  return 1;
}
