// The seam under the Kubernetes client: one HTTP exchange, or one streamed response for a
// watch. Production uses the cpprestsdk transport (cpprest_transport.h); unit tests use a
// scripted fake. Implementations must be thread-safe: the client sends concurrently from
// many threads, and HttpStream::Cancel is called from a thread other than the reader.
// A transport never logs request headers or bodies (they carry credentials).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace spawnpoint::kube {

// Header names are stored lower-case (HTTP header names are case-insensitive).
using Headers = std::map<std::string, std::string>;

struct HttpRequest {
  std::string method;  // GET, POST, PUT, PATCH, DELETE
  std::string target;  // absolute path plus percent-encoded query: "/api/v1/pods?limit=5"
  Headers headers;
  std::string body;
  // The transport gives up when nothing arrives for this long (a whole exchange, or the
  // gap between two lines of a stream).
  std::chrono::milliseconds timeout{30000};
};

struct HttpResponse {
  // 0 when no HTTP answer arrived; then `error` says why.
  int status = 0;
  Headers headers;
  std::string body;
  // kUnavailable: could not connect or the connection broke; kDeadlineExceeded: timed out.
  Status error;
  // With status 0: false only when the request certainly never reached the server
  // (connection refused, name resolution, TLS handshake), so any verb may be retried.
  bool request_sent = true;

  std::string Header(const std::string& lower_case_name) const {
    auto it = headers.find(lower_case_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A response whose body is consumed line by line while it arrives.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // The next newline-terminated line without the newline; nullopt at a clean end of body.
  // kDeadlineExceeded if the stream stalled past the request timeout; kUnavailable if the
  // connection broke or Cancel() was called.
  virtual StatusOr<std::optional<std::string>> ReadLine() = 0;
  // Unblocks a pending ReadLine from another thread; later reads fail. Idempotent.
  virtual void Cancel() = 0;
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  virtual HttpResponse Send(const HttpRequest& request) = 0;
  // For a 2xx answer, `*stream` receives the body as a stream and the returned response
  // has an empty body; otherwise the whole body is read into the response. A status of 0
  // means the request failed as for Send.
  virtual HttpResponse OpenStream(const HttpRequest& request,
                                  std::unique_ptr<HttpStream>* stream) = 0;
};

}  // namespace spawnpoint::kube
