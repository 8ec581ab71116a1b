// A minimal blocking HTTP/1.1 client for tests: one request on a fresh connection to a
// plain-HTTP server on 127.0.0.1 (the operator's probes and metrics, kube-fault-proxy in
// front of a real API server). Thread-safe: no state is shared between calls.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace spawnpoint::testing {

struct HttpResponse {
  int code = 0;                                // 0: no response (see error)
  std::map<std::string, std::string> headers;  // lower-cased names; repeated headers joined by "\n"
  std::string body;
  std::string error;

  nlohmann::json Json() const;  // null when the body is not JSON
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request on a fresh connection to 127.0.0.1:port; the body read until the server closes
// it (or `timeout`), de-chunked.
HttpResponse HttpCall(int port, const std::string& method, const std::string& target,
                      const std::string& body = "", const Headers& headers = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace spawnpoint::testing
