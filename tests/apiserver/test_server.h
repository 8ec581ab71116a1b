// For tests that talk to a real kube-test-server process: a launcher that starts the
// binary, waits (with a deadline) for its `listening on` line and stops it, plus a minimal
// blocking HTTP/1.1 client, including a line reader for watch streams that tells a clean
// end from a cut connection. The client tests of operator/kube/ may use it too; the path of
// the binary is compiled in as KUBE_TEST_SERVER_BIN.
//
// Not thread-safe: one instance per test thread. Nothing here sleeps to synchronise; waits
// poll with deadlines.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tests/apiserver/auth.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kubetest::testing {

struct HttpResponse {
  int code = 0;                                // 0: no response (see error)
  std::map<std::string, std::string> headers;  // lower-cased names; repeated headers joined by "\n"
  std::string body;
  std::string error;

  nlohmann::json Json() const;  // null when the body is not JSON
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request on a fresh connection to 127.0.0.1:port.
HttpResponse HttpCall(int port, const std::string& method, const std::string& target,
                      const std::string& body = "", const Headers& headers = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));

// A streamed GET (a watch): decodes the chunked body and hands out complete lines.
class HttpStream {
 public:
  HttpStream(int port, const std::string& target, const Headers& headers = {});
  ~HttpStream();
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  // Waits up to `timeout` for the response head; the status code, or 0.
  int WaitHead(std::chrono::milliseconds timeout);
  // The next complete line (without '\n'), or nullopt when `timeout` passes or the stream
  // is over.
  std::optional<std::string> NextLine(std::chrono::milliseconds timeout);
  // The server sent the terminating chunk.
  bool ended_cleanly() const { return ended_cleanly_; }
  // The connection closed before the terminating chunk.
  bool cut() const { return cut_; }
  // Bytes of an unfinished line received before a cut.
  const std::string& partial_line() const { return line_buf_; }
  void Close();

 private:
  bool Pump(std::chrono::steady_clock::time_point deadline);
  void Decode();

  int fd_ = -1;
  int code_ = 0;
  bool head_done_ = false;
  bool ended_cleanly_ = false;
  bool cut_ = false;
  std::string raw_;       // undecoded bytes
  std::string line_buf_;  // decoded body not yet split into lines
  std::vector<std::string> lines_;
};

// A kube-test-server process on a free port with its kubeconfig in a temp dir. Pass
// {"--authorization", "rbac"} to have RBAC enforced. Call() without a token sends none,
// which is the superuser unless the server runs with --no-token reject (then send
// kAdminToken, the admin kubeconfig's token from auth.h).
class KubeTestServer {
 public:
  explicit KubeTestServer(std::vector<std::string> extra_args = {},
                          std::string binary = KUBE_TEST_SERVER_BIN);
  ~KubeTestServer();

  // False when the server did not print its first line within 10 s; error() says why.
  bool ok() const { return port_ > 0; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& kubeconfig() const { return kubeconfig_; }
  const std::string& dir() const { return dir_.path(); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  std::string Stderr() const { return process_ ? process_->Stderr() : ""; }

  // A non-empty `token` is sent as "Authorization: Bearer <token>".
  HttpResponse Call(const std::string& method, const std::string& target,
                    const std::string& body = "",
                    const std::string& content_type = "application/json",
                    const std::string& token = "");
  // Call() with the token first, as most RBAC tests write it.
  HttpResponse CallAs(const std::string& token, const std::string& method,
                      const std::string& target, const std::string& body = "",
                      const std::string& content_type = "application/json") {
    return Call(method, target, body, content_type, token);
  }
  // Test-only endpoints.
  HttpResponse AddFaults(const std::string& spec);
  void ClearFaults();
  nlohmann::json Requests(uint64_t since = 0);
  void Compact();
  // A token for an existing ServiceAccount (POST /testing/serviceaccount-token); NotFound
  // when there is no such ServiceAccount.
  StatusOr<std::string> ServiceAccountToken(const std::string& ns, const std::string& name);
  // Writes a kubeconfig for the ServiceAccount: its token (what the operator's client
  // sends), `as:` the ServiceAccount (what kubectl sends over plain http) and `ns` as the
  // default namespace. See KubeconfigFor() in api_server.h.
  Status WriteServiceAccountKubeconfig(const std::string& ns, const std::string& name,
                                       const std::string& path);

  // SIGTERM, then waits up to `timeout`; the exit code, or -1 (then it was killed).
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  spawnpoint::testing::TempDir dir_;
  std::unique_ptr<spawnpoint::testing::TestProcess> process_;
  std::string kubeconfig_;
  std::string error_;
  int port_ = 0;
  int exit_code_ = -2;
};

}  // namespace spawnpoint::kubetest::testing
