#include "agent/loader/loader.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "agent/loader/auto_worker_policy.h"
#include "agent/loader/contract.h"
#include "agent/loader/in_process_loader.h"
#include "agent/loader/pool_client.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/loader/sampler.h"
#include "agent/loader/throughput_meter.h"
#include "agent/progress/progress_file.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

constexpr auto kStatsInterval = std::chrono::seconds(1);
// Next() reports a deadlock when it has waited this long with every slot held by batches
// the trainer has not released and nothing left in flight.
constexpr auto kSlotDeadlockAfter = std::chrono::seconds(2);
// How long Next() waits for the client before it looks for that deadlock again.
constexpr auto kNextPoll = std::chrono::milliseconds(100);

struct PoolLoaderConfig {
  LoaderOptions opts;
  SamplerOptions sampler;  // all but dataset_size, which the workers tell
  int pool_workers = 0;
  int initial_active = 0;
  int auto_cap = 0;  // > 0: tune the number of active workers up to this
  bool agent_mode = false;
  std::string dir;
  std::unique_ptr<StandalonePool> standalone;
  const Clock* clock = nullptr;
  Clock::TimePoint created;
};

// Workers in a pool: each epoch is planned with the sampler and submitted to a PoolClient,
// whose ready batches Next() hands out in order as views of the ring; auto workers tune the
// active count as batches are consumed; in agent mode stats.json is rewritten every second.
// Thread-safety as Loader's: StartEpoch/Next on the training thread, the rest from any.
class PoolLoader : public Loader {
 public:
  explicit PoolLoader(PoolLoaderConfig config);
  ~PoolLoader() override;

  // Starts the client and plans epoch 0 ahead. REQUIRES: before any other method.
  Status Init();

  int64_t DatasetSize() const override { return sampler_.dataset_size; }
  int64_t BatchesPerEpoch() const override { return loader::BatchesPerEpoch(sampler_); }
  const LoaderOptions& options() const override { return opts_; }
  std::vector<pid_t> WorkerPids() const override { return client_->WorkerPids(); }
  Status StartEpoch(int64_t epoch) override;
  StatusOr<BatchPtr> Next() override;
  LoaderStats Stats() const override;

 private:
  struct EpochPlan {
    int64_t batches = 0;
    int64_t next_yield = 0;  // in order: the batch Next() hands out next
    int64_t yielded = 0;
  };

  // Submits epoch `epoch`'s batches to the client. REQUIRES: the training thread.
  void Plan(int64_t epoch);
  // The batch as a view of its ring slot, which returns to the pool when the batch is freed.
  BatchPtr View(ReadyBatch r) const;
  // Best effort: the agent reads it for display; a failed write must not stop loading.
  void WriteStats() const;

  // Constant after Init().
  const LoaderOptions opts_;
  const bool agent_mode_;
  const std::string dir_;
  const Clock* const clock_;
  const Clock::TimePoint created_;
  SamplerOptions sampler_;
  std::unique_ptr<StandalonePool> standalone_;  // outlives client_
  std::unique_ptr<PoolClient> client_;

  // Used by the training thread only.
  std::map<int64_t, EpochPlan> plans_;

  // Guarded by mu_ (Stats() reads them from any thread; written by the training thread).
  mutable std::mutex mu_;
  int64_t current_epoch_ = -1;
  ThroughputMeter tp_;
  AutoWorkerPolicy auto_;
};

PoolLoader::PoolLoader(PoolLoaderConfig config)
    : opts_(std::move(config.opts)),
      agent_mode_(config.agent_mode),
      dir_(config.dir),
      clock_(config.clock),
      created_(config.created),
      sampler_(config.sampler),
      standalone_(std::move(config.standalone)),
      tp_(config.created),
      auto_(config.initial_active, config.auto_cap, *opts_.prefetch_factor, opts_.auto_window) {
  PoolClientOptions c{
      .dir = config.dir,
      .workers = config.pool_workers,
      .initial_active = config.initial_active,
      .prefetch_factor = *opts_.prefetch_factor,
      .timeout = *opts_.timeout,
      .max_attempts = opts_.max_attempts,
      .slot_bytes = opts_.slot_bytes,
      .shm_dir = opts_.shm_dir,
      .dataset = opts_.dataset,
      .dataset_arg = opts_.dataset_arg,
      .seed = *opts_.seed,
      .rank = *opts_.rank,
      .world_size = *opts_.world_size,
      .probe_batch =
          [sampler = sampler_](int64_t dataset_size) {
            SamplerOptions s = sampler;
            s.dataset_size = dataset_size;
            std::vector<std::vector<int64_t>> first = EpochBatches(s, 0);
            return first.empty() ? std::vector<int64_t>{} : std::move(first[0]);
          },
      .clock = clock_,
  };
  if (agent_mode_) {
    c.on_tick = [this] { WriteStats(); };
    c.tick_interval = kStatsInterval;
  }
  client_ = std::make_unique<PoolClient>(std::move(c));
}

PoolLoader::~PoolLoader() {
  client_->Stop();
  // The final figures: a short attempt may end before the periodic write comes round.
  if (agent_mode_) WriteStats();
}

Status PoolLoader::Init() {
  SP_RETURN_IF_ERROR(client_->Start());
  sampler_.dataset_size = client_->dataset_size();
  // Issue the first epoch's batches while the trainer gets ready.
  if (opts_.prefetch_next_epoch) Plan(0);
  return Status::Ok();
}

void PoolLoader::Plan(int64_t epoch) {
  std::vector<std::vector<int64_t>> batches = EpochBatches(sampler_, epoch);
  plans_[epoch] = EpochPlan{static_cast<int64_t>(batches.size())};
  client_->Submit(epoch, 0, std::move(batches));
}

Status PoolLoader::StartEpoch(int64_t epoch) {
  SP_RETURN_IF_ERROR(client_->error());
  // Batches issued ahead for this epoch are kept if none was consumed yet; everything else
  // is dropped: the trainer left an epoch early, restarts one, or did not continue with
  // the epoch issued ahead.
  auto existing = plans_.find(epoch);
  const bool keep = existing != plans_.end() && existing->second.yielded == 0;
  client_->DropAllBut(keep ? std::optional<int64_t>(epoch) : std::nullopt);
  std::erase_if(plans_, [&](const auto& p) { return !keep || p.first != epoch; });
  if (!keep) Plan(epoch);
  if (opts_.prefetch_next_epoch) Plan(epoch + 1);
  std::lock_guard<std::mutex> lock(mu_);
  current_epoch_ = epoch;
  tp_.Started(clock_->Now());
  return Status::Ok();
}

StatusOr<BatchPtr> PoolLoader::Next() {
  if (current_epoch_ < 0) {
    SP_RETURN_IF_ERROR(client_->error());
    return FailedPrecondition("loader: Next() before StartEpoch()");
  }
  const auto start = clock_->Now();
  Clock::TimePoint starved_since{};
  bool starving = false;
  EpochPlan& plan = plans_.at(current_epoch_);
  while (true) {
    SP_RETURN_IF_ERROR(client_->error());
    if (plan.yielded >= plan.batches) {
      std::lock_guard<std::mutex> lock(mu_);
      tp_.Waited(clock_->Now() - start);
      return BatchPtr(nullptr);
    }
    const auto wanted = opts_.in_order ? std::optional<int64_t>(plan.next_yield) : std::nullopt;
    SP_ASSIGN_OR_RETURN(std::optional<ReadyBatch> ready,
                        client_->Take(current_epoch_, wanted, kNextPoll));
    if (ready) {
      ++plan.yielded;
      if (opts_.in_order) ++plan.next_yield;
      const auto samples = static_cast<int64_t>(ready->indices.size());
      BatchPtr batch = View(std::move(*ready));
      progress::CountStep(progress::StepSource::kLoader);  // the rank's progress record
      const auto now = clock_->Now();
      std::lock_guard<std::mutex> lock(mu_);
      tp_.Waited(now - start);
      tp_.Consumed(now, samples);
      client_->SetActiveWorkers(auto_.OnBatch(now));
      return batch;
    }
    // Every slot held by the trainer and nothing in flight: no batch can ever come.
    if (!client_->SlotsExhausted()) {
      starving = false;
      continue;
    }
    const auto now = clock_->Now();
    if (!starving) starved_since = now;
    starving = true;
    if (now - starved_since > kSlotDeadlockAfter) {
      Status st = FailedPrecondition(
          "loader: all " + std::to_string(client_->slot_count()) +
          " shared-memory slots are held by batches the trainer has not released, so no "
          "further batch can be built; drop batches (and tensors viewing them) before "
          "asking for more, or raise prefetchFactor to get more slots");
      client_->Fail(st);
      return st;
    }
  }
}

BatchPtr PoolLoader::View(ReadyBatch r) const {
  auto batch = std::make_unique<Batch>();
  batch->epoch = r.epoch;
  batch->index = r.batch;
  batch->sample_indices = std::move(r.indices);
  batch->worker_id = r.worker;
  std::shared_ptr<ShmRing> ring = client_->ring();
  std::byte* base = ring->Slot(static_cast<size_t>(r.slot));
  for (const auto& f : r.fields) {
    BatchField field;
    field.name = f.value("name", "");
    auto dtype = ParseDType(f.value("dtype", "u8"));
    field.dtype = dtype.ok() ? *dtype : DType::kU8;
    field.shape = f.value("shape", std::vector<int64_t>{});
    field.data = base + f.value("offset", size_t{0});
    field.nbytes = f.value("nbytes", size_t{0});
    batch->fields.push_back(std::move(field));
  }
  // The slot returns to the pool when the trainer drops the batch; the ring mapping stays
  // alive until then even if the Loader is destroyed first.
  return MakeBatch(std::move(batch),
                   [pool = client_->slot_pool(), ring, slot = r.slot] { pool->Release(slot); });
}

LoaderStats PoolLoader::Stats() const {
  LoaderStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tp_.Fill(s, clock_->Now());
    s.epoch = current_epoch_;
    s.auto_workers = auto_.enabled();
    s.auto_settled = auto_.settled();
  }
  SetPoolFields(client_->Stats(), s);
  const PoolStartTimes t = client_->start_times();
  auto secs = [](Clock::Duration d) { return std::chrono::duration<double>(d).count(); };
  if (s.first_batch_seconds >= 0 && t.ring_ready != Clock::TimePoint{}) {
    s.first_batch_spawn_s = secs(t.start - created_);
    s.first_batch_connect_s = secs(t.hello - t.start);
    if (t.probe_sent != Clock::TimePoint{}) {
      s.first_batch_probe_s = secs(t.probe_result - t.probe_sent);
      s.first_batch_ring_s = secs(t.ring_ready - t.probe_result);
    }
    s.first_batch_build_s = t.probe_build_s;
    s.first_batch_handover_s = s.first_batch_seconds - secs(t.ring_ready - created_);
    s.first_batch_in_place = t.in_place;
  }
  return s;
}

void PoolLoader::WriteStats() const {
  (void)WriteFileAtomically(StatsPath(dir_), Stats().ToJson().dump(2) + "\n");
}

StatusOr<std::vector<std::string>> OwnCommand() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Internal(std::string("readlink /proc/self/exe: ") + strerror(errno));
  exe[n] = '\0';
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (argv.empty()) argv.push_back(exe);
  // /proc/self/exe names the program image even if argv[0] is a bare name or a symlink.
  argv[0] = exe;
  return argv;
}

}  // namespace

void SetPoolFields(const PoolClientStats& c, LoaderStats& s) {
  s.queue_depth = c.queue_depth;
  s.in_flight = c.in_flight;
  s.active_workers = c.active_workers;
  s.pool_workers = c.pool_workers;
  s.restarts_died = c.restarts_died;
  s.restarts_hung = c.restarts_hung;
  s.restarts_oom = c.restarts_oom;
  s.restarts_shm = c.restarts_shm;
  s.slots = c.slots;
  s.slot_bytes = c.slot_bytes;
}

nlohmann::json LoaderStats::ToJson() const {
  return {{"epoch", epoch},
          {"batches", batches},
          {"samples", samples},
          {"batchesPerSecond", batches_per_second},
          {"samplesPerSecond", samples_per_second},
          {"waitSeconds", wait_seconds},
          {"dataStall", stall_fraction},
          {"firstBatchSeconds", first_batch_seconds},
          {"queueDepth", queue_depth},
          {"inFlight", in_flight},
          {"activeWorkers", active_workers},
          {"poolWorkers", pool_workers},
          {"autoWorkers", auto_workers},
          {"autoSettled", auto_settled},
          {"restarts",
           {{"died", restarts_died},
            {"hung", restarts_hung},
            {"oom", restarts_oom},
            {"shm", restarts_shm}}},
          {"slots", slots},
          {"slotBytes", slot_bytes}};
}

StatusOr<std::unique_ptr<Loader>> Loader::Create(LoaderOptions options) {
  if (getenv(kEnvListenFd) != nullptr) {
    return FailedPrecondition(
        "loader: this process was started as a loader worker but is running the trainer's "
        "code: call spawnpoint::loader::RunWorkerIfRequested(argc, argv) first thing in main");
  }
  const Clock* clock = RealClock::Get();
  const Clock::TimePoint created = clock->Now();
  SP_ASSIGN_OR_RETURN(LoaderOptions o, ResolveLoaderOptions(std::move(options)));
  const SamplerOptions sampler{.batch_size = o.batch_size,
                               .shuffle = o.shuffle,
                               .drop_last = o.drop_last,
                               .seed = *o.seed,
                               .rank = *o.rank,
                               .world_size = *o.world_size};

  if (o.workers == 0) return CreateInProcessLoader(std::move(o), sampler, clock);

  PoolLoaderConfig config;
  config.created = created;
  config.clock = clock;
  const int cap = std::min(8, *o.cpus);
  if (!o.pool_dir.empty()) {
    SP_ASSIGN_OR_RETURN(const int pool_size, AgentPoolSize(ProcessEnv));
    config.agent_mode = true;
    config.dir = o.pool_dir;
    config.pool_workers = pool_size;
    if (o.workers == kAutoWorkers) {
      config.auto_cap = std::min(config.pool_workers, std::max(1, *o.cpus));
      config.initial_active = 1;
    } else {
      config.initial_active = std::min(o.workers, config.pool_workers);
    }
  } else {
    std::vector<std::string> argv = o.worker_command;
    if (argv.empty()) {
      if (!WorkerEntryPointCalled()) {
        return FailedPrecondition(
            "loader: workers re-run this program, which must call "
            "spawnpoint::loader::RunWorkerIfRequested(argc, argv) first thing in main (or set "
            "LoaderOptions::worker_command)");
      }
      SP_ASSIGN_OR_RETURN(argv, OwnCommand());
    }
    PoolSpec spec;
    spec.rank = *o.rank;
    spec.workers = o.workers == kAutoWorkers ? cap : o.workers;
    spec.argv = argv;
    for (char** e = environ; *e != nullptr; ++e) spec.env.push_back(*e);
    spec.sink_fd = o.output_fd;
    spec.remove_dir = true;
    std::string tmpl =
        (std::filesystem::temp_directory_path() /
         ("spawnpoint-" + std::to_string(getpid()) + "-rank" + std::to_string(*o.rank) + "-XXXXXX"))
            .string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Internal("loader: cannot create a pool directory like " + tmpl + ": " +
                      strerror(errno));
    }
    spec.dir = tmpl;
    config.dir = tmpl;
    config.pool_workers = spec.workers;
    config.initial_active = o.workers == kAutoWorkers ? 1 : o.workers;
    config.auto_cap = o.workers == kAutoWorkers ? cap : 0;
    auto pool = StandalonePool::Start(std::move(spec));
    if (!pool.ok()) {
      std::error_code ec;
      std::filesystem::remove_all(tmpl, ec);
      return pool.status();
    }
    config.standalone = std::move(pool).value();
  }
  config.opts = std::move(o);
  config.sampler = sampler;
  auto loader = std::make_unique<PoolLoader>(std::move(config));
  SP_RETURN_IF_ERROR(loader->Init());
  return std::unique_ptr<Loader>(std::move(loader));
}

}  // namespace spawnpoint::loader
