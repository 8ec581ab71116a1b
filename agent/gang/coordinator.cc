#include "agent/gang/coordinator.h"

#include <signal.h>
#include <algorithm>

#include "agent/run/attempt_decision.h"
#include "agent/supervisor/failure_cause.h"
#include "api/restart_rule.h"

namespace spawnpoint::agent::gang {
namespace {

using nlohmann::json;

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

GangCoordinator::GangCoordinator(CoordinatorOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock), attempt_(options_.restart_count) {}

std::vector<Outgoing> GangCoordinator::Hello(int node, int attempt) {
  connected_.insert(node);
  std::vector<Outgoing> out;
  if (phase_ == Phase::kBarrier && attempt > attempt_) {
    attempt_ = attempt;  // a node that ran a later attempt than this coordinator knows of
  }
  if (phase_ == Phase::kSucceeded || phase_ == Phase::kFailed) {
    out.push_back({node, last_verdict_});  // a late joiner learns the end
  }
  return out;
}

std::vector<Outgoing> GangCoordinator::Ready(int node, int attempt) {
  if (phase_ != Phase::kBarrier) return {};
  // Ready means "my ranks are stopped": an older attempt's number (a node back from a lost
  // connection) counts too, and a later one (a node that ran an attempt this coordinator
  // never saw) becomes the gang's.
  attempt_ = std::max(attempt_, attempt);
  ready_.insert(node);
  return StartIfAllReady();
}

std::vector<Outgoing> GangCoordinator::StartIfAllReady() {
  if (static_cast<int>(ready_.size()) < options_.nnodes) return {};
  if (attempt_ > options_.policy.max_restarts) {
    // The nodes counted an attempt this coordinator did not decide (the last one's
    // coordinator was lost during it): the budget holds all the same.
    phase_ = Phase::kFailed;
    RankFailure f = last_failure_.value_or(RankFailure{});
    if (!last_failure_) {
      f.status.signal = SIGKILL;
      f.cause = {ExitReason::kKilled,
                 "the gang's coordinator was lost during attempt " + std::to_string(attempt_ - 1)};
    }
    last_failure_ = f;
    last_verdict_ = {
        {"t", "verdict"},
        {"attempt", attempt_},
        {"decision", "fail"},
        {"reason", "MaxRestartsReached"},
        {"message", "maxRestarts " + std::to_string(options_.policy.max_restarts) + " spent"},
        {"backoffMs", 0},
        {"failure", f.ToJson()},
        {"next", attempt_},
        {"restarts", attempt_ - 1}};  // the attempt not started is no restart
    return {{kEveryNode, last_verdict_}};
  }
  StatusOr<int> port = options_.pick_port ? options_.pick_port() : StatusOr<int>(0);
  if (!port.ok()) {
    RankFailure f;
    f.cause = {ExitReason::kUserError, "no rendezvous port for attempt " +
                                           std::to_string(attempt_) + ": " +
                                           port.status().message()};
    f.retryable = false;
    return Fail(0, f);
  }
  phase_ = Phase::kRunning;
  ready_.clear();
  succeeded_.clear();
  failures_.clear();
  reported_.clear();
  lost_since_.reset();
  attempt_start_ = clock_->Now();
  return {{kEveryNode, json{{"t", "start"}, {"attempt", attempt_}, {"port", *port}}}};
}

std::vector<Outgoing> GangCoordinator::Exit(int node, int attempt,
                                            std::optional<RankFailure> failure, bool stopped) {
  if (attempt != attempt_ || (phase_ != Phase::kRunning && phase_ != Phase::kSettling)) {
    return {};
  }
  if (reported_.count(node)) return {};
  reported_[node] = true;
  if (stopped) {  // its ranks were stopped for another node's failure
    if (phase_ == Phase::kSettling && static_cast<int>(reported_.size()) == options_.nnodes) {
      return Decide();
    }
    return {};
  }
  if (!failure) {
    succeeded_.insert(node);
    if (phase_ == Phase::kRunning && static_cast<int>(succeeded_.size()) == options_.nnodes) {
      phase_ = Phase::kSucceeded;
      last_verdict_ = {{"t", "verdict"},
                       {"attempt", attempt_},
                       {"decision", "succeeded"},
                       {"restarts", attempt_},
                       {"reason", "Succeeded"}};
      return {{kEveryNode, last_verdict_}};
    }
    if (phase_ == Phase::kSettling && static_cast<int>(reported_.size()) == options_.nnodes) {
      return Decide();
    }
    return {};
  }
  return Fail(node, std::move(*failure));
}

std::vector<Outgoing> GangCoordinator::Fail(int node, RankFailure failure) {
  failure.node_rank = node;
  failures_.emplace_back(node, std::move(failure));
  std::vector<Outgoing> out;
  if (phase_ == Phase::kRunning) {
    phase_ = Phase::kSettling;
    settle_until_ = clock_->Now() + options_.settle;
    out.push_back({kEveryNode, json{{"t", "stop"}, {"attempt", attempt_}}});
  } else if (phase_ == Phase::kBarrier) {
    phase_ = Phase::kSettling;  // a failure outside an attempt (no port): decided at once
    settle_until_ = clock_->Now();
  }
  if (static_cast<int>(reported_.size()) >= options_.nnodes || clock_->Now() >= settle_until_) {
    auto decided = Decide();
    out.insert(out.end(), decided.begin(), decided.end());
  }
  return out;
}

std::vector<Outgoing> GangCoordinator::Decide() {
  std::vector<RankFailure> failures;
  for (const auto& [node, f] : failures_) failures.push_back(f);
  const RankFailure first = failures.front();
  RankFailure cause = PickRootCause(std::move(failures));
  const Clock::Duration ran = clock_->Now() - attempt_start_;
  quick_failures_ = api::QuickFailuresAfter(options_.policy, quick_failures_, ran);
  GangResult result;
  result.outcome = GangOutcome::kFailed;
  result.failure = cause;
  const AttemptDecision d = agent::Decide(result, attempt_, options_.policy,
                                          /*owns_gang=*/true, quick_failures_);
  last_failure_ = cause;
  json verdict = {{"t", "verdict"},
                  {"attempt", attempt_},
                  {"decision", d.restart ? "restart" : "fail"},
                  {"reason", d.reason},
                  {"message", d.message},
                  {"backoffMs", d.backoff.count()},
                  {"failure", cause.ToJson()}};
  if (cause.rank != first.rank || cause.node_rank != first.node_rank) {
    verdict["causeCameFirst"] = true;  // reported after a consequence of it
  }
  if (d.restart) {
    ++attempt_;
    phase_ = Phase::kBarrier;
    ready_.clear();
  } else {
    phase_ = Phase::kFailed;
  }
  verdict["next"] = attempt_;
  verdict["restarts"] = attempt_;
  last_verdict_ = verdict;
  return {{kEveryNode, verdict}};
}

std::vector<Outgoing> GangCoordinator::Lost(int node) {
  connected_.erase(node);
  ready_.erase(node);
  if (!lost_since_) lost_since_ = clock_->Now();
  if (phase_ == Phase::kRunning || phase_ == Phase::kSettling) {
    if (reported_.count(node)) return {};
    reported_[node] = true;
    RankFailure f;
    f.status.signal = SIGKILL;
    f.cause = {ExitReason::kKilled, "the agent of node " + std::to_string(node) +
                                        " was lost (its pod deleted, evicted or its node gone)"};
    f.retryable = true;
    f.failed_at_ms = WallMs();
    return Fail(node, f);
  }
  return {};
}

std::vector<Outgoing> GangCoordinator::Tick() {
  const Clock::TimePoint now = clock_->Now();
  if (phase_ == Phase::kSettling && now >= settle_until_) return Decide();
  if (phase_ == Phase::kBarrier && lost_since_ &&
      static_cast<int>(connected_.size()) < options_.nnodes) {
    if (now - *lost_since_ < options_.rejoin_timeout) return {};
    phase_ = Phase::kFailed;
    RankFailure f;
    f.status.signal = SIGKILL;
    f.cause = {ExitReason::kKilled, "a node's agent did not rejoin the gang within " +
                                        std::to_string(options_.rejoin_timeout.count() / 1000) +
                                        " s: the gang is recreated"};
    f.retryable = true;
    last_failure_ = f;
    last_verdict_ = {{"t", "verdict"},        {"attempt", attempt_},        {"decision", "fail"},
                     {"reason", "NodeLost"},  {"message", f.cause.message}, {"backoffMs", 0},
                     {"failure", f.ToJson()}, {"next", attempt_},           {"restarts", attempt_}};
    return {{kEveryNode, last_verdict_}};
  }
  if (phase_ == Phase::kBarrier && static_cast<int>(connected_.size()) >= options_.nnodes) {
    lost_since_.reset();
  }
  return {};
}

}  // namespace spawnpoint::agent::gang
