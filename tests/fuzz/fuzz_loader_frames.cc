// The loader wire protocol's frames (agent/loader/protocol.h) as a rank, worker or rank
// service reads them: the input is the byte stream arriving on a Unix stream socket,
// decoded by loader::MessageReader (ReadSome, then Pop until it has no whole frame).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "agent/loader/protocol.h"
#include "tests/fuzz/fuzz_input.h"

namespace loader = spawnpoint::loader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  loader::MessageReader reader(sv[1]);  // reads sv[1], does not own it
  size_t sent = 0;
  bool closed = false;
  std::string error;
  for (int rounds = 0; rounds < 100000; ++rounds) {
    if (sent < size) {
      ssize_t n = send(sv[0], data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if (sent == size && !closed) {
      close(sv[0]);
      closed = true;
    }
    auto result = reader.ReadSome(/*block=*/closed, &error);
    while (auto message = reader.Pop(&error)) {
      (void)loader::MsgTypeName(message->type);
      (void)message->body.dump();
    }
    if (result != loader::MessageReader::Result::kOk || !error.empty()) break;
  }
  if (!closed) close(sv[0]);
  close(sv[1]);
  return 0;
}
