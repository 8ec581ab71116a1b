#include "operator/kube/config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace spawnpoint::kube {
namespace {

StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(what + ": cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Finds the entry named `name` in a kubeconfig list such as `clusters`.
YAML::Node FindNamed(const YAML::Node& list, const std::string& key, const std::string& name) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const auto& item : list) {
    if (item["name"] && item["name"].as<std::string>() == name && item[key]) return item[key];
  }
  return YAML::Node();
}

std::string Str(const YAML::Node& n, const char* key) {
  const YAML::Node v = n[key];
  if (!v || !v.IsScalar()) return "";
  return v.as<std::string>();
}

// A PEM field is given either inline as base64 (`<key>-data`) or as a file path.
Status LoadPem(const YAML::Node& n, const std::string& key, const std::string& where,
               const std::string& base_dir, std::string* out) {
  std::string data = Str(n, (key + "-data").c_str());
  if (!data.empty()) {
    auto decoded = Base64Decode(data);
    // The decoded value may be a private key: name the field, never the content.
    if (!decoded.ok()) return InvalidArgument(where + "." + key + "-data: not valid base64");
    *out = std::move(decoded).value();
    return Status::Ok();
  }
  std::string file = Str(n, key.c_str());
  if (file.empty()) return Status::Ok();
  auto text = ReadWholeFile(Resolve(base_dir, file), where + "." + key);
  if (!text.ok()) return text.status();
  *out = std::move(text).value();
  return Status::Ok();
}

}  // namespace

std::string RestConfig::DebugString() const {
  auto secret = [](const std::string& s) { return s.empty() ? "<none>" : "<redacted>"; };
  auto present = [](const std::string& s) {
    return s.empty() ? std::string("<none>") : std::to_string(s.size()) + " bytes";
  };
  std::string out = "server=" + server + " namespace=" + default_namespace +
                    " ca=" + present(certificate_authority_pem) +
                    " client_cert=" + present(client_certificate_pem) +
                    " client_key=" + secret(client_key_pem) +
                    " insecure_skip_tls_verify=" + (insecure_skip_tls_verify ? "true" : "false");
  if (!tls_server_name.empty()) out += " tls_server_name=" + tls_server_name;
  out += " token=" + std::string(secret(bearer_token));
  out += " token_file=" + (token_file.empty() ? std::string("<none>") : token_file);
  if (!username.empty()) out += " username=" + username + " password=" + secret(password);
  if (!source.empty()) out += " source=" + source;
  return out;
}

StatusOr<RestConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& base_dir,
                                     const std::string& context, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    // e.msg and e.mark locate the problem without echoing the (secret-bearing) content.
    return InvalidArgument(source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  try {
    if (!root || !root.IsMap()) return InvalidArgument(source_name + ": not a kubeconfig");
    std::string ctx_name = context.empty() ? Str(root, "current-context") : context;
    if (ctx_name.empty()) {
      return InvalidArgument(source_name + ": no current-context and no context given");
    }
    YAML::Node ctx = FindNamed(root["contexts"], "context", ctx_name);
    if (!ctx.IsMap()) return NotFound(source_name + ": context \"" + ctx_name + "\" not found");
    std::string cluster_name = Str(ctx, "cluster");
    std::string user_name = Str(ctx, "user");
    YAML::Node cluster = FindNamed(root["clusters"], "cluster", cluster_name);
    if (!cluster.IsMap()) {
      return NotFound(source_name + ": cluster \"" + cluster_name + "\" of context \"" + ctx_name +
                      "\" not found");
    }

    RestConfig c;
    c.source = source_name + " (context " + ctx_name + ")";
    c.server = Str(cluster, "server");
    while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
    if (c.server.empty()) {
      return InvalidArgument(source_name + ": cluster \"" + cluster_name + "\" has no server");
    }
    if (c.server.rfind("http://", 0) != 0 && c.server.rfind("https://", 0) != 0) {
      return InvalidArgument(source_name + ": cluster \"" + cluster_name +
                             "\": server must start with http:// or https://");
    }
    std::string ns = Str(ctx, "namespace");
    if (!ns.empty()) c.default_namespace = ns;
    std::string where = "clusters[" + cluster_name + "]";
    SP_RETURN_IF_ERROR(
        LoadPem(cluster, "certificate-authority", where, base_dir, &c.certificate_authority_pem));
    c.insecure_skip_tls_verify =
        cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>();
    c.tls_server_name = Str(cluster, "tls-server-name");

    if (!user_name.empty()) {
      YAML::Node user = FindNamed(root["users"], "user", user_name);
      if (!user.IsMap()) {
        return NotFound(source_name + ": user \"" + user_name + "\" of context \"" + ctx_name +
                        "\" not found");
      }
      where = "users[" + user_name + "]";
      if (user["exec"] || user["auth-provider"]) {
        return InvalidArgument(source_name + ": " + where +
                               ": exec and auth-provider credential plugins are not supported; "
                               "use a token, token file or client certificate");
      }
      SP_RETURN_IF_ERROR(
          LoadPem(user, "client-certificate", where, base_dir, &c.client_certificate_pem));
      SP_RETURN_IF_ERROR(LoadPem(user, "client-key", where, base_dir, &c.client_key_pem));
      if (c.client_certificate_pem.empty() != c.client_key_pem.empty()) {
        return InvalidArgument(source_name + ": " + where +
                               ": client certificate and client key must be given together");
      }
      c.bearer_token = Str(user, "token");
      std::string token_file = Str(user, "tokenFile");
      if (!token_file.empty()) c.token_file = Resolve(base_dir, token_file);
      c.username = Str(user, "username");
      c.password = Str(user, "password");
    }
    return c;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source_name + ": malformed kubeconfig: " + e.msg);
  }
}

StatusOr<RestConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  SP_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "kubeconfig"));
  return ParseKubeconfig(text, DirName(path), context, "kubeconfig " + path);
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<RestConfig> LoadInClusterConfig(const std::string& root, const EnvLookup& env) {
  auto host = env("KUBERNETES_SERVICE_HOST");
  auto port = env("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty() || !port || port->empty()) {
    return FailedPrecondition(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must "
        "be set");
  }
  RestConfig c;
  c.source = "in-cluster service account " + root;
  std::string h = *host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";  // IPv6
  c.server = "https://" + h + ":" + *port;
  c.token_file = root + "/token";
  struct stat st;
  if (::stat(c.token_file.c_str(), &st) != 0) {
    return NotFound("in-cluster config: no service account token at " + c.token_file);
  }
  SP_ASSIGN_OR_RETURN(c.certificate_authority_pem,
                      ReadWholeFile(root + "/ca.crt", "in-cluster config"));
  auto ns = ReadWholeFile(root + "/namespace", "in-cluster config");
  if (ns.ok() && !Trim(*ns).empty()) c.default_namespace = Trim(*ns);
  return c;
}

StatusOr<RestConfig> LoadDefaultConfig(const std::string& context, const EnvLookup& env) {
  if (context.empty()) {
    auto host = env("KUBERNETES_SERVICE_HOST");
    struct stat st;
    std::string token = std::string(kServiceAccountDir) + "/token";
    if (host && !host->empty() && ::stat(token.c_str(), &st) == 0) {
      return LoadInClusterConfig(kServiceAccountDir, env);
    }
  }
  if (auto kc = env("KUBECONFIG"); kc && !kc->empty()) {
    std::stringstream ss(*kc);
    std::string path;
    while (std::getline(ss, path, ':')) {
      struct stat st;
      if (!path.empty() && ::stat(path.c_str(), &st) == 0) return LoadKubeconfig(path, context);
    }
    return NotFound("none of the files in $KUBECONFIG exists");
  }
  auto home = env("HOME");
  if (!home || home->empty()) return NotFound("no kubeconfig: $HOME and $KUBECONFIG are unset");
  return LoadKubeconfig(*home + "/.kube/config", context);
}

FileTokenSource::FileTokenSource(std::string path, Clock* clock, Clock::Duration max_age)
    : path_(std::move(path)), clock_(clock), max_age_(max_age) {}

StatusOr<std::string> FileTokenSource::Token() {
  std::lock_guard<std::mutex> lock(mu_);
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    // Keep serving the last token while a rotation briefly removes the file.
    if (valid_) return token_;
    return Unavailable("token file " + path_ + " is missing");
  }
  int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  auto now = clock_->Now();
  if (valid_ && mtime_ns == mtime_ns_ && st.st_size == size_ && now - read_at_ < max_age_) {
    return token_;
  }
  auto text = ReadWholeFile(path_, "token file");
  if (!text.ok()) {
    if (valid_) return token_;
    return Unavailable("cannot read token file " + path_);
  }
  std::string token = Trim(*text);
  if (token.empty()) {
    if (valid_) return token_;
    return Unavailable("token file " + path_ + " is empty");
  }
  token_ = std::move(token);
  valid_ = true;
  read_at_ = now;
  mtime_ns_ = mtime_ns;
  size_ = st.st_size;
  return token_;
}

void FileTokenSource::Invalidate() {
  std::lock_guard<std::mutex> lock(mu_);
  read_at_ = Clock::TimePoint{};
  mtime_ns_ = -1;
}

std::shared_ptr<TokenSource> MakeTokenSource(const RestConfig& config, Clock* clock) {
  if (!config.token_file.empty())
    return std::make_shared<FileTokenSource>(config.token_file, clock);
  if (!config.bearer_token.empty()) return std::make_shared<StaticTokenSource>(config.bearer_token);
  return nullptr;
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int B64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}
}  // namespace

StatusOr<std::string> Base64Decode(const std::string& in) {
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  bool padding = false;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    int v = B64Value(c);
    if (v < 0 || padding) return InvalidArgument("not valid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (bits >= 6) return InvalidArgument("not valid base64");  // a dangling sextet
  return out;
}

std::string Base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

}  // namespace spawnpoint::kube
