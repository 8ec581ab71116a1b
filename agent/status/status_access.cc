#include "agent/status/status_access.h"

#include <cstring>
#include <initializer_list>

#include "common/random.h"

namespace spawnpoint::agent {
namespace {

using nlohmann::json;

constexpr const char* kBearer = "Bearer ";

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

json Keep(const json& from, std::initializer_list<const char*> keys) {
  json out = json::object();
  for (const char* k : keys) {
    if (from.contains(k)) out[k] = from[k];
  }
  return out;
}

json FailureWithoutLogs(const json& f) {
  json out = Keep(f, {"rank", "localRank", "nodeRank", "exitCode", "reason", "signal", "retryable",
                      "failedAt", "time"});
  if (f.contains("consequences") && f["consequences"].is_array()) {
    json peers = json::array();
    for (const json& p : f["consequences"]) {
      if (p.is_object()) peers.push_back(Keep(p, {"rank", "nodeRank", "exitCode", "reason"}));
    }
    out["consequences"] = std::move(peers);
  }
  return out;
}

}  // namespace

bool MayReadLogs(const std::string& token, const metrics::HttpRequest& request) {
  if (request.from_loopback) return true;
  if (token.empty()) return false;
  const std::string& auth = request.authorization;
  if (auth.compare(0, strlen(kBearer), kBearer) != 0) return false;
  return SameSecret(auth.substr(strlen(kBearer)), token);
}

json WithoutLogs(const json& doc) {
  if (!doc.is_object()) return doc;
  json out = doc;
  if (out.contains("lastFailure") && out["lastFailure"].is_object()) {
    out["lastFailure"] = FailureWithoutLogs(out["lastFailure"]);
  }
  if (out.contains("stall") && out["stall"].is_object()) {
    out["stall"] = Keep(out["stall"], {"rank", "pod", "silentSeconds", "medianStepSeconds",
                                       "beforeFirstStep", "waiting"});
  }
  out["redacted"] =
      "log lines, tracebacks, failure messages and stacks are left out: they are served with "
      "the job's status token (the operator's) or on the pod's loopback (kubectl port-forward)";
  return out;
}

StatusOr<std::string> ReadStatusToken(const std::string& path, std::string* note) {
  if (path.empty()) return std::string();
  StatusOr<std::string> token = ReadSecretFile(path);
  if (token.ok()) return token;
  if (token.status().code() == StatusCode::kNotFound) {
    *note = "--status-token-file " + path +
            ": no such file; /status serves log lines only on this pod's loopback";
    return std::string();
  }
  if (token.status().code() == StatusCode::kInvalidArgument) {
    return InvalidArgument("--status-token-file " + path +
                           ": empty (the job's status token is one line of text)");
  }
  return InvalidArgument("--status-token-file " + path + ": " + token.status().message());
}

}  // namespace spawnpoint::agent
