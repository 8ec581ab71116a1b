// Where the API server is and how to authenticate to it: from a kubeconfig file (its
// current context or a named one) or from the in-cluster service account. Relative file
// paths in a kubeconfig are resolved against the kubeconfig's directory, and files are read
// at load time, except the token file, which TokenSource re-reads when it rotates.
// Secrets (tokens, passwords, client keys) never appear in error messages or in
// DebugString(). Loading functions are thread-safe; a RestConfig is a plain value.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::kube {

struct RestConfig {
  std::string server;  // "https://10.0.0.1:443" or "http://127.0.0.1:8080", no trailing '/'
  std::string default_namespace = "default";

  // TLS material as PEM text (the *-data fields decoded, or the files read).
  std::string certificate_authority_pem;
  std::string client_certificate_pem;
  std::string client_key_pem;  // secret
  bool insecure_skip_tls_verify = false;
  std::string tls_server_name;  // SNI and verification name if not the server's host

  // Credentials, at most one kind: a token file (re-read on rotation) wins over a token.
  std::string bearer_token;  // secret
  std::string token_file;
  std::string username;  // basic auth
  std::string password;  // secret

  // Where the configuration came from, for messages: "kubeconfig /x (context kind)".
  std::string source;

  // One line with every field; secrets are shown as "<redacted>" (or "<none>").
  std::string DebugString() const;
};

// `context` empty: the kubeconfig's current-context.
StatusOr<RestConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");
// As LoadKubeconfig, from text; relative paths resolve against `base_dir`.
StatusOr<RestConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& base_dir,
                                     const std::string& context = "",
                                     const std::string& source_name = "kubeconfig");

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnv();

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

// KUBERNETES_SERVICE_HOST/PORT plus `root`/{token,ca.crt,namespace}. The token is used as
// a token file so that a projected (rotating) token keeps working.
StatusOr<RestConfig> LoadInClusterConfig(const std::string& root = kServiceAccountDir,
                                         const EnvLookup& env = ProcessEnv());

// In-cluster when KUBERNETES_SERVICE_HOST is set and the token exists; otherwise the first
// file of $KUBECONFIG, else ~/.kube/config. A non-empty `context` forces the kubeconfig.
StatusOr<RestConfig> LoadDefaultConfig(const std::string& context = "",
                                       const EnvLookup& env = ProcessEnv());

// Supplies the bearer token for each request. Thread-safe.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual StatusOr<std::string> Token() = 0;
  // Called after a 401 so that the next Token() reads the credential afresh.
  virtual void Invalidate() {}
};

class StaticTokenSource : public TokenSource {
 public:
  explicit StaticTokenSource(std::string token) : token_(std::move(token)) {}
  StatusOr<std::string> Token() override { return token_; }

 private:
  const std::string token_;
};

// Re-reads the file when its modification time or size changes, after Invalidate(), and
// at least every `max_age` (kubelet rotates projected tokens by atomically swapping a
// symlink, which a coarse mtime could miss).
class FileTokenSource : public TokenSource {
 public:
  FileTokenSource(std::string path, Clock* clock,
                  Clock::Duration max_age = std::chrono::seconds(60));
  StatusOr<std::string> Token() override;
  void Invalidate() override;

 private:
  const std::string path_;
  Clock* const clock_;
  const Clock::Duration max_age_;
  std::mutex mu_;
  std::string token_;
  bool valid_ = false;
  Clock::TimePoint read_at_{};
  int64_t mtime_ns_ = 0;
  int64_t size_ = -1;
};

// The token source for `config`, or nullptr if it uses no bearer token.
std::shared_ptr<TokenSource> MakeTokenSource(const RestConfig& config, Clock* clock);

// Standard base64 (as kubeconfig *-data fields use); whitespace is ignored.
StatusOr<std::string> Base64Decode(const std::string& in);
std::string Base64Encode(const std::string& in);

}  // namespace spawnpoint::kube
