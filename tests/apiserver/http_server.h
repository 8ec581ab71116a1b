// A small HTTP/1.1 server on plain sockets, written for the Kubernetes API test server:
// one thread per connection, keep-alive, Content-Length and chunked request bodies, and
// responses that are either complete or streamed as chunks (watch). Streams can be cut
// anywhere, including mid-chunk, because fault injection needs exactly that.
//
// Thread-safety: Start() and Stop() must be called from one owner thread. The handler runs
// on connection threads, concurrently; it must be thread-safe. An HttpResponder belongs to
// its connection thread and must not be shared.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spawnpoint::kubetest {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string target;                        // as sent: path and query
  std::string path;                          // percent-decoded, without the query
  std::string raw_query;                     // as sent, without '?'
  std::map<std::string, std::string> query;  // decoded; a repeated key keeps the last value
  // Names lower-cased. A repeated header keeps its last value, except Accept (joined by
  // ",") and Impersonate-Group (joined by "\n").
  std::map<std::string, std::string> headers;
  std::string body;
  std::string remote;  // "ip:port" of the peer

  // Empty when absent.
  std::string Header(const std::string& lower_name) const;
  std::string Query(const std::string& name) const;
  bool HasQuery(const std::string& name) const { return query.count(name) != 0; }
};

// Writes one response on a connection. Either Send() once, or BeginStream() then any
// number of WriteChunk() and finally EndStream() (or Abort() to cut the stream). Every
// write returns false once the peer is gone; the handler should then return.
class HttpResponder {
 public:
  explicit HttpResponder(int fd) : fd_(fd) {}

  bool Send(int code, const std::string& content_type, const std::string& body,
            const HeaderList& extra_headers = {});
  bool BeginStream(int code, const std::string& content_type, const HeaderList& extra_headers = {});
  bool WriteChunk(std::string_view data);
  // Writes a chunk header that announces all of `data` but sends only its first `n` bytes,
  // then closes the connection: the client sees a stream cut in the middle of a line.
  void WritePartialChunkAndAbort(std::string_view data, size_t n);
  bool EndStream();
  // Closes the connection without finishing the response.
  void Abort();
  // True once the peer has closed its side or the connection is broken. Does not block.
  bool PeerGone();

  bool started() const { return started_; }
  bool finished() const { return finished_; }
  bool aborted() const { return aborted_; }
  int code() const { return code_; }
  void set_keep_alive(bool k) { keep_alive_ = k; }
  bool keep_alive() const { return keep_alive_; }

 private:
  bool WriteAll(std::string_view data);
  std::string Head(int code, const std::string& content_type, const HeaderList& extra,
                   const std::string& framing);

  int fd_;
  bool started_ = false;
  bool finished_ = false;
  bool aborted_ = false;
  bool keep_alive_ = true;
  int code_ = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

class HttpServer {
 public:
  explicit HttpServer(HttpHandler handler) : handler_(std::move(handler)) {}
  ~HttpServer();

  // Binds 127.0.0.1:port (0 picks a free port) and starts accepting. Returns the port.
  StatusOr<int> Start(int port);
  // Stops accepting, shuts every connection down and joins the threads. Handlers that are
  // blocked (a watch) must return on their own once their writes fail; the API layer also
  // wakes them. Idempotent.
  void Stop();

 private:
  void AcceptLoop();
  void ServeConnection(int fd, std::string remote);
  void ReapFinished();

  HttpHandler handler_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::set<int> open_fds_;
  struct Conn {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Conn> conns_;
};

// Reason phrase for a status code ("OK", "Not Found", ...).
const char* ReasonPhrase(int code);
// Percent-decoding; `plus_is_space` for query strings (Go's QueryEscape writes spaces as +).
std::string PercentDecode(std::string_view s, bool plus_is_space);
std::string PercentEncode(std::string_view s);

}  // namespace spawnpoint::kubetest
