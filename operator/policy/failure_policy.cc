#include "operator/policy/failure_policy.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;

// Pod-level (not container) causes: the pod was taken away, the code did nothing wrong.
struct PodCause {
  std::string reason;
  std::string message;
};

std::optional<PodCause> InfrastructureCause(const json& pod) {
  const json status = pod.value("status", json::object());
  const std::string reason = status.value("reason", "");
  const std::string message = status.value("message", "");
  if (reason == "Evicted") return PodCause{"Evicted", message};
  if (reason == "Preempting" || reason == "Preempted") return PodCause{"Preempted", message};
  if (reason == "NodeLost" || reason == "NodeShutdown" || reason == "Terminated" ||
      reason == "Shutdown") {
    return PodCause{"NodeLost", message.empty() ? reason : message};
  }
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") != "DisruptionTarget" || c.value("status", "") != "True") continue;
    const std::string why = c.value("reason", "");
    const std::string what = c.value("message", why);
    if (why == "PreemptionByScheduler" || why == "PreemptionByKubeScheduler") {
      return PodCause{"Preempted", what};
    }
    if (why == "DeletionByTaintManager" || why == "DeletionByPodGC") {
      return PodCause{"NodeLost", what};
    }
    return PodCause{"Evicted", what};  // EvictionByEvictionAPI, TerminationByKubelet, ...
  }
  return std::nullopt;
}

// The first terminated container with a non-zero code, the trainer preferred, then init
// containers (the agent install) and the rest.
const json* FailedContainer(const json& pod, const std::string& trainer) {
  const json* trainer_status = ContainerStatus(pod, trainer);
  auto terminated_nonzero = [](const json* cs) {
    return cs && cs->contains("state") && (*cs)["state"].contains("terminated") &&
           (*cs)["state"]["terminated"].value("exitCode", 0) != 0;
  };
  if (terminated_nonzero(trainer_status)) return trainer_status;
  if (!pod.contains("status") || !pod["status"].is_object()) return trainer_status;
  const json& status = pod["status"];
  for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
    auto it = status.find(list);
    if (it == status.end() || !it->is_array()) continue;
    for (const auto& cs : *it) {
      if (terminated_nonzero(&cs)) return &cs;
    }
  }
  return trainer_status;  // maybe terminated with 0, or still without a state
}

// At most `limit` bytes of `stack`, cut after a whole line when there is one in the last
// half, never inside a UTF-8 sequence, and marked as trimmed.
std::string TrimStack(const std::string& stack, size_t limit) {
  if (stack.size() <= limit) return stack;
  static const std::string kTrimmed = "\n... (trimmed)";
  size_t cut = limit - kTrimmed.size();
  const size_t line = stack.rfind('\n', cut);
  if (line != std::string::npos && line >= cut / 2) {
    cut = line;
  } else {
    while (cut > 0 && (static_cast<unsigned char>(stack[cut]) & 0xC0) == 0x80) --cut;
  }
  return stack.substr(0, cut) + kTrimmed;
}

// The end of `text` in at most `limit` bytes, from a line's start when one is in the last
// half, never inside a UTF-8 sequence, and marked as trimmed.
std::string KeepLastLines(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  static const std::string kTrimmed = "...\n";
  size_t start = text.size() - (limit - kTrimmed.size());
  const size_t line = text.find('\n', start);
  if (line != std::string::npos && line + 1 < text.size() && line - start < limit / 2) {
    start = line + 1;
  } else {
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      ++start;
    }
  }
  return kTrimmed + text.substr(start);
}

}  // namespace

json PodFailure::ToJson() const {
  json j = {{"node", node},          {"pod", pod},       {"rank", rank},
            {"exitCode", exit_code}, {"reason", reason}, {"message", message},
            {"retryable", retryable}};
  if (signal > 0) j["signal"] = signal;
  if (!stack.empty()) j["stack"] = stack;
  if (!line.empty()) j["line"] = line;
  if (!exception.empty()) j["exception"] = exception;
  if (!log_tail.empty()) {
    j["logTail"] = log_tail;
    j["logStream"] = log_stream;
  }
  if (!failed_at.empty()) j["failedAt"] = failed_at;
  if (consequences.is_array() && !consequences.empty()) j["consequences"] = consequences;
  return j;
}

std::string PodFailure::Describe() const {
  std::string s = "node " + std::to_string(node) + " (pod " + pod + ")";
  if (rank >= 0) s += " rank " + std::to_string(rank);
  if (exit_code != 0) {
    s += " exited " + std::to_string(exit_code);
    s += reason.empty() ? "" : " (" + reason + ")";
  } else {
    s += " failed" + (reason.empty() ? std::string() : " (" + reason + ")");
  }
  if (!message.empty()) {
    // One line, bounded: conditions and events quote it.
    std::string m = message.substr(0, message.find('\n'));
    if (m.size() > kMaxSummaryMessageBytes) {
      size_t cut = kMaxSummaryMessageBytes;
      while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;
      m = m.substr(0, cut) + "...";
    }
    s += ": " + m;
  }
  return s;
}

PodFailure ClassifyPodFailure(const json& pod, const std::string& trainer,
                              const api::RestartPolicy& policy) {
  PodFailure f;
  f.node = NodeRankOf(pod);
  f.pod = NameOf(pod);

  const json* cs = FailedContainer(pod, trainer);
  json terminated = json::object();
  if (cs && cs->contains("state") && (*cs)["state"].contains("terminated")) {
    terminated = (*cs)["state"]["terminated"];
  }
  f.finished_at = terminated.value("finishedAt", "");
  f.exit_code = terminated.value("exitCode", 0);
  f.signal = terminated.value("signal", 0);
  f.reason = terminated.value("reason", "");
  std::string termination_message = terminated.value("message", "");
  f.message = termination_message;

  // The agent's report names the rank and the cause it saw (cgroup OOM, SIGBUS on /dev/shm).
  json agent = json::parse(termination_message, nullptr, /*allow_exceptions=*/false);
  std::optional<bool> agent_retryable;
  if (agent.is_object() && agent.contains("exitCode")) {
    f.rank = agent.value("rank", -1);
    if (agent["exitCode"].is_number_integer()) f.exit_code = agent["exitCode"].get<int>();
    if (agent.contains("signal") && agent["signal"].is_number_integer()) {
      f.signal = agent["signal"].get<int>();
    }
    f.reason = agent.value("reason", f.reason);
    f.message = agent.value("message", "");
    if (agent.contains("stack") && agent["stack"].is_string()) {
      f.stack = TrimStack(agent["stack"].get<std::string>(), kMaxFailureStackBytes);
    }
    if (agent.contains("retryable") && agent["retryable"].is_boolean()) {
      agent_retryable = agent["retryable"].get<bool>();
    }
    auto text = [&](const char* key) {
      return agent.contains(key) && agent[key].is_string() ? agent[key].get<std::string>() : "";
    };
    f.line = text("line");
    f.exception = text("exception");
    f.log_tail = KeepLastLines(text("logTail"), kMaxLogTailBytes);
    f.log_stream = text("logStream");
    f.failed_at = text("failedAt");
    if (agent.contains("consequences") && agent["consequences"].is_array()) {
      for (const json& c : agent["consequences"]) {
        if (!c.is_object()) continue;
        json peer = {{"node", c.value("nodeRank", f.node)},
                     {"rank", c.value("rank", -1)},
                     {"exitCode", c.value("exitCode", 0)},
                     {"reason", c.value("reason", "")}};
        if (c.contains("line") && c["line"].is_string()) peer["line"] = c["line"];
        f.consequences.push_back(peer);
      }
    }
  }
  if (f.signal == 0 && f.exit_code > 128 && f.exit_code < 128 + 65) f.signal = f.exit_code - 128;

  if (auto cause = InfrastructureCause(pod)) {
    f.reason = cause->reason;
    if (!cause->message.empty()) f.message = cause->message;
    f.retryable = true;
    return f;
  }
  if (cs == nullptr || terminated.empty()) {
    // Failed with no container verdict (e.g. the kubelet rejected the pod): the pod's reason.
    const json status = pod.value("status", json::object());
    f.reason = status.value("reason", "PodFailed");
    f.message = status.value("message", "the pod failed before its container ran");
    f.retryable = false;
    return f;
  }
  if (f.reason.empty()) f.reason = "Error";
  f.retryable = agent_retryable.value_or(f.exit_code != 0 &&
                                         api::IsRetryableFailure(policy, f.exit_code, f.reason));
  return f;
}

std::optional<GangVerdict> GangVerdictOf(const json& pod, const std::string& trainer) {
  const json* cs = ContainerStatus(pod, trainer);
  if (cs == nullptr || !cs->contains("state") || !(*cs)["state"].contains("terminated")) {
    return std::nullopt;
  }
  const json& terminated = (*cs)["state"]["terminated"];
  if (terminated.value("exitCode", 0) != 1) return std::nullopt;
  json message = json::parse(terminated.value("message", ""), nullptr, /*allow_exceptions=*/false);
  if (!message.is_object() || !message.contains("verdict") || !message["verdict"].is_string()) {
    return std::nullopt;
  }
  GangVerdict v;
  v.verdict = message["verdict"].get<std::string>();
  v.message = message.contains("verdictMessage") && message["verdictMessage"].is_string()
                  ? message["verdictMessage"].get<std::string>()
                  : "";
  if (message.contains("restarts") && message["restarts"].is_number_integer()) {
    v.restarts = message["restarts"].get<int>();
  }
  v.node = message.contains("nodeRank") && message["nodeRank"].is_number_integer()
               ? message["nodeRank"].get<int>()
               : NodeRankOf(pod);
  return v;
}

PodFailure FailureFromAgent(const json& failure, const std::string& job) {
  PodFailure f;
  f.retryable = true;
  if (!failure.is_object()) return f;
  auto text = [&](const char* key) {
    return failure.contains(key) && failure[key].is_string() ? failure[key].get<std::string>()
                                                             : std::string();
  };
  auto integer = [&](const char* key, int fallback) {
    return failure.contains(key) && failure[key].is_number_integer() ? failure[key].get<int>()
                                                                     : fallback;
  };
  f.node = integer("nodeRank", 0);
  f.pod = PodName(job, f.node);
  f.rank = integer("rank", -1);
  f.exit_code = integer("exitCode", 0);
  if (f.exit_code > 128 && f.exit_code < 128 + 65) f.signal = f.exit_code - 128;
  f.reason = text("reason");
  f.message = text("message");
  f.line = text("line");
  f.exception = text("exception");
  f.log_tail = KeepLastLines(text("logTail"), kMaxLogTailBytes);
  f.log_stream = text("logStream");
  f.stack = TrimStack(text("stack"), kMaxFailureStackBytes);
  f.failed_at = !text("failedAt").empty() ? text("failedAt") : text("time");
  if (failure.contains("consequences") && failure["consequences"].is_array()) {
    for (const json& c : failure["consequences"]) {
      if (!c.is_object()) continue;
      json peer = {{"node", c.value("nodeRank", f.node)},
                   {"rank", c.value("rank", -1)},
                   {"exitCode", c.value("exitCode", 0)},
                   {"reason", c.value("reason", "")}};
      if (c.contains("line") && c["line"].is_string()) peer["line"] = c["line"];
      f.consequences.push_back(peer);
    }
  }
  return f;
}

PodFailure FirstFailure(const std::vector<PodFailure>& failures) {
  auto key = [](const PodFailure& f) {
    // The agent's time (ms) when there is one, else the container's; unknown sorts last.
    std::optional<WallTime> at = ParseTime(f.failed_at.empty() ? f.finished_at : f.failed_at);
    const bool collective = f.reason == "CollectiveTimeout" || f.reason == "CollectiveError";
    return std::make_tuple(collective, !at.has_value(), at.value_or(WallTime{}), !f.retryable,
                           f.node);
  };
  auto first =
      std::min_element(failures.begin(), failures.end(),
                       [&](const PodFailure& a, const PodFailure& b) { return key(a) < key(b); });
  PodFailure out = *first;
  for (auto it = failures.begin(); it != failures.end(); ++it) {
    if (it == first) continue;
    json peer = {{"node", it->node},
                 {"pod", it->pod},
                 {"rank", it->rank},
                 {"exitCode", it->exit_code},
                 {"reason", it->reason}};
    if (!it->line.empty()) peer["line"] = it->line;
    out.consequences.push_back(peer);
    for (const json& c : it->consequences) out.consequences.push_back(c);
  }
  return out;
}

}  // namespace spawnpoint::op
