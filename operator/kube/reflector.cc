#include "operator/kube/reflector.h"

#include <random>

#include "operator/kube/errors.h"

namespace spawnpoint::kube {

Reflector::Reflector(Client* client, GroupVersionResource gvr, std::string ns,
                     ListOptions selectors, ReflectorSink* sink, ReflectorOptions options)
    : client_(client),
      gvr_(std::move(gvr)),
      ns_(std::move(ns)),
      selectors_(std::move(selectors)),
      sink_(sink),
      options_(std::move(options)),
      clock_(client->clock()),
      uniform01_(options_.uniform01),
      backoff_(options_.backoff, client->clock(), options_.uniform01),
      what_("reflector " + gvr_.ToString() + (ns_.empty() ? "" : " in " + ns_)) {
  if (!uniform01_) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    uniform01_ = [rng] { return std::uniform_real_distribution<double>(0.0, 1.0)(*rng); };
  }
}

Reflector::~Reflector() { Stop(); }

void Reflector::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  if (current_watch_ != nullptr) current_watch_->Cancel();
  cv_.notify_all();
}

bool Reflector::Stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

bool Reflector::Sleep(Clock::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitUntil(clock_, cv_, lock, clock_->Now() + d, [&] { return stopped_; });
  return !stopped_;
}

void Reflector::Log(LogLevel level, const std::string& message) const {
  client_->logger()(level, what_ + ": " + message);
}

std::string Reflector::LastResourceVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_rv_;
}

ReflectorStats Reflector::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Reflector::Run() {
  bool need_list = true;
  bool gone = false;
  while (!Stopped()) {
    if (need_list) {
      ListOptions lo = selectors_;
      lo.limit = options_.page_size;
      auto list = client_->ListAll(gvr_, ns_, lo);
      if (!list.ok()) {
        if (Stopped()) break;
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.errors;
        }
        auto d = backoff_.Next();
        Log(LogLevel::kWarning, "list failed: " + list.status().ToString() + "; retrying in " +
                                    std::to_string(d.count() / 1'000'000) + " ms");
        if (!Sleep(d)) break;
        continue;
      }
      sink_->Replace(std::move(list->items), list->resource_version);
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_rv_ = list->resource_version;
        ++stats_.lists;
        if (gone) ++stats_.relists_on_gone;
      }
      need_list = false;
      gone = false;
    }
    if (WatchOnce()) {
      need_list = true;
      gone = true;
    }
  }
}

bool Reflector::WatchOnce() {
  WatchOptions wo;
  wo.label_selector = selectors_.label_selector;
  wo.field_selector = selectors_.field_selector;
  wo.allow_bookmarks = true;
  wo.idle_timeout = options_.watch_idle_timeout;
  wo.resource_version = LastResourceVersion();
  auto min = options_.min_watch_timeout.count();
  wo.server_timeout = std::chrono::seconds(min + static_cast<int64_t>(uniform01_() * min));

  auto fail = [&](const Status& st, const char* what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.errors;
    }
    if (IsGone(st)) {
      Log(LogLevel::kInfo, std::string(what) + ": " + st.ToString() + "; relisting");
      // Like client-go, relist after the backoff; while healthy that is 800 ms.
      Sleep(backoff_.Next());
      return true;
    }
    auto d = backoff_.Next();
    Log(LogLevel::kWarning, std::string(what) + ": " + st.ToString() + "; retrying in " +
                                std::to_string(d.count() / 1'000'000) + " ms");
    Sleep(d);
    // Errors other than transient ones (e.g. 403 after an RBAC change, 400) may mean our
    // resourceVersion is unusable: start again from a list, as client-go does.
    return !IsRetryable(st);
  };

  auto stream = client_->Watch(gvr_, ns_, wo);
  if (!stream.ok()) {
    if (Stopped()) return false;
    return fail(stream.status(), "watch failed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    current_watch_ = stream->get();
    ++stats_.watches;
  }
  const auto started = clock_->Now();
  int64_t received = 0;
  bool relist = false;
  for (;;) {
    auto ev = (*stream)->Next();
    if (!ev.ok()) {
      if (Stopped()) break;
      // A stall or a cut after progress just resumes; a watch failing at once backs off.
      if (IsRetryable(ev.status()) && received > 0) {
        Log(LogLevel::kInfo, "watch interrupted after " + std::to_string(received) + " events (" +
                                 ev.status().ToString() + "); resuming");
        break;
      }
      relist = fail(ev.status(), "watch stream failed");
      break;
    }
    if (!ev->has_value()) {
      if (received == 0 && clock_->Now() - started < options_.short_watch) {
        relist = fail(Unavailable("watch closed at once without events"), "watch ended");
      }
      break;
    }
    ++received;
    WatchEvent& e = **ev;
    std::string rv = ResourceVersionOf(e.object);
    if (e.type == WatchEventType::kBookmark) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!rv.empty()) last_rv_ = rv;
      ++stats_.bookmarks;
      continue;
    }
    sink_->Apply(e.type, std::move(e.object));
    std::lock_guard<std::mutex> lock(mu_);
    if (!rv.empty()) last_rv_ = rv;
    ++stats_.events;
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_watch_ = nullptr;
  return relist;
}

}  // namespace spawnpoint::kube
