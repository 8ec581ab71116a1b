// NodeAgent's --gang mode (issue 19): the agents of a job spanning several nodes restart
// their gang in place, coordinated by node 0's agent (agent/gang/coordinator.h).
#include <signal.h>

#include "agent/run/exit_codes.h"
#include "agent/run/node_agent.h"
#include "agent/run/report.h"
#include "common/random.h"

namespace spawnpoint::agent {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// "120" for 120 s, "0.5" for 500 ms.
std::string SecondsText(milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000);
  char buf[32];
  snprintf(buf, sizeof(buf), "%.3g", ms.count() / 1000.0);
  return buf;
}

}  // namespace

Status NodeAgent::StartGang() {
  StatusOr<std::string> token = ReadSecretFile(options_.gang_token_file);
  if (!token.ok()) {
    return InvalidArgument("--gang-token-file " + options_.gang_token_file +
                           ": cannot read the job's gang token (an empty file counts as none)");
  }
  const std::string& secret = *token;
  const size_t colon = options_.gang_addr.rfind(':');
  const std::string host = options_.gang_addr.substr(0, colon);
  const int port = std::stoi(options_.gang_addr.substr(colon + 1));
  if (node_rank_ == 0) {
    gang::GangServer::Options o;
    o.job = node_.job.name;
    o.token = secret;
    o.port = port;
    o.clock = clock_;
    o.coordinator.nnodes = nnodes_;
    o.coordinator.policy = policy_;
    o.coordinator.restart_count = options_.restart_count;
    o.coordinator.rejoin_timeout = options_.gang_join_timeout;
    // The first attempt meets on the job's rendezvous port; each later one on a fresh one,
    // which the old attempt's rank 0 cannot still hold.
    o.coordinator.pick_port = [first = std::make_shared<bool>(true),
                               port = port_]() -> StatusOr<int> {
      if (*first) {
        *first = false;
        return port;
      }
      return FreePort();
    };
    o.say = [](const std::string& line) { Say(line); };
    SP_ASSIGN_OR_RETURN(gang_server_, gang::GangServer::Start(std::move(o)));
  }
  gang::GangPeer::Options p;
  p.job = node_.job.name;
  p.token = secret;
  p.host = node_rank_ == 0 ? "127.0.0.1" : host;
  p.port = port;
  p.node = node_rank_;
  p.clock = clock_;
  p.say = [](const std::string& line) { Say(line); };
  Say(node_.job.name + ": node " + std::to_string(node_rank_) + " joins the gang at " +
      (node_rank_ == 0 ? "its own coordinator, port " + std::to_string(port) : options_.gang_addr));
  SP_ASSIGN_OR_RETURN(gang_, gang::GangPeer::Connect(std::move(p), options_.restart_count,
                                                     clock_->Now() + options_.gang_join_timeout));
  return Status::Ok();
}

std::optional<json> NodeAgent::AwaitGang(const std::vector<std::string>& kinds, milliseconds wait,
                                         int* signal) {
  const Clock::TimePoint deadline = clock_->Now() + wait;
  while (clock_->Now() < deadline) {
    if (int sig = signals_->WaitForTermination(milliseconds(0)); sig != 0) {
      *signal = sig;
      return std::nullopt;
    }
    std::optional<json> m =
        gang_->Next(std::min<Clock::TimePoint>(deadline, clock_->Now() + milliseconds(50)));
    if (!m) continue;
    const std::string t = m->value("t", "");
    if (t == "lost" || t == "reconnected" || t == "refused" ||
        std::find(kinds.begin(), kinds.end(), t) != kinds.end()) {
      return m;
    }
  }
  return std::nullopt;
}

void NodeAgent::ReportToGang(const json& exit) {
  if (reported_to_gang_) return;
  reported_to_gang_ = true;
  if (!gang_->Send(exit)) reported_to_gang_ = false;  // told after the attempt, if back
}

bool NodeAgent::AwaitReconnection(int* signal) {
  const Clock::TimePoint deadline = clock_->Now() + options_.gang_join_timeout;
  while (!gang_->Connected()) {
    if (int sig = signals_->WaitForTermination(milliseconds(0)); sig != 0) {
      *signal = sig;
      return false;
    }
    if (clock_->Now() >= deadline) return false;
    clock_->SleepFor(milliseconds(20));
  }
  return true;
}

int NodeAgent::RunInGang() {
  const std::string& job = node_.job.name;
  auto terminated = [&](int sig, const std::string& when) {
    Report(AttemptDecision{.phase = AgentPhase::kTerminated,
                           .reason = "Terminated",
                           .message = "stopped by " + SignalName(sig) + when,
                           .exit_code = ExitForSignal(sig)});
    return ExitForSignal(sig);
  };
  // No rank failed and nothing was signalled: the agent says why it gives up, and exits
  // with kExitJobFailed (which is what the failure's exitCode says).
  auto given_up = [&](ExitReason reason, const std::string& why) {
    RankFailure f;
    f.node_rank = node_rank_;
    f.status.exit_code = kExitJobFailed;
    f.cause = {reason, why};
    f.retryable = true;  // the operator recreates the gang
    Report(AttemptDecision{.phase = AgentPhase::kFailed,
                           .reason = ExitReasonName(reason),
                           .message = why,
                           .exit_code = kExitJobFailed,
                           .failure = f});
    return kExitJobFailed;
  };
  auto node_lost = [&](const std::string& why) { return given_up(ExitReason::kNodeLost, why); };
  restart_ = options_.restart_count;
  const std::string lost_for_good = "the gang's coordinator did not come back within " +
                                    SecondsText(options_.gang_join_timeout) + " s";
  while (true) {
    // The barrier: this node's ranks are stopped; the coordinator starts the attempt when
    // every node is here.
    int sig = 0;
    if (!gang_->Send({{"t", "ready"}, {"attempt", restart_}})) {
      if (!AwaitReconnection(&sig)) {
        return sig != 0 ? terminated(sig, " while joining the gang") : node_lost(lost_for_good);
      }
      continue;  // say ready again
    }
    std::optional<json> m = AwaitGang({"start", "verdict"}, options_.gang_join_timeout, &sig);
    // A "restart" verdict here is of an attempt this node already left: the old coordinator
    // decided it as it went away, after this node saw it go (its ranks were stopped then).
    // The new attempt's start or the gang's end comes after it.
    while (m && m->value("t", "") == "verdict" && m->value("decision", "") == "restart" &&
           sig == 0) {
      m = AwaitGang({"start", "verdict"}, options_.gang_join_timeout, &sig);
    }
    if (sig != 0) return terminated(sig, " at the gang's barrier");
    if (!m) {
      return given_up(ExitReason::kGangStartTimeout,
                      "the gang did not start within " + SecondsText(options_.gang_join_timeout) +
                          " s: not every node's agent reached its barrier");
    }
    const std::string t = m->value("t", "");
    if (t == "refused") return FailAgent(Unavailable("the gang's coordinator refused this agent"));
    if (t == "lost" || t == "reconnected") {
      if (!AwaitReconnection(&sig)) {
        return sig != 0 ? terminated(sig, " while joining the gang") : node_lost(lost_for_good);
      }
      continue;  // a new coordinator: say ready again
    }
    if (t == "verdict") {  // the gang ended (while this agent was away, or at the barrier)
      const bool ok = m->value("decision", "") == "succeeded";
      restart_ = m->value("restarts", restart_);
      Report(ok ? AttemptDecision{.phase = AgentPhase::kSucceeded, .reason = "Succeeded"}
                : AttemptDecision{.phase = AgentPhase::kFailed,
                                  .reason = m->value("reason", ""),
                                  .message = m->value("message", ""),
                                  .exit_code = kExitJobFailed,
                                  .failure = RankFailure::FromJson(m->value("failure", json()))});
      return ok ? 0 : kExitJobFailed;
    }
    restart_ = m->value("attempt", restart_);
    port_ = m->value("port", port_);
    gang_->Started(restart_);
    stopped_by_gang_ = false;
    reported_to_gang_ = false;
    StatusOr<GangResult> result = RunAttempt(restart_);
    gang_->Ended();
    if (!result.ok()) return FailAgent(result.status());
    if (result->outcome == GangOutcome::kInterrupted) {
      return terminated(result->interrupt_signal, "");  // the coordinator sees us go
    }
    json exit = {{"t", "exit"}, {"attempt", restart_}, {"ok", !result->failure}};
    if (result->failure && stopped_by_gang_) {
      exit["stopped"] = true;
    } else if (result->failure) {
      exit["failure"] = result->failure->ToJson();
    }
    // A failure was told as it happened (GangOptions::on_failure); a success is told now.
    // Then the verdict, even when the coordinator is gone by now: it goes once the gang has
    // ended (node 0's agent exits), maybe while this node was still stopping its ranks, and
    // the verdict it sent first waits in the inbox, ahead of the "lost". A connection lost
    // before any verdict shows there as "lost" too.
    if (!reported_to_gang_) gang_->Send(exit);
    bool lost = false;
    std::optional<json> verdict;
    while (!lost) {
      verdict = AwaitGang({"verdict"}, options_.gang_join_timeout, &sig);
      if (sig != 0) return terminated(sig, " waiting for the gang's verdict");
      if (!verdict) {
        return node_lost("no verdict from the gang's coordinator within " +
                         SecondsText(options_.gang_join_timeout) + " s");
      }
      const std::string vt = verdict->value("t", "");
      if (vt == "lost" || vt == "reconnected") {
        lost = true;
      } else if (vt == "verdict" && verdict->value("attempt", -1) == restart_) {
        break;
      }
    }
    if (lost) {
      // The coordinator went away with this attempt (its pod deleted): every rank is
      // stopped; the next attempt meets the new coordinator, which counts this one.
      ++restart_;
      gang_->SetAttempt(restart_);
      Say(job + ": the gang's coordinator went away during attempt " +
          std::to_string(restart_ - 1) + "; this node's ranks are stopped, and it waits to rejoin");
      if (!AwaitReconnection(&sig)) {
        return sig != 0 ? terminated(sig, " while the gang's coordinator was away")
                        : node_lost(lost_for_good);
      }
      continue;
    }
    const std::string decision = verdict->value("decision", "");
    if (decision == "succeeded") {
      Report(AttemptDecision{.phase = AgentPhase::kSucceeded, .reason = "Succeeded"});
      return 0;
    }
    AttemptDecision d;
    d.reason = verdict->value("reason", "");
    d.message = verdict->value("message", "");
    d.failure = RankFailure::FromJson(verdict->value("failure", json()));
    if (decision != "restart") {
      d.phase = AgentPhase::kFailed;
      d.exit_code = kExitJobFailed;
      Report(d);
      return kExitJobFailed;
    }
    d.phase = AgentPhase::kRestarting;
    d.restart = true;
    d.backoff = milliseconds(verdict->value("backoffMs", 0));
    restart_ = verdict->value("next", restart_ + 1);
    local_restarts_ = restart_;
    Report(d);
    if (int s = WaitOutBackoff(d.backoff); s != 0) {
      return terminated(s, " during restart backoff");
    }
  }
}

}  // namespace spawnpoint::agent
