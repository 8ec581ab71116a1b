// The wire protocol between a rank's Loader (the client) and a loader worker, over a Unix
// stream socket. A frame is a 8-byte header (payload length, message type, whether a
// descriptor rides along) followed by a JSON payload; the ring's descriptor travels as
// SCM_RIGHTS with the Ring message. Only control flows here: batch bytes go through the
// shared-memory ring.
//
//   client -> worker: Configure{protocol, dataset, arg, seed, rank, worldSize, numWorkers,
//                               workerId}
//   worker -> client: Hello{pid, incarnation, workerId, size}  or  Error{kind, message}
//   client -> worker: Ring{slots, slotBytes} + fd       (the worker replies only on error)
//   client -> worker: Probe{epoch, batch, indices, inPlace?: {dir, capacity}}
//                                                        -> ProbeResult{bytes, buildSeconds}
//                     inPlace (optional): build the batch at offset 0 of a new unlinked file
//                     in tmpfs `dir`, of `capacity` bytes; a worker that can replies
//                     ProbeResult{bytes, buildSeconds, inPlace: true, fields} + the file's fd,
//                     which the client makes the ring (the batch is slot 0, handed over as
//                     the first batch if it is the first submitted, with no Task); one that
//                     cannot (or a Python worker) replies as without it and the client
//                     sizes a ring of its own.
//   client -> worker: Task{id, epoch, batch, slot, indices}
//   worker -> client: Done{id, bytes, fields:[{name, dtype, shape, offset, nbytes}]}
//                 or  Error{id, kind, index, message, need, have}
//   client -> worker: Rewind{epoch}   (no reply) the batches of `epoch` this worker built
//                     are void: its random streams go back to where that epoch's first
//                     batch found them (Python workers; C++ workers keep no streams and
//                     ignore it). Sent after the tasks already at the worker, so it takes
//                     effect once they are built.
//
// The Python variant (agent/python/spawnpoint_rank/worker.py, for Python ranks): Configure's
// dataset is "python" and arg the path of a pickle file holding {"dataset", "collate_fn",
// "worker_init_fn", "base_seed", "num_workers", "auto_collation"} (worker.py's docstring).
// Done adds tree: the batch's structure and its non-array leaves, each tensor or array a
// reference to its field (spawnpoint_rank/_batch_codec.py). A "dataset" Error's message is
// PyTorch's "Caught E in DataLoader worker process N. Original Traceback ..." text and adds
// excType ("module.qualname" of the exception); a "collate" Error covers collate_fn and
// values the ring cannot carry.
//
// The rank service (rank_service.h): a Python rank and the agent's per-rank service, over
// the service socket of the rank's pool directory, with the same frames. The service runs a
// PoolClient over the pool's workers for one session (one DataLoader iterator) at a time;
// every message names its session, and what arrives for another session is ignored.
//
//   rank -> service:  Open{protocol, session, arg, numWorkers, prefetchFactor, timeoutMs,
//                          probe: [indices of the first batch], slotBytes (optional),
//                          batchBytes (optional), epoch, submit: [{firstBatch, batches}...]
//                          (optional)}
//                          slotBytes, or else batchBytes (the size of a batch the rank built
//                          itself, which the ring's slots are sized for): no probe
//                          accept: true asks for Accepted{session} once the request is found
//                          acceptable (protocol, workers: the refusals a rank falls back on)
//                          and before the workers are waited for; Opened or Error follows
//                          submit: the batches to build once the session is open, as
//                          Submits of that epoch would ask, so the first Task leaves as soon
//                          as the ring exists rather than after a round trip to the rank
//   service -> rank:  Opened{session, slots, slotBytes, datasetSize, pids, submitted} + the
//                          ring's fd (submitted: Open's submit was taken; a rank talking to a
//                          service without it sends those Submits itself)
//                 or  Error{session, kind, message, excType?, index?, workerMessage?}
//                          (the session did not start; workerMessage: the worker's own text)
//   rank -> service:  Submit{session, epoch, firstBatch, batches: [[indices]...], release:
//                            [slots], consumed: {batches, samples, waitedSeconds, epoch},
//                            speculative (optional)}
//                          speculative: true marks the first batches of the next epoch
//                          as the rank predicts them, built while the current epoch drains;
//                          a later Drop that keeps that epoch confirms them, any other Drop
//                          (or the session's end) voids them and rewinds the workers'
//                          streams (Rewind above), so an unconfirmed prediction never
//                          shifts what the workers build next.
//                     Release{session, release: [slots]}
//                     Drop{session, keep: epoch or null}   (as PoolClient::DropAllBut)
//   service -> rank:  Ready{session, epoch, batch, slot, worker, fields, tree}  in the order
//                          submitted
//                 or  BatchError{session, epoch, batch, message, kind?, excType?, index?,
//                                 workerMessage?}
//                          (the session is over: the rank opens a new one to go on)
//
// Thread-safety: a MessageReader belongs to one thread; SendMessage is as thread-safe as
// the socket (one writer at a time per socket).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spawnpoint::loader {

inline constexpr int kProtocolVersion = 1;

enum class MsgType : uint8_t {
  kConfigure = 1,
  kHello = 2,
  kRing = 3,
  kProbe = 4,
  kProbeResult = 5,
  kTask = 6,
  kDone = 7,
  kError = 8,
  // The rank service's (above).
  kOpen = 9,
  kOpened = 10,
  kSubmit = 11,
  kReady = 12,
  kRelease = 13,
  kDrop = 14,
  kBatchError = 15,
  kRewind = 16,    // client -> worker
  kAccepted = 17,  // service -> rank
};

const char* MsgTypeName(MsgType type);

struct Message {
  MsgType type = MsgType::kError;
  nlohmann::json body;
  int fd = -1;  // sent with SCM_RIGHTS when >= 0; on receipt, owned by the receiver
};

// A listening Unix stream socket at `path` (a stale socket file there is replaced), close-on-
// exec, at descriptor 10 or above. Errors name the path.
StatusOr<int> ListenUnix(const std::string& path);

// Writes all of `bytes` to the Unix stream socket `sock`, `fds` passed with SCM_RIGHTS with
// the first part (blocking, also on a non-blocking socket), without SIGPIPE. Errors carry
// errno's text.
Status SendWithFds(int sock, std::string_view bytes, const std::vector<int>& fds);

// Writes the whole frame (SendWithFds). Errors name the message type and carry errno's text.
Status SendMessage(int sock, const Message& message);

class MessageReader {
 public:
  enum class Result { kOk, kEof, kError };

  MessageReader() = default;
  explicit MessageReader(int fd) : fd_(fd) {}
  ~MessageReader();
  MessageReader(const MessageReader&) = delete;
  MessageReader& operator=(const MessageReader&) = delete;

  // Forgets buffered bytes and descriptors (closing the latter) and reads `fd` from now on.
  void Reset(int fd);
  // Reads once: blocking until some bytes arrive, or only what is there already. kOk also
  // when nothing was available.
  Result ReadSome(bool block, std::string* error);
  // The next complete message, if buffered. A malformed frame sets *error.
  std::optional<Message> Pop(std::string* error);

 private:
  int fd_ = -1;
  std::string buffer_;
  size_t start_ = 0;
  std::deque<int> fds_;
};

}  // namespace spawnpoint::loader
