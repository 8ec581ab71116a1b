#include "agent/loader/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "agent/loader/contract.h"
#include "agent/loader/dataset.h"
#include "agent/loader/protocol.h"
#include "agent/loader/shm_ring.h"

namespace spawnpoint::loader {
namespace {

std::atomic<bool> g_entry_called{false};

struct BuildError {
  std::string kind;  // "dataset" (a sample), "collate", "slot" (too small)
  int64_t index = -1;
  std::string message;
  size_t need = 0;
  size_t have = 0;
};

nlohmann::json FieldsJson(const BatchWriter& w) {
  nlohmann::json fields = nlohmann::json::array();
  for (const auto& f : w.fields()) {
    fields.push_back({{"name", f.spec.name},
                      {"dtype", DTypeName(f.spec.dtype)},
                      {"shape", f.spec.shape},
                      {"offset", f.offset},
                      {"nbytes", f.nbytes}});
  }
  return fields;
}

class WorkerServer {
 public:
  WorkerServer(int listen_fd, int worker_id, int rank, int incarnation)
      : listen_fd_(listen_fd), worker_id_(worker_id), rank_(rank), incarnation_(incarnation) {}

  [[noreturn]] void Serve() {
    while (true) {
      int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE ||
            errno == ENOBUFS || errno == ENOMEM) {
          continue;
        }
        std::fprintf(stderr, "loader worker %d: accept on fd %d: %s\n", worker_id_, listen_fd_,
                     strerror(errno));
        std::exit(2);
      }
      ServeClient(conn);
      close(conn);
      // The client's ring goes with it: an unmapped, unlinked ring frees its memory.
      ring_.reset();
      contexts_.clear();
      cache_.reset();
    }
  }

 private:
  void ServeClient(int conn) {
    MessageReader reader(conn);
    std::string error;
    while (true) {
      std::optional<Message> m = reader.Pop(&error);
      if (!m) {
        if (!error.empty()) {
          std::fprintf(stderr, "loader worker %d: %s\n", worker_id_, error.c_str());
          return;
        }
        if (reader.ReadSome(/*block=*/true, &error) != MessageReader::Result::kOk) return;
        continue;
      }
      std::optional<Message> reply = Handle(*m);
      if (m->fd >= 0) close(m->fd);  // a descriptor nobody took
      if (!reply) continue;
      const bool sent = SendMessage(conn, *reply).ok();
      if (reply->fd >= 0) close(reply->fd);  // the in-place probe's file: the client's now
      if (!sent) return;                     // the client went away
    }
  }

  std::optional<Message> Handle(Message& m) {
    switch (m.type) {
      case MsgType::kConfigure:
        return Configure(m.body);
      case MsgType::kRing:
        return AttachRing(m);
      case MsgType::kProbe:
        return Probe(m.body);
      case MsgType::kTask:
        return Task(m.body);
      case MsgType::kRewind:
        return std::nullopt;  // a C++ worker's batches draw from no persistent streams
      default:
        return ErrorReply(-1, "protocol", std::string("unexpected message ") + MsgTypeName(m.type));
    }
  }

  static Message ErrorReply(int64_t task, const std::string& kind, const std::string& message) {
    return Message{MsgType::kError, {{"id", task}, {"kind", kind}, {"message", message}}};
  }

  std::optional<Message> Configure(const nlohmann::json& body) {
    const std::string name = body.value("dataset", "");
    const std::string arg = body.value("arg", "");
    const int expected_worker = body.value("workerId", worker_id_);
    if (body.value("protocol", 0) != kProtocolVersion) {
      return ErrorReply(-1, "configure",
                        "protocol version " + std::to_string(body.value("protocol", 0)) +
                            " but this worker speaks " + std::to_string(kProtocolVersion) +
                            ": the worker command is a different build of the program");
    }
    if (expected_worker != worker_id_) {
      return ErrorReply(-1, "configure",
                        "the client expected worker " + std::to_string(expected_worker) +
                            " but reached worker " + std::to_string(worker_id_));
    }
    seed_ = body.value("seed", uint64_t{0});
    client_rank_ = body.value("rank", rank_);
    world_size_ = body.value("worldSize", 1);
    num_workers_ = body.value("numWorkers", 1);
    contexts_.clear();
    cache_.reset();
    if (!dataset_ || name != dataset_name_ || arg != dataset_arg_) {
      dataset_.reset();
      StatusOr<std::unique_ptr<Dataset>> made = CreateDataset(name, arg);
      if (!made.ok()) return ErrorReply(-1, "configure", made.status().message());
      dataset_ = std::move(made).value();
      dataset_name_ = name;
      dataset_arg_ = arg;
    }
    int64_t size = 0;
    try {
      size = dataset_->Size();
    } catch (const std::exception& e) {
      return ErrorReply(-1, "configure", std::string("dataset Size() threw: ") + e.what());
    }
    return Message{MsgType::kHello,
                   {{"pid", getpid()},
                    {"incarnation", incarnation_},
                    {"workerId", worker_id_},
                    {"size", size}}};
  }

  std::optional<Message> AttachRing(Message& m) {
    ring_.reset();
    auto ring = ShmRing::Attach(m.fd, m.body.value("slots", size_t{0}),
                                m.body.value("slotBytes", size_t{0}));
    m.fd = -1;  // Attach owns it now, even on failure
    if (!ring.ok()) return ErrorReply(-1, "ring", ring.status().message());
    ring_ = std::move(ring).value();
    return std::nullopt;
  }

  WorkerContext& Context(int64_t epoch) {
    auto it = contexts_.find(epoch);
    if (it == contexts_.end()) {
      WorkerContext ctx;
      ctx.rank = client_rank_;
      ctx.world_size = world_size_;
      ctx.worker_id = worker_id_;
      ctx.num_workers = num_workers_;
      ctx.incarnation = incarnation_;
      ctx.epoch = epoch;
      ctx.seed = DeriveSeed(seed_, client_rank_, worker_id_, epoch);
      ctx.rng.seed(ctx.seed);
      it = contexts_.emplace(epoch, std::move(ctx)).first;
      // Tasks of two adjacent epochs interleave at the boundary; older ones are done.
      while (contexts_.size() > 3) contexts_.erase(contexts_.begin());
    }
    return it->second;
  }

  std::optional<BuildError> Build(int64_t epoch, const std::vector<int64_t>& indices,
                                  BatchWriter& out) {
    WorkerContext& ctx = Context(epoch);
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    for (int64_t index : indices) {
      try {
        StatusOr<Sample> s = dataset_->Get(index, ctx);
        if (!s.ok()) return BuildError{"dataset", index, s.status().message()};
        samples.push_back(std::move(s).value());
      } catch (const std::exception& e) {
        return BuildError{"dataset", index, std::string("threw an exception: ") + e.what()};
      } catch (...) {
        return BuildError{"dataset", index, "threw a non-standard exception"};
      }
    }
    try {
      Status st = dataset_->Collate(samples, out, ctx);
      if (!st.ok()) return BuildError{"collate", -1, st.message()};
    } catch (const std::exception& e) {
      return BuildError{"collate", -1, std::string("Collate threw an exception: ") + e.what()};
    } catch (...) {
      return BuildError{"collate", -1, "Collate threw a non-standard exception"};
    }
    return std::nullopt;
  }

  static Message BuildErrorReply(int64_t task, const BuildError& e) {
    Message m = ErrorReply(task, e.kind, e.message);
    m.body["index"] = e.index;
    m.body["need"] = e.need;
    m.body["have"] = e.have;
    return m;
  }

  std::optional<Message> Probe(const nlohmann::json& body) {
    if (!dataset_) return ErrorReply(-1, "protocol", "Probe before Configure");
    const int64_t epoch = body.value("epoch", int64_t{0});
    const int64_t batch = body.value("batch", int64_t{0});
    auto indices = body.value("indices", std::vector<int64_t>{});
    if (body.contains("inPlace")) {
      if (auto reply = ProbeInPlace(epoch, indices, body["inPlace"])) return reply;
    }
    const auto start = std::chrono::steady_clock::now();
    BatchWriter w = BatchWriter::ForHeap();
    if (auto err = Build(epoch, indices, w)) return BuildErrorReply(-1, *err);
    const size_t bytes = w.BytesUsed();
    // Kept so the probe's work is not wasted: the first Task for this batch copies it.
    cache_.emplace(Cached{epoch, batch, std::move(indices), std::move(w)});
    return Message{MsgType::kProbeResult, {{"bytes", bytes}, {"buildSeconds", Since(start)}}};
  }

  static double Since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // Builds the probed batch at offset 0 of a new file in the client's shared-memory
  // directory, which becomes the ring (slot 0): no heap copy, and every page is touched
  // once. nullopt when that cannot be done here (no such file, the batch does not fit
  // `capacity`): the caller probes on the heap instead. A dataset error is the reply.
  std::optional<Message> ProbeInPlace(int64_t epoch, const std::vector<int64_t>& indices,
                                      const nlohmann::json& in_place) {
    const auto start = std::chrono::steady_clock::now();
    const std::string dir = in_place.value("dir", "");
    const size_t capacity = in_place.value("capacity", size_t{0});
    if (dir.empty() || capacity == 0) return std::nullopt;
    StatusOr<int> fd = ShmRing::CreateUnlinkedFile(dir, capacity);
    if (!fd.ok()) return std::nullopt;
    void* base = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (base == MAP_FAILED) {
      close(*fd);
      return std::nullopt;
    }
    BatchWriter w = BatchWriter::ForRegion(base, capacity);
    // Each field's pages are allocated before they are written: a full tmpfs is an
    // overflow here, never a SIGBUS.
    w.SetRegionHook([](void* where, size_t nbytes) {
      if (nbytes == 0) return true;
      const uintptr_t page = PageSize();
      const uintptr_t from = reinterpret_cast<uintptr_t>(where) / page * page;
      const uintptr_t to = reinterpret_cast<uintptr_t>(where) + nbytes;
      return madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE) == 0;
    });
    std::optional<BuildError> err = Build(epoch, indices, w);
    munmap(base, capacity);
    if (err || w.Overflowed()) {
      close(*fd);
      if (err) return BuildErrorReply(-1, *err);
      // The rebuilt batch draws its random streams again: start from the same ones.
      contexts_.erase(epoch);
      return std::nullopt;
    }
    Message m{MsgType::kProbeResult,
              {{"bytes", w.BytesUsed()},
               {"buildSeconds", Since(start)},
               {"inPlace", true},
               {"fields", FieldsJson(w)}}};
    m.fd = *fd;
    return m;
  }

  std::optional<Message> Task(const nlohmann::json& body) {
    const int64_t id = body.value("id", int64_t{-1});
    if (!dataset_ || !ring_) return ErrorReply(id, "protocol", "Task before Configure and Ring");
    const int64_t epoch = body.value("epoch", int64_t{0});
    const int64_t batch = body.value("batch", int64_t{0});
    const size_t slot = body.value("slot", size_t{0});
    auto indices = body.value("indices", std::vector<int64_t>{});
    if (slot >= ring_->slots()) {
      return ErrorReply(id, "protocol", "slot " + std::to_string(slot) + " is outside the ring");
    }
    void* region = ring_->Slot(slot);
    const size_t capacity = ring_->slot_bytes();
    if (cache_ && cache_->epoch == epoch && cache_->batch == batch && cache_->indices == indices) {
      Cached cached = std::move(*cache_);
      cache_.reset();
      if (!cached.writer.CopyTo(region, capacity)) {
        return BuildErrorReply(id, {"slot", -1, "", cached.writer.BytesUsed(), capacity});
      }
      return Message{MsgType::kDone,
                     {{"id", id},
                      {"bytes", cached.writer.BytesUsed()},
                      {"fields", FieldsJson(cached.writer)}}};
    }
    BatchWriter w = BatchWriter::ForRegion(region, capacity);
    if (auto err = Build(epoch, indices, w)) return BuildErrorReply(id, *err);
    if (w.Overflowed()) return BuildErrorReply(id, {"slot", -1, "", w.BytesUsed(), capacity});
    return Message{MsgType::kDone,
                   {{"id", id}, {"bytes", w.BytesUsed()}, {"fields", FieldsJson(w)}}};
  }

  struct Cached {
    int64_t epoch;
    int64_t batch;
    std::vector<int64_t> indices;
    BatchWriter writer;
  };

  const int listen_fd_;
  const int worker_id_;
  const int rank_;
  const int incarnation_;
  std::string dataset_name_, dataset_arg_;
  std::unique_ptr<Dataset> dataset_;
  std::shared_ptr<ShmRing> ring_;
  uint64_t seed_ = 0;
  int client_rank_ = 0;
  int world_size_ = 1;
  int num_workers_ = 1;
  std::map<int64_t, WorkerContext> contexts_;
  std::optional<Cached> cache_;
};

int EnvInt(const char* name, int fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = strtol(v, &end, 10);
  return *end == '\0' ? static_cast<int>(n) : fallback;
}

}  // namespace

bool WorkerEntryPointCalled() { return g_entry_called.load(); }

int RunWorkerIfRequested(int argc, char** argv) {
  g_entry_called = true;
  const char* listen = getenv(kEnvListenFd);
  if (listen == nullptr || *listen == '\0') return -1;
  const int fd = EnvInt(kEnvListenFd, -1);
  const int worker_id = EnvInt(kEnvWorkerId, 0);
  const int rank = EnvInt(kEnvWorkerRank, 0);
  const int incarnation = EnvInt(kEnvIncarnation, 0);
  int type = 0;
  socklen_t len = sizeof(type);
  if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
    std::fprintf(stderr,
                 "%s: started as a loader worker (%s=%s) but that is not a listening socket\n",
                 argc > 0 ? argv[0] : "loader worker", kEnvListenFd, listen);
    std::exit(2);
  }
  // Programs the dataset code starts are not workers.
  unsetenv(kEnvListenFd);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  // Output goes to a pipe read by the pool owner: line buffering keeps lines whole and
  // prompt, and crash tails complete.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // A client that disappears mid-reply must not kill the worker.
  signal(SIGPIPE, SIG_IGN);
  WorkerServer(fd, worker_id, rank, incarnation).Serve();
}

}  // namespace spawnpoint::loader
