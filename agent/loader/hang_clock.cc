#include "agent/loader/hang_clock.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace spawnpoint::loader {
namespace {

using std::chrono::duration_cast;

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Since the process started: /proc/PID/stat's field 22 against /proc/uptime.
std::optional<Clock::Duration> AgeOf(pid_t pid) {
  const std::string stat = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 1));
  std::string skip;
  for (int f = 3; f < 22 && fields; ++f) fields >> skip;  // fields 3..21
  unsigned long long start_ticks = 0;
  double uptime = 0;
  if (!(fields >> start_ticks) || !(std::ifstream("/proc/uptime") >> uptime)) return std::nullopt;
  const double age =
      uptime - static_cast<double>(start_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
  // Both are in ticks (10 ms): rounded, not truncated, so 1.0 - 1e-12 is 1 s, as it was.
  return std::chrono::round<Clock::Duration>(std::chrono::duration<double>(std::max(0.0, age)));
}

std::optional<Clock::Duration> CpuWaitOf(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return std::nullopt;
  std::optional<Clock::Duration> sum;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    auto wait = ParseRunDelay(ReadSmallFile(dir + "/" + e->d_name + "/schedstat"));
    if (wait) sum = sum.value_or(Clock::Duration{0}) + *wait;  // a thread gone meanwhile: none
  }
  closedir(d);
  return sum;
}

}  // namespace

std::optional<Clock::Duration> ParseRunDelay(std::string_view schedstat) {
  std::istringstream in{std::string(schedstat)};
  unsigned long long on_cpu = 0, run_delay = 0, slices = 0;
  if (!(in >> on_cpu >> run_delay >> slices)) return std::nullopt;
  return std::chrono::nanoseconds(static_cast<int64_t>(run_delay));
}

std::optional<ProcessTimes> ReadProcessTimes(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto age = AgeOf(pid);
  if (!age) return std::nullopt;
  return ProcessTimes{*age, CpuWaitOf(pid)};
}

void HangClock::Restart(Clock::TimePoint since) {
  *this = HangClock();
  since_ = since;
}

void HangClock::Look(Clock::TimePoint now, pid_t pid, std::optional<Clock::Duration> cpu_wait,
                     bool started_since) {
  last_look_ = now;
  if (!cpu_wait) return;
  if (pid != pid_ || !last_wait_) {
    pid_ = pid;
    last_wait_ = started_since ? Clock::Duration{0} : *cpu_wait;
  }
  // A reading lower than the last one: a thread exited, taking its share of the sum.
  if (*cpu_wait > *last_wait_) credit_ += *cpu_wait - *last_wait_;
  last_wait_ = cpu_wait;
}

Clock::Duration HangClock::Credit() const {
  if (!last_look_) return Clock::Duration{0};
  return std::clamp(credit_, Clock::Duration{0}, *last_look_ - since_);
}

bool HangClock::AtCeiling(Clock::TimePoint now, std::chrono::milliseconds timeout) const {
  return Elapsed(now) >= kCeilingTimeouts * timeout;
}

bool HangClock::Overdue(Clock::TimePoint now, std::chrono::milliseconds timeout) const {
  return Elapsed(now) >= timeout && (Unstarved(now) >= timeout || AtCeiling(now, timeout));
}

Clock::TimePoint HangClock::NextLook(std::chrono::milliseconds timeout) const {
  const Clock::Duration every =
      std::max<Clock::Duration>(timeout / 8, std::chrono::milliseconds(1));
  if (!last_look_) return since_ + std::min<Clock::Duration>(every, timeout);
  const Clock::TimePoint last = *last_look_;
  // The uncredited time reaches the timeout no sooner than this, if the worker gets every
  // CPU it wants from the last look on. With credit, that comes closer by little while the
  // worker gets little, so looks are then never closer together than T/64; past it (a worker
  // overdue and spared, as a successor still starting is), they go on every T/64.
  const Clock::TimePoint unstarved_limit = last + (timeout - Unstarved(last));
  Clock::TimePoint next = last + every;
  if (unstarved_limit <= last) {
    next = last + every / 8;
  } else if (Credit() > Clock::Duration{0}) {
    next = std::min(next, std::max(unstarved_limit, last + every / 8));
  } else {
    next = std::min(next, unstarved_limit);
  }
  const Clock::TimePoint ceiling = since_ + kCeilingTimeouts * timeout;
  if (ceiling > last) next = std::min(next, ceiling);
  return next;
}

std::string HangClock::Note(Clock::TimePoint now, std::chrono::milliseconds timeout) const {
  if (Credit() <= Clock::Duration{0}) return "";
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f", std::chrono::duration<double>(Credit()).count());
  std::string note = std::string(" (not counting ") + secs + " s it waited for a CPU";
  if (Unstarved(now) < timeout && AtCeiling(now, timeout)) {
    note += "; at the limit of " + std::to_string(kCeilingTimeouts) + " timeouts however starved";
  }
  return note + ")";
}

}  // namespace spawnpoint::loader
