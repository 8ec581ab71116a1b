#include "agent/run/stall_monitor.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "agent/supervisor/process_table.h"

namespace spawnpoint::agent {
namespace {

constexpr size_t kStackLinesShown = 12;  // of the culprit's stack, in the agent's log

std::string Seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), s >= 10 ? "%.0f s" : "%.2g s", s);
  return buf;
}

bool HasEnv(const std::vector<std::string>& env, const std::string& entry) {
  return std::find(env.begin(), env.end(), entry) != env.end();
}

std::string FirstLines(const std::string& text, size_t n) {
  std::istringstream in(text);
  std::ostringstream out;
  size_t i = 0;
  for (std::string line; i < n && std::getline(in, line); ++i) out << "    " << line << "\n";
  return out.str();
}

}  // namespace

nlohmann::json StallJson(const std::string& pod, const StalledRank& stalled,
                         double median_step_seconds, const RankStack& stack,
                         const std::string& message, const std::vector<int>& waiting) {
  return {{"rank", stalled.rank},
          {"pod", pod},
          {"silentSeconds", stalled.silent_ns / 1e9},
          {"medianStepSeconds", median_step_seconds},
          {"beforeFirstStep", stalled.before_first_step},
          {"topFrame", stack.top_frame},
          {"stackSource", stack.source},
          {"message", message},
          {"waiting", waiting}};
}

nlohmann::json StragglerJson(const std::string& pod, const Straggler& straggler,
                             const std::string& message) {
  return {{"rank", straggler.rank},
          {"pod", pod},
          {"ratio", straggler.judgement.ratio},
          {"busySeconds", straggler.judgement.busy_seconds},
          {"peersBusySeconds", straggler.judgement.peers_busy_seconds},
          {"windowSteps", api::kStragglerWindowSteps},
          {"message", message}};
}

std::string DescribeStraggler(const Straggler& straggler, const std::string& where) {
  char ratio[32];
  snprintf(ratio, sizeof(ratio), "%.2fx", straggler.judgement.ratio);
  return "rank " + std::to_string(straggler.rank) + " (" + where + ") is " + ratio +
         " slower than the other ranks: " + Seconds(straggler.judgement.busy_seconds) +
         " of its own work per step vs " + Seconds(straggler.judgement.peers_busy_seconds) +
         " (medians of the last " + std::to_string(api::kStragglerWindowSteps) + " steps)";
}

StallMonitor::StallMonitor(Options options) : options_(std::move(options)) {}

std::string StallMonitor::Where() const {
  return options_.pod.empty() ? "node " + std::to_string(options_.node_rank)
                              : "pod " + options_.pod;
}

void StallMonitor::CheckStraggler(const std::vector<RankProgress>& progress) {
  const StragglerWatch::Verdict v = stragglers_->Check(progress);
  nlohmann::json straggler = nullptr;
  if (v.straggler) {
    const std::string message = DescribeStraggler(*v.straggler, Where());
    straggler = StragglerJson(options_.pod, *v.straggler, message);
    if (v.changed) options_.say(options_.job + ": straggler: " + message);
  } else if (v.changed) {
    options_.say(options_.job + ": no straggler any more: the ranks' work per step is within " +
                 "stallPolicy.stragglerRatio of each other");
  }
  if (options_.on_straggler) {
    options_.on_straggler(BusyMedians(progress), stragglers_->Ratio(), straggler, v.changed);
  }
}

void StallMonitor::ClearStall() {
  if (!stall_) return;
  stall_.reset();
  if (options_.on_stall) options_.on_stall(nullptr);
}

int StallMonitor::StackSignal() { return SIGRTMIN + 6; }

Status StallMonitor::Prepare(std::vector<GangMember>& members) {
  ranks_.clear();
  watch_ = std::make_unique<StallWatch>(options_.policy);
  const bool had_straggler = stragglers_ != nullptr;
  stragglers_ = std::make_unique<StragglerWatch>(options_.policy.straggler_ratio);
  if (had_straggler && options_.on_straggler) options_.on_straggler({}, 0, nullptr, true);
  ClearStall();
  for (GangMember& m : members) {
    Rank r;
    r.rank = m.rank;
    r.local_rank = m.local_rank;
    r.python = HasEnv(m.spawn.env, "SPAWNPOINT_SHIM=1");
    const std::string base = options_.dir + "/rank-" + std::to_string(m.rank);
    SP_ASSIGN_OR_RETURN(progress::ProgressFile record,
                        progress::ProgressFile::Create(base + ".progress"));
    r.record = std::make_unique<progress::ProgressFile>(std::move(record));
    m.spawn.env.push_back(std::string(progress::kProgressFileEnv) + "=" + r.record->path());
    if (r.python) {
      // The shim creates the file when it registers: its existence says a signal is safe.
      r.stack_file = base + ".stacks";
      unlink(r.stack_file.c_str());
      m.spawn.env.push_back("SPAWNPOINT_STACK_SIGNAL=" + std::to_string(StackSignal()));
      m.spawn.env.push_back("SPAWNPOINT_STACK_FILE=" + r.stack_file);
      // Ignored until faulthandler registers, and again once it unregisters at exit: a
      // request that meets a rank shutting down must not kill it (the signal's default).
      m.spawn.ignored_signals.push_back(StackSignal());
    }
    r.started_ns = progress::MonotonicNs();
    ranks_.push_back(std::move(r));
  }
  return Status::Ok();
}

std::string StallMonitor::Describe(const StalledRank& s, const RankStack& stack) const {
  std::string line = "rank " + std::to_string(s.rank) + " (" + Where() + ") made no step " +
                     (s.before_first_step ? "since it started, " : "for ") +
                     Seconds(s.silent_ns / 1e9) + "; median step " +
                     Seconds(watch_->MedianStepSeconds());
  if (s.waited_on_by >= 0) {
    line += "; rank " + std::to_string(s.waited_on_by) + " has waited " +
            Seconds(s.waited_on_ns / 1e9) +
            " for it in a collective while it used no CPU and waited in none";
  }
  if (!stack.top_frame.empty()) line += "; top frame: " + stack.top_frame;
  return line;
}

int64_t StallMonitor::RankCpuNs(int rank, pid_t pid) const {
  const int64_t own = ProcessCpuNs(pid, options_.proc_root);
  if (own < 0) return -1;
  int64_t total = own;
  std::vector<pid_t> helpers = ChildrenOf(pid, options_.proc_root);
  if (options_.loader_pids) {
    for (pid_t p : options_.loader_pids(rank)) helpers.push_back(p);
  }
  for (pid_t p : helpers) total += std::max<int64_t>(0, ProcessCpuNs(p, options_.proc_root));
  return total;
}

std::optional<RankFailure> StallMonitor::Check(const std::vector<std::pair<int, pid_t>>& running) {
  if (!watch_) return std::nullopt;
  const int64_t now = progress::MonotonicNs();
  const bool sample_cpu = now - last_cpu_sample_ns_ >= 1'000'000'000;
  if (sample_cpu) last_cpu_sample_ns_ = now;
  std::vector<RankProgress> progress;
  for (const Rank& r : ranks_) {
    StatusOr<progress::ProgressSnapshot> snapshot = r.record->Read();
    if (!snapshot.ok()) continue;  // a record the rank damaged: no verdict on it
    int64_t cpu = -1;
    if (sample_cpu) {
      auto pid = std::find_if(running.begin(), running.end(),
                              [&](const auto& p) { return p.first == r.rank; });
      if (pid != running.end()) cpu = RankCpuNs(r.rank, pid->second);
    }
    progress.push_back({r.rank, *snapshot, r.started_ns, cpu});
  }
  // Only ranks still running can stall: one that finished (its peers still at work) has
  // simply stopped stepping.
  std::vector<RankProgress> live;
  for (const RankProgress& p : progress) {
    if (std::any_of(running.begin(), running.end(),
                    [&](const auto& r) { return r.first == p.rank; })) {
      live.push_back(p);
    }
  }
  std::vector<StalledRank> stalled = watch_->Check(live, now);
  if (options_.on_progress) options_.on_progress(progress, watch_->MedianStepSeconds(), now);
  if (stall_) {
    for (const RankProgress& p : progress) {
      if (p.rank == stall_->first && p.snapshot.steps != stall_->second) ClearStall();
    }
  }
  // A stalled gang makes no steps: its windows keep their last figures, and the stall is
  // what is reported.
  if (!stall_ && stalled.empty()) CheckStraggler(progress);
  if (stalled.empty()) return std::nullopt;

  // When one rank hangs its peers soon wait for it in a collective and fall silent too:
  // every rank silent for half as long as the first stalled one is looked at.
  int64_t shortest = stalled.front().silent_ns;
  for (const StalledRank& s : stalled) shortest = std::min(shortest, s.silent_ns);
  for (const RankProgress& p : live) {
    const bool listed = std::any_of(stalled.begin(), stalled.end(),
                                    [&](const StalledRank& s) { return s.rank == p.rank; });
    const int64_t since = p.snapshot.steps == 0 ? p.started_ns : p.snapshot.last_step_ns;
    if (!listed && now - since >= shortest / 2) {
      stalled.push_back({p.rank, p.snapshot.steps, now - since, p.snapshot.steps == 0});
    }
  }
  std::vector<RankStack> stacks;
  for (const StalledRank& s : stalled) {
    StackRequest request;
    auto pid = std::find_if(running.begin(), running.end(),
                            [&](const auto& r) { return r.first == s.rank; });
    auto rank =
        std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.rank == s.rank; });
    if (pid == running.end() || rank == ranks_.end()) {
      stacks.emplace_back();
      continue;
    }
    request.pid = pid->second;
    request.python_stack_file = rank->stack_file;
    request.python_signal = rank->python ? StackSignal() : 0;
    request.scratch_dir = options_.dir;
    stacks.push_back(CaptureStack(request, options_.spawner));
    watch_->MarkReported(s.rank, s.steps);
  }

  // The culprits: not waiting in a collective; failing that, the fewest steps.
  std::vector<size_t> culprits;
  for (size_t i = 0; i < stalled.size(); ++i) {
    if (!stacks[i].in_collective) culprits.push_back(i);
  }
  if (culprits.empty() && options_.nodes > 1) {
    // Every silent rank here waits on the others: the one they wait for is on another
    // node, whose agent names it (and acts).
    std::string ranks;
    for (const StalledRank& st : stalled) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(st.rank);
    }
    options_.say(options_.job + ": " + (stalled.size() == 1 ? "rank " : "ranks ") + ranks +
                 " made no step for " + Seconds(stalled.front().silent_ns / 1e9) +
                 ", waiting in a collective: the stalled rank is on another node");
    return std::nullopt;
  }
  if (culprits.empty() || culprits.size() == stalled.size()) {
    uint64_t fewest = stalled.front().steps;
    for (const StalledRank& s : stalled) fewest = std::min(fewest, s.steps);
    std::vector<size_t> by_steps;
    for (size_t i = 0; i < stalled.size(); ++i) {
      if (stalled[i].steps == fewest) by_steps.push_back(i);
    }
    if (culprits.empty() || by_steps.size() < culprits.size()) culprits = by_steps;
  }
  std::vector<int> waiting;
  for (size_t i = 0; i < stalled.size(); ++i) {
    if (std::find(culprits.begin(), culprits.end(), i) == culprits.end()) {
      waiting.push_back(stalled[i].rank);
    }
  }
  for (size_t i : culprits) {
    options_.say(options_.job + ": stalled: " + Describe(stalled[i], stacks[i]));
    options_.say(options_.job + ": rank " + std::to_string(stalled[i].rank) + "'s stack (" +
                 (stacks[i].source.empty() ? "none" : stacks[i].source) + "):\n" +
                 FirstLines(stacks[i].text, kStackLinesShown));
  }
  if (options_.on_stall) {
    const size_t first = culprits.front();
    options_.on_stall(StallJson(options_.pod, stalled[first], watch_->MedianStepSeconds(),
                                stacks[first], Describe(stalled[first], stacks[first]), waiting));
  }
  stall_ = {stalled[culprits.front()].rank, stalled[culprits.front()].steps};
  if (!waiting.empty()) {
    std::string ranks;
    for (int r : waiting) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    options_.say(options_.job + ": " + (waiting.size() == 1 ? "rank " : "ranks ") + ranks +
                 (waiting.size() == 1 ? " waits" : " wait") + " on it");
  }
  if (options_.policy.action == api::StallAction::kReport) return std::nullopt;

  const size_t first = culprits.front();
  RankFailure f;
  f.rank = stalled[first].rank;
  auto rank =
      std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.rank == f.rank; });
  f.local_rank = rank != ranks_.end() ? rank->local_rank : -1;
  f.node_rank = options_.node_rank;
  auto pid = std::find_if(running.begin(), running.end(),
                          [&](const auto& r) { return r.first == f.rank; });
  f.pid = pid != running.end() ? pid->second : 0;
  f.status.signal = SIGTERM;  // the agent stops it
  f.cause = {ExitReason::kStalled, Describe(stalled[first], stacks[first])};
  f.retryable = options_.policy.action == api::StallAction::kRestart;
  f.stack = stacks[first].text;
  return f;
}

}  // namespace spawnpoint::agent
