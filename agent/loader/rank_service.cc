#include "agent/loader/rank_service.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "agent/loader/contract.h"

namespace spawnpoint::loader {
namespace {

constexpr auto kStatsInterval = std::chrono::seconds(1);
// How long the sender waits in Take before it looks again at what the rank still expects
// (a Drop may have removed the batch it waits for).
constexpr auto kTakePoll = std::chrono::milliseconds(20);

int64_t Int(const nlohmann::json& body, const char* key, int64_t fallback) {
  auto it = body.find(key);
  return it != body.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

std::vector<int64_t> Indices(const nlohmann::json& v) {
  std::vector<int64_t> out;
  if (!v.is_array()) return out;
  out.reserve(v.size());
  for (const auto& x : v) {
    if (x.is_number_integer()) out.push_back(x.get<int64_t>());
  }
  return out;
}

void AddRestarts(PoolClientStats& total, const PoolClientStats& s) {
  total.restarts_died += s.restarts_died;
  total.restarts_hung += s.restarts_hung;
  total.restarts_oom += s.restarts_oom;
  total.restarts_shm += s.restarts_shm;
}

}  // namespace

StatusOr<std::unique_ptr<RankPoolService>> RankPoolService::Start(RankServiceOptions options) {
  std::unique_ptr<RankPoolService> service(new RankPoolService(std::move(options)));
  StatusOr<int> fd = ListenUnix(ServiceSocketPath(service->opts_.dir));
  if (!fd.ok()) return fd.status().WithPrefix("loader service");
  service->listen_fd_ = *fd;
  service->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (service->wake_fd_ < 0) return Internal(std::string("eventfd: ") + strerror(errno));
  service->thread_ = std::thread([s = service.get()] { s->Serve(); });
  return service;
}

RankPoolService::RankPoolService(RankServiceOptions options)
    : opts_(std::move(options)), pool_workers_(opts_.pool_workers) {}

RankPoolService::~RankPoolService() {
  quit_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (starting_ != nullptr) starting_->Fail(Unavailable("loader service: the agent is stopping"));
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  EndSession();
  CloseConnection();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(ServiceSocketPath(opts_.dir).c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

int64_t RankPoolService::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_;
}

LoaderStats RankPoolService::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s;
  s.epoch = epoch_;
  if (meter_) meter_->Fill(s, opts_.clock->Now());
  PoolClientStats c;  // the current session's, with the restarts of the sessions before it
  if (current_ != nullptr) c = current_->Stats();
  AddRestarts(c, finished_);
  SetPoolFields(c, s);
  s.pool_workers = pool_workers_;  // the pool's, whatever a session uses
  return s;
}

void RankPoolService::Log(const std::string& line) const {
  const std::string text = "rank " + std::to_string(opts_.rank) + " loader: " + line;
  if (opts_.log) return opts_.log(text);
  fprintf(stderr, "%s\n", text.c_str());
}

void RankPoolService::Serve() {
  while (!quit_) {
    pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}, {conn_fd_, POLLIN, 0}};
    const nfds_t n = conn_fd_ >= 0 ? 3 : 2;
    const int rc = poll(fds, n, static_cast<int>(kStatsInterval.count() * 1000));
    if (rc < 0 && errno != EINTR) {
      Log(std::string("poll: ") + strerror(errno));
      return;
    }
    if (quit_) return;
    if (fds[1].revents & POLLIN) Accept();
    if (n == 3 && fds[2].revents != 0 && !ReadRank()) CloseConnection();
    if (opts_.clock->Now() >= next_stats_) {
      WriteStats();
      next_stats_ = opts_.clock->Now() + kStatsInterval;
    }
  }
}

void RankPoolService::Accept() {
  const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  // A new connection is a new rank process (a restarted one): it replaces the old.
  CloseConnection();
  conn_fd_ = fd;
  reader_.Reset(fd);
  std::lock_guard<std::mutex> lock(mu_);
  meter_.emplace(opts_.clock->Now());
  epoch_ = -1;
}

void RankPoolService::CloseConnection() {
  EndSession();
  if (conn_fd_ < 0) return;
  reader_.Reset(-1);
  close(conn_fd_);
  conn_fd_ = -1;
  WriteStats();
}

bool RankPoolService::ReadRank() {
  std::string error;
  if (reader_.ReadSome(false, &error) != MessageReader::Result::kOk) return false;
  while (true) {
    std::optional<Message> m = reader_.Pop(&error);
    if (!error.empty()) {
      Log("malformed message from the rank: " + error);
      return false;
    }
    if (!m) return true;
    HandleMessage(*m);
    if (m->fd >= 0) close(m->fd);
  }
}

void RankPoolService::HandleMessage(const Message& m) {
  const nlohmann::json& b = m.body;
  if (m.type == MsgType::kOpen) return Open(b);
  Session* s = session_.get();
  if (s == nullptr || Int(b, "session", -1) != s->id) return;  // a session already over
  if (auto release = b.find("release"); release != b.end()) {
    for (int64_t slot : Indices(*release)) s->client->Release(static_cast<int>(slot));
  }
  switch (m.type) {
    case MsgType::kSubmit: {
      const int64_t epoch = Int(b, "epoch", 0);
      const int64_t first = Int(b, "firstBatch", 0);
      std::vector<std::vector<int64_t>> batches;
      if (auto it = b.find("batches"); it != b.end() && it->is_array()) {
        for (const auto& indices : *it) batches.push_back(Indices(indices));
      }
      if (auto c = b.find("consumed"); c != b.end() && c->is_object()) {
        std::lock_guard<std::mutex> lock(mu_);
        const auto now = opts_.clock->Now();
        meter_->Started(now);
        meter_->Waited(std::chrono::duration_cast<Clock::Duration>(
            std::chrono::duration<double>(c->value("waitedSeconds", 0.0))));
        for (int64_t i = 0; i < Int(*c, "batches", 0); ++i) {
          meter_->Consumed(now, i == 0 ? Int(*c, "samples", 0) : 0);
        }
        epoch_ = Int(*c, "epoch", epoch);  // the rank's count; wire numbers skip
      }
      if (b.value("speculative", false)) s->speculative = epoch;
      return Submit(s, epoch, first, std::move(batches));
    }
    case MsgType::kDrop: {
      auto keep = b.find("keep");
      std::optional<int64_t> kept;
      if (keep != b.end() && keep->is_number_integer()) kept = keep->get<int64_t>();
      return Drop(s, kept);
    }
    case MsgType::kRelease:
      return;
    default:
      Log(std::string("unexpected ") + MsgTypeName(m.type) + " message from the rank");
  }
}

void RankPoolService::Open(const nlohmann::json& b) {
  EndSession();
  const int64_t id = Int(b, "session", -1);
  auto refuse = [&](const std::string& kind, const std::string& message, nlohmann::json detail) {
    nlohmann::json reply = {{"session", id}, {"kind", kind}, {"message", message}};
    if (detail.is_object()) {
      for (const char* k : {"excType", "index"}) {
        if (detail.contains(k)) reply[k] = detail[k];
      }
      if (detail.contains("message")) reply["workerMessage"] = detail["message"];
    }
    Reply({MsgType::kError, reply});
  };
  if (Int(b, "protocol", -1) != kProtocolVersion) {
    return refuse("protocol",
                  "the rank speaks loader protocol " +
                      b.value("protocol", nlohmann::json()).dump() + ", the agent " +
                      std::to_string(kProtocolVersion),
                  nullptr);
  }
  const int64_t workers = Int(b, "numWorkers", 0);
  int pool_workers = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_workers = pool_workers_;
  }
  if (workers > pool_workers && workers <= opts_.max_workers && opts_.grow) {
    // PyTorch would start exactly this many workers; fewer would build other batches on
    // each worker, and so draw other random numbers.
    Log("the DataLoader asks for " + std::to_string(workers) + " workers, the pool has " +
        std::to_string(pool_workers) + ": it grows to " + std::to_string(workers) +
        " (a rank's pool may grow to " + std::to_string(opts_.max_workers) + ")");
    if (Status grown = opts_.grow(static_cast<int>(workers)); !grown.ok()) {
      return refuse(
          "workers",
          "the pool could not grow to " + std::to_string(workers) + " workers: " + grown.message(),
          nullptr);
    }
    std::lock_guard<std::mutex> lock(mu_);
    pool_workers = pool_workers_ = static_cast<int>(workers);
  }
  if (workers < 1 || workers > pool_workers) {
    return refuse("workers",
                  "the DataLoader asks for " + std::to_string(workers) +
                      " workers; the agent's pool for this rank has " +
                      std::to_string(pool_workers) + " and may grow to " +
                      std::to_string(std::max(pool_workers, opts_.max_workers)) +
                      " (loader.workersPerRank, and the CPUs of the node)",
                  nullptr);
  }
  if (b.value("accept", false)) Reply({MsgType::kAccepted, {{"session", id}}});
  PoolClientOptions o;
  o.dir = opts_.dir;
  o.workers = static_cast<int>(workers);
  o.initial_active = o.workers;
  o.prefetch_factor = static_cast<int>(std::max<int64_t>(1, Int(b, "prefetchFactor", 2)));
  o.timeout = std::chrono::milliseconds(std::max<int64_t>(0, Int(b, "timeoutMs", 0)));
  if (Int(b, "slotBytes", 0) > 0) {
    o.slot_bytes = static_cast<size_t>(Int(b, "slotBytes", 0));
  } else if (Int(b, "batchBytes", 0) > 0) {  // the rank built batch 0 itself: no probe
    o.slot_bytes = SlotBytesForBatch(static_cast<size_t>(Int(b, "batchBytes", 0)));
  }
  o.shm_dir = opts_.shm_dir;
  o.dataset = "python";
  o.dataset_arg = b.value("arg", "");
  o.rank = opts_.rank;
  o.world_size = opts_.world_size;
  o.strict_round_robin = true;
  o.start_waits_for_all_workers = false;  // the pool may stagger its workers' start-up
  o.probe_batch = [probe = Indices(b.value("probe", nlohmann::json::array()))](int64_t) {
    return probe;
  };
  o.clock = opts_.clock;

  auto session = std::make_unique<Session>();
  session->id = id;
  session->client = std::make_unique<PoolClient>(std::move(o));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++sessions_;
    starting_ = session->client.get();
  }
  Status st = session->client->Start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    starting_ = nullptr;
  }
  if (!st.ok()) {
    nlohmann::json detail = session->client->error_detail();
    session->client->Stop();
    return refuse(detail.is_object() ? detail.value("kind", "start") : "start", st.message(),
                  detail);
  }
  std::shared_ptr<ShmRing> ring = session->client->ring();
  nlohmann::json pids = nlohmann::json::array();
  for (pid_t p : session->client->WorkerPids()) pids.push_back(p);
  Reply({MsgType::kOpened,
         {{"session", id},
          {"slots", ring->slots()},
          {"slotBytes", ring->slot_bytes()},
          {"datasetSize", session->client->dataset_size()},
          {"pids", pids},
          {"submitted", true}},
         ring->fd()});
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = session->client.get();
  }
  Session* s = session.get();
  session->sender = std::thread([this, s] { SendBatches(s); });
  session_ = std::move(session);
  if (auto submit = b.find("submit"); submit != b.end() && submit->is_array()) {
    const int64_t epoch = Int(b, "epoch", 0);
    for (const auto& run : *submit) {
      if (!run.is_object()) continue;
      std::vector<std::vector<int64_t>> batches;
      if (auto it = run.find("batches"); it != run.end() && it->is_array()) {
        for (const auto& indices : *it) batches.push_back(Indices(indices));
      }
      Submit(s, epoch, Int(run, "firstBatch", 0), std::move(batches));
    }
  }
}

void RankPoolService::Submit(Session* s, int64_t epoch, int64_t first,
                             std::vector<std::vector<int64_t>> batches) {
  if (batches.empty()) return;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    for (size_t i = 0; i < batches.size(); ++i) {
      s->expected.emplace_back(epoch, first + static_cast<int64_t>(i));
    }
  }
  s->cv.notify_all();
  s->client->Submit(epoch, first, std::move(batches));
}

void RankPoolService::Drop(Session* s, std::optional<int64_t> keep) {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    std::erase_if(s->expected, [&](const auto& e) { return !keep || e.first != *keep; });
  }
  s->client->DropAllBut(keep);
  if (s->speculative && s->speculative != keep) {
    // The prediction was wrong (or the iterator went away): what the workers built of it
    // must not move their streams, or the batches after it would differ from PyTorch's.
    s->client->Rewind(*s->speculative);
  }
  s->speculative.reset();
}

void RankPoolService::EndSession() {
  if (!session_) return;
  if (session_->speculative) Drop(session_.get(), std::nullopt);
  {
    std::lock_guard<std::mutex> lock(session_->mu);
    session_->quit = true;
  }
  session_->cv.notify_all();
  if (session_->sender.joinable()) session_->sender.join();
  session_->client->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    AddRestarts(finished_, session_->client->Stats());
    current_ = nullptr;
  }
  session_.reset();
}

void RankPoolService::SendBatches(Session* s) {
  while (true) {
    std::pair<int64_t, int64_t> key;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->quit || !s->expected.empty(); });
      if (s->quit) return;
      key = s->expected.front();
    }
    StatusOr<std::optional<ReadyBatch>> r = s->client->Take(key.first, key.second, kTakePoll);
    if (!r.ok()) {
      nlohmann::json reply = {{"session", s->id},
                              {"epoch", key.first},
                              {"batch", key.second},
                              {"message", r.status().message()}};
      nlohmann::json detail = s->client->error_detail();
      if (detail.is_object()) {
        for (const char* k : {"kind", "excType", "index"}) {
          if (detail.contains(k)) reply[k] = detail[k];
        }
        if (detail.contains("message")) reply["workerMessage"] = detail["message"];
      }
      Reply({MsgType::kBatchError, reply});
      return;  // the client's error sticks: the rank opens a new session to go on
    }
    if (!*r) continue;
    ReadyBatch& batch = **r;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (!s->expected.empty() && s->expected.front() == key) s->expected.pop_front();
    }
    Reply({MsgType::kReady,
           {{"session", s->id},
            {"epoch", batch.epoch},
            {"batch", batch.batch},
            {"slot", batch.slot},
            {"worker", batch.worker},
            {"fields", std::move(batch.fields)},
            {"tree", std::move(batch.tree)}}});
  }
}

void RankPoolService::Reply(const Message& m) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (conn_fd_ >= 0) (void)SendMessage(conn_fd_, m);
}

void RankPoolService::WriteStats() {
  bool connected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connected = meter_.has_value();
  }
  if (!connected) return;
  (void)WriteFileAtomically(StatsPath(opts_.dir), Stats().ToJson().dump(2) + "\n");
}

}  // namespace spawnpoint::loader
