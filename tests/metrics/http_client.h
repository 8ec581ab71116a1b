// A blocking HTTP/1.1 client for the metrics tests: one request per connection, the whole
// response read until the server closes. Errors are values. Thread-safe (no shared state).
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "common/status.h"

namespace spawnpoint::testing {

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
};

// Sends `raw` as is and parses the answer; for malformed-request tests.
StatusOr<HttpResult> HttpRaw(const std::string& host, int port, const std::string& raw,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));
StatusOr<HttpResult> HttpGet(const std::string& host, int port, const std::string& path,
                             const std::string& method = "GET",
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace spawnpoint::testing
