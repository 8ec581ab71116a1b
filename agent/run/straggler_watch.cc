#include "agent/run/straggler_watch.h"

#include <algorithm>

namespace spawnpoint::agent {

std::vector<RankBusy> BusyMedians(const std::vector<RankProgress>& ranks) {
  const size_t window = api::kStragglerWindowSteps;
  std::vector<RankBusy> out;
  for (const RankProgress& r : ranks) {
    RankBusy b{.rank = r.rank};
    const auto& d = r.snapshot.recent_us;
    const auto& w = r.snapshot.recent_wait_us;
    if (d.size() >= window && w.size() == d.size()) {
      std::vector<double> busy, wait;
      for (size_t i = d.size() - window; i < d.size(); ++i) {
        const uint32_t waited = std::min(w[i], d[i]);
        busy.push_back((d[i] - waited) / 1e6);
        wait.push_back(waited / 1e6);
      }
      b.busy_seconds = api::Median(std::move(busy));
      b.wait_seconds = api::Median(std::move(wait));
    }
    out.push_back(b);
  }
  return out;
}

StragglerWatch::Verdict StragglerWatch::Check(const std::vector<RankProgress>& ranks) {
  std::vector<double> busy;
  std::vector<const RankProgress*> judged;
  const std::vector<RankBusy> medians = BusyMedians(ranks);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!medians[i].busy_seconds) continue;
    busy.push_back(*medians[i].busy_seconds);
    judged.push_back(&ranks[i]);
  }
  const std::optional<api::StragglerJudgement> j = api::JudgeSlowest(busy);
  ratio_seen_ = j ? j->ratio : 0;

  std::optional<Straggler> now;
  if (j) {
    const RankProgress& slowest = *judged[j->index];
    const bool named = named_ && named_->rank == slowest.rank;
    if (api::IsStraggler(*j, ratio_, named)) {
      if (named) {
        now = Straggler{slowest.rank, *j, named_->steps};
      } else if (!candidate_ || candidate_->first != slowest.rank) {
        candidate_ = {slowest.rank, slowest.snapshot.steps};
      } else if (slowest.snapshot.steps >=
                 candidate_->second + static_cast<uint64_t>(api::kStragglerWindowSteps)) {
        now = Straggler{slowest.rank, *j, slowest.snapshot.steps};  // held for a whole window
      }
    } else {
      candidate_.reset();
    }
  } else {
    candidate_.reset();
  }
  Verdict v;
  v.changed = now.has_value() != named_.has_value() || (now && now->rank != named_->rank);
  if (now) candidate_.reset();
  named_ = now;
  v.straggler = now;
  return v;
}

}  // namespace spawnpoint::agent
