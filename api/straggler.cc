#include "api/straggler.h"

#include <algorithm>

namespace spawnpoint::api {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<long>(mid));
  return (lower + upper) / 2;
}

std::optional<StragglerJudgement> JudgeSlowest(const std::vector<double>& busy_seconds) {
  if (busy_seconds.size() < 2) return std::nullopt;
  StragglerJudgement j;
  j.index = static_cast<size_t>(std::max_element(busy_seconds.begin(), busy_seconds.end()) -
                                busy_seconds.begin());
  std::vector<double> others;
  for (size_t i = 0; i < busy_seconds.size(); ++i) {
    if (i != j.index) others.push_back(busy_seconds[i]);
  }
  j.busy_seconds = busy_seconds[j.index];
  j.peers_busy_seconds = Median(std::move(others));
  if (j.peers_busy_seconds <= 0) return std::nullopt;
  j.ratio = j.busy_seconds / j.peers_busy_seconds;
  return j;
}

bool IsStraggler(const StragglerJudgement& j, double ratio, bool named) {
  const double threshold = named ? 1 + (ratio - 1) / 2 : ratio;
  return j.ratio >= threshold &&
         j.busy_seconds - j.peers_busy_seconds >= kStragglerMinExcessSeconds;
}

}  // namespace spawnpoint::api
