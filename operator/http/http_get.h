// A minimal blocking HTTP/1.1 GET over plain TCP, for reading agents' JSON status
// (http://<podIP>:9400/status) from inside the cluster: one request per connection, a
// deadline on the whole exchange, Content-Length or read-to-close bodies (chunked is
// decoded too). Errors: kUnavailable (cannot connect, reset), kDeadlineExceeded (timeout),
// kInternal (not HTTP). Thread-safe (no shared state).
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"

namespace spawnpoint::op {

struct HttpGetResponse {
  int code = 0;
  std::string body;
};

// `bearer`, when not empty, is sent as "Authorization: Bearer <bearer>".
StatusOr<HttpGetResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                  std::chrono::milliseconds timeout,
                                  const std::string& bearer = "");

}  // namespace spawnpoint::op
