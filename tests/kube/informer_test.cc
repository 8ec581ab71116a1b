#include "operator/kube/informer.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/kube/errors.h"
#include "tests/kube/fake_clock.h"
#include "tests/kube/fake_transport.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using spawnpoint::testing::WaitUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using testing::FakeClock;
using testing::FakeStreamControl;
using testing::FakeTransport;
using ::testing::HasSubstr;
using testing::JsonResponse;
using testing::StatusResponse;
using ::testing::UnorderedElementsAre;

// The namespace of a request's path, "" for every namespace.
std::string TargetNamespace(const std::string& target) {
  const std::string marker = "/namespaces/";
  const size_t at = target.find(marker);
  if (at == std::string::npos) return "";
  const size_t start = at + marker.size();
  return target.substr(start, target.find('/', start) - start);
}

Json Pod(const std::string& name, const std::string& rv, Json labels = Json::object(),
         const std::string& owner_uid = "") {
  Json p = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", name},
              {"namespace", "ml"},
              {"resourceVersion", rv},
              {"labels", labels},
              {"managedFields", Json::array({{{"manager", "kubectl"}}})}}}};
  if (!owner_uid.empty()) {
    p["metadata"]["ownerReferences"] = {{{"kind", "TrainingJob"}, {"uid", owner_uid}}};
  }
  return p;
}

std::string Event(const std::string& type, const Json& obj) {
  return Json{{"type", type}, {"object", obj}}.dump();
}

HttpResponse ListResponse(std::vector<Json> items, const std::string& rv,
                          const std::string& cont = "") {
  return JsonResponse(200, Json{{"kind", "PodList"},
                                {"metadata", {{"resourceVersion", rv}, {"continue", cont}}},
                                {"items", items}}
                               .dump());
}

// The API as the reflector sees it: list answers and watch streams the test feeds. A list
// answer added for a namespace answers only that namespace's lists.
class ScriptedApi {
 public:
  void Install(FakeTransport* t) {
    t->SetSendHandler([this](const HttpRequest& r) {
      std::lock_guard<std::mutex> lock(mu_);
      list_targets_.push_back(r.target);
      cv_.notify_all();
      std::deque<HttpResponse>& lists = lists_by_ns_[TargetNamespace(r.target)];
      if (lists.empty()) return StatusResponse(500, "InternalError", "no list scripted");
      HttpResponse resp = lists.front();
      lists.pop_front();
      return resp;
    });
    t->SetStreamHandler([this](const HttpRequest& r, std::shared_ptr<FakeStreamControl>* c) {
      std::lock_guard<std::mutex> lock(mu_);
      watch_targets_.push_back(r.target);
      if (!watch_errors_.empty()) {
        HttpResponse resp = watch_errors_.front();
        watch_errors_.pop_front();
        cv_.notify_all();
        return resp;
      }
      *c = std::make_shared<FakeStreamControl>();
      watches_.push_back(*c);
      watches_by_ns_[TargetNamespace(r.target)].push_back(*c);
      cv_.notify_all();
      return JsonResponse(200, "");
    });
  }
  // The next list answer for `ns` (MakeInformer's "ml" by default).
  void AddList(HttpResponse r, const std::string& ns = "ml") {
    std::lock_guard<std::mutex> lock(mu_);
    lists_by_ns_[ns].push_back(std::move(r));
  }
  void AddWatchError(HttpResponse r) {
    std::lock_guard<std::mutex> lock(mu_);
    watch_errors_.push_back(std::move(r));
  }
  // The n-th (1-based) opened watch stream.
  std::shared_ptr<FakeStreamControl> WaitForWatch(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, seconds(10), [&] { return watches_.size() >= n; })) return nullptr;
    return watches_[n - 1];
  }
  // The n-th (1-based) watch stream opened on namespace `ns`.
  std::shared_ptr<FakeStreamControl> WaitForWatchIn(const std::string& ns, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, seconds(10), [&] { return watches_by_ns_[ns].size() >= n; })) {
      return nullptr;
    }
    return watches_by_ns_[ns][n - 1];
  }
  bool WaitForWatchAttempts(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(10), [&] { return watch_targets_.size() >= n; });
  }
  bool WaitForListAttempts(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(10), [&] { return list_targets_.size() >= n; });
  }
  std::vector<std::string> WatchTargets() {
    std::lock_guard<std::mutex> lock(mu_);
    return watch_targets_;
  }
  std::vector<std::string> ListTargets() {
    std::lock_guard<std::mutex> lock(mu_);
    return list_targets_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<HttpResponse>> lists_by_ns_;
  std::deque<HttpResponse> watch_errors_;
  std::vector<std::shared_ptr<FakeStreamControl>> watches_;
  std::map<std::string, std::vector<std::shared_ptr<FakeStreamControl>>> watches_by_ns_;
  std::vector<std::string> watch_targets_;
  std::vector<std::string> list_targets_;
};

// Records handler calls as "add ml/a 1", "update ml/a 1->2", "delete ml/b (unknown)".
class Recorder {
 public:
  EventHandler Handler() {
    return {
        .on_add =
            [this](const ObjectPtr& o) {
              Add("add " + ObjectKey(*o) + " " + ResourceVersionOf(*o));
            },
        .on_update =
            [this](const ObjectPtr& a, const ObjectPtr& b) {
              Add("update " + ObjectKey(*b) + " " + ResourceVersionOf(*a) + "->" +
                  ResourceVersionOf(*b));
            },
        .on_delete =
            [this](const ObjectPtr& o, bool unknown) {
              Add("delete " + ObjectKey(*o) + (unknown ? " (unknown)" : ""));
            },
    };
  }
  bool WaitForCount(size_t n) {
    return WaitUntil([&] { return Count() >= n; }, seconds(10));
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_.size();
  }
  std::vector<std::string> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  void Add(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(s));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
};

class InformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_.Install(transport_.get());
    ClientOptions o;
    o.qps = 0;
    o.retry.max_attempts = 1;  // the reflector's own backoff is under test
    o.logger = NullLogger();
    RestConfig c;
    c.server = "http://fake";
    client_ = std::make_unique<Client>(c, transport_, &clock_, o);
  }
  std::unique_ptr<Informer> MakeInformer(InformerOptions o = {}) {
    if (o.namespaces.empty()) o.namespaces = {"ml"};
    o.reflector.uniform01 = [] { return 0.5; };  // no jitter: exact timings
    o.reflector.page_size = 2;
    auto inf = std::make_unique<Informer>(client_.get(), resources::Pods(), o);
    inf->AddEventHandler(rec_.Handler());
    return inf;
  }

  FakeClock clock_;
  std::shared_ptr<FakeTransport> transport_ = std::make_shared<FakeTransport>(&clock_);
  ScriptedApi api_;
  std::unique_ptr<Client> client_;
  Recorder rec_;
};

TEST_F(InformerTest, ListsPagedThenWatchesAndDeliversInOrder) {
  api_.AddList(ListResponse({Pod("a", "1", {{"app", "x"}}, "uid-1"), Pod("b", "2")}, "10", "c1"));
  api_.AddList(ListResponse({Pod("c", "3", {{"app", "x"}})}, "10"));
  auto inf = MakeInformer();
  EXPECT_FALSE(inf->HasSynced());
  inf->Start();
  ASSERT_TRUE(inf->WaitForSync(seconds(10)));
  EXPECT_THAT(rec_.Events(), ElementsAre("add ml/a 1", "add ml/b 2", "add ml/c 3"));
  EXPECT_THAT(api_.ListTargets(), ElementsAre("/api/v1/namespaces/ml/pods?limit=2",
                                              "/api/v1/namespaces/ml/pods?limit=2&continue=c1"));
  auto w = api_.WaitForWatch(1);
  ASSERT_TRUE(w);
  EXPECT_EQ(api_.WatchTargets()[0],
            "/api/v1/namespaces/ml/pods?watch=true&resourceVersion=10&allowWatchBookmarks=true&"
            "timeoutSeconds=450");
  w->PushLine(Event("MODIFIED", Pod("a", "11", {{"app", "y"}}, "uid-1")));
  w->PushLine(Event("ADDED", Pod("d", "12", {}, "uid-1")));
  w->PushLine(Event("DELETED", Pod("b", "13")));
  ASSERT_TRUE(rec_.WaitForCount(6));
  EXPECT_THAT(rec_.Events(), ElementsAre("add ml/a 1", "add ml/b 2", "add ml/c 3",
                                         "update ml/a 1->11", "add ml/d 12", "delete ml/b"));
  const Store& s = inf->store();
  EXPECT_THAT(s.ListKeys(), UnorderedElementsAre("ml/a", "ml/c", "ml/d"));
  EXPECT_THAT(s.IndexKeys(kLabelIndex, "app=x"), ElementsAre("ml/c"));
  EXPECT_THAT(s.IndexKeys(kLabelIndex, "app=y"), ElementsAre("ml/a"));
  EXPECT_THAT(s.IndexKeys(kOwnerUidIndex, "uid-1"), ElementsAre("ml/a", "ml/d"));
  EXPECT_EQ(s.ByIndex(kNamespaceIndex, "ml").size(), 3u);
  // The default transform sheds managedFields.
  EXPECT_FALSE(s.Get("ml", "a")->at("metadata").contains("managedFields"));
  EXPECT_EQ(inf->LastResourceVersion(), "13");
  inf->Stop();
  EXPECT_TRUE(w->cancelled());
}

TEST_F(InformerTest, ResumesWatchFromLastResourceVersionAndBookmark) {
  api_.AddList(ListResponse({Pod("a", "1")}, "10"));
  auto inf = MakeInformer();
  inf->Start();
  auto w1 = api_.WaitForWatch(1);
  ASSERT_TRUE(w1);
  w1->PushLine(Event("MODIFIED", Pod("a", "11")));
  w1->PushLine(Event("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "20"}}}}));
  w1->End();  // the server closed the watch (timeoutSeconds)
  auto w2 = api_.WaitForWatch(2);
  ASSERT_TRUE(w2);
  EXPECT_THAT(api_.WatchTargets()[1], HasSubstr("resourceVersion=20&"));
  // A stall (idle timeout) after progress: resume at once from the last event.
  w2->PushLine(Event("ADDED", Pod("b", "21")));
  w2->Fail(Status(StatusCode::kDeadlineExceeded, "request timed out"));
  auto w3 = api_.WaitForWatch(3);
  ASSERT_TRUE(w3);
  EXPECT_THAT(api_.WatchTargets()[2], HasSubstr("resourceVersion=21&"));
  // Cut in the middle of an event: that event is not applied; the next watch resumes
  // before it and the server sends it again.
  w3->PushLine(Event("ADDED", Pod("c", "22")));
  w3->PushLine(R"({"type":"ADDED","object":{"metadata":{"name":"d","resour)");
  auto w4 = api_.WaitForWatch(4);
  ASSERT_TRUE(w4);
  EXPECT_THAT(api_.WatchTargets()[3], HasSubstr("resourceVersion=22&"));
  w4->PushLine(Event("ADDED", Pod("d", "23")));
  ASSERT_TRUE(rec_.WaitForCount(5));
  EXPECT_THAT(rec_.Events(), ElementsAre("add ml/a 1", "update ml/a 1->11", "add ml/b 21",
                                         "add ml/c 22", "add ml/d 23"));
  EXPECT_EQ(api_.ListTargets().size(), 1u);  // never relisted
  auto st = inf->ReflectorStatistics();
  EXPECT_EQ(st.lists, 1);
  EXPECT_EQ(st.bookmarks, 1);
  EXPECT_EQ(st.watches, 4);
}

TEST_F(InformerTest, RelistAfterGoneReconcilesMissedDeletions) {
  api_.AddList(ListResponse({Pod("a", "1"), Pod("b", "2"), Pod("c", "3")}, "10"));
  auto inf = MakeInformer();
  inf->Start();
  auto w1 = api_.WaitForWatch(1);
  ASSERT_TRUE(w1);
  ASSERT_TRUE(rec_.WaitForCount(3));
  // While we were away b was deleted, a changed and d appeared; the server has compacted
  // past our resourceVersion.
  api_.AddList(ListResponse({Pod("a", "15"), Pod("c", "3"), Pod("d", "16")}, "30"));
  w1->PushLine(Event("ERROR", {{"kind", "Status"},
                               {"code", 410},
                               {"reason", "Expired"},
                               {"message", "too old resource version: 10 (25)"}}));
  // The relist waits for the backoff (800 ms: healthy so far).
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(800)));
  clock_.Advance(milliseconds(800));
  ASSERT_TRUE(rec_.WaitForCount(6));
  EXPECT_THAT(rec_.Events(),
              ElementsAre("add ml/a 1", "add ml/b 2", "add ml/c 3", "delete ml/b (unknown)",
                          "update ml/a 1->15", "add ml/d 16"));
  EXPECT_THAT(inf->store().ListKeys(), UnorderedElementsAre("ml/a", "ml/c", "ml/d"));
  auto w2 = api_.WaitForWatch(2);
  ASSERT_TRUE(w2);
  EXPECT_THAT(api_.WatchTargets()[1], HasSubstr("resourceVersion=30&"));

  // A 410 answering the watch request itself relists as well.
  api_.AddWatchError(StatusResponse(410, "Expired", "too old resource version: 30 (40)"));
  api_.AddList(ListResponse({Pod("a", "15")}, "50"));
  // A watch that ends at once without events is a failure: back off (consecutive: 1.6 s),
  // watch again, get 410, back off (3.2 s), relist.
  w2->End();
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(1600)));
  clock_.Advance(milliseconds(1600));
  ASSERT_TRUE(api_.WaitForWatchAttempts(3));
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(3200)));
  clock_.Advance(milliseconds(3200));
  ASSERT_TRUE(rec_.WaitForCount(8));
  auto ev = rec_.Events();
  EXPECT_THAT(std::vector<std::string>(ev.begin() + 6, ev.end()),
              UnorderedElementsAre("delete ml/c (unknown)", "delete ml/d (unknown)"));
  EXPECT_EQ(inf->ReflectorStatistics().relists_on_gone, 2);
  ASSERT_TRUE(api_.WaitForWatch(3));
  EXPECT_THAT(api_.WatchTargets()[3], HasSubstr("resourceVersion=50&"));
}

Json PodIn(const std::string& ns, const std::string& name, const std::string& rv) {
  Json p = Pod(name, rv);
  p["metadata"]["namespace"] = ns;
  return p;
}

// --namespace team-a,team-b: a reflector per namespace (its own list and watch paths) feeding
// one store. Synced only once both listed; a 410 in one relists that namespace alone, and the
// other's objects stay (no deletion of what the relist did not cover).
TEST_F(InformerTest, EachNamespaceIsListedWatchedAndRelistedOnItsOwn) {
  api_.AddList(ListResponse({PodIn("team-a", "x", "1"), PodIn("team-a", "y", "2")}, "10"),
               "team-a");
  // team-b's first list fails (nothing scripted): it backs off 800 ms.
  InformerOptions o;
  o.namespaces = {"team-a", "team-b", "team-a"};  // a duplicate is watched once
  auto inf = MakeInformer(o);
  inf->Start();
  auto wa = api_.WaitForWatchIn("team-a", 1);
  ASSERT_TRUE(wa);
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(800)));
  wa->PushLine(Event("MODIFIED", PodIn("team-a", "x", "11")));
  ASSERT_TRUE(rec_.WaitForCount(3));
  // Delivered in order: had team-a's list alone marked the cache synced, that mark would have
  // been taken before this update.
  EXPECT_FALSE(inf->HasSynced()) << "team-b has not been listed";
  EXPECT_THAT(rec_.Events(),
              ElementsAre("add team-a/x 1", "add team-a/y 2", "update team-a/x 1->11"));

  api_.AddList(ListResponse({PodIn("team-b", "z", "3")}, "20"), "team-b");
  clock_.Advance(milliseconds(800));
  ASSERT_TRUE(inf->WaitForSync(seconds(10)));
  auto wb = api_.WaitForWatchIn("team-b", 1);
  ASSERT_TRUE(wb);
  EXPECT_THAT(api_.WatchTargets(), UnorderedElementsAre(HasSubstr("/namespaces/team-a/pods?"),
                                                        HasSubstr("/namespaces/team-b/pods?")));
  EXPECT_THAT(api_.ListTargets(), UnorderedElementsAre("/api/v1/namespaces/team-a/pods?limit=2",
                                                       "/api/v1/namespaces/team-b/pods?limit=2",
                                                       "/api/v1/namespaces/team-b/pods?limit=2"))
      << "each namespace on its own path, nothing cluster-wide";
  EXPECT_EQ(inf->LastResourceVersion("team-b"), "20");

  // team-a's watch expires (410): team-a is listed again, y is gone meanwhile. team-b's
  // objects are not in that list, and stay.
  api_.AddList(ListResponse({PodIn("team-a", "x", "11")}, "30"), "team-a");
  wa->PushLine(Event("ERROR", {{"kind", "Status"}, {"code", 410}, {"reason", "Expired"}}));
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(800)));
  clock_.Advance(milliseconds(800));
  ASSERT_TRUE(api_.WaitForWatchIn("team-a", 2));
  EXPECT_EQ(inf->LastResourceVersion("team-a"), "30");
  EXPECT_EQ(inf->LastResourceVersion("team-c"), "") << "not watched";
  wb->PushLine(Event("MODIFIED", PodIn("team-b", "z", "31")));
  ASSERT_TRUE(rec_.WaitForCount(6));
  auto ev = rec_.Events();
  EXPECT_THAT(
      std::vector<std::string>(ev.begin() + 3, ev.end()),
      UnorderedElementsAre("add team-b/z 3", "delete team-a/y (unknown)", "update team-b/z 3->31"));
  EXPECT_THAT(inf->store().ListKeys(), UnorderedElementsAre("team-a/x", "team-b/z"));
  EXPECT_EQ(inf->ReflectorStatistics().relists_on_gone, 1);
  EXPECT_EQ(inf->ReflectorStatistics().lists, 3);
}

TEST_F(InformerTest, FailuresBackOffExponentiallyToTheCap) {
  // Lists fail 8 times (500 from the scripted API when nothing is queued), then succeed.
  auto inf = MakeInformer();
  inf->Start();
  std::vector<int64_t> waits;
  for (int i = 1; i <= 8; ++i) {
    ASSERT_TRUE(api_.WaitForListAttempts(i));
    ASSERT_TRUE(clock_.BlockUntilDeadline());
    auto d = clock_.NextDeadline() - clock_.Now();
    waits.push_back(std::chrono::duration_cast<milliseconds>(d).count());
    if (i == 8) api_.AddList(ListResponse({Pod("a", "1")}, "10"));
    clock_.Advance(d);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{800, 1600, 3200, 6400, 12800, 25600, 30000, 30000}));
  ASSERT_TRUE(inf->WaitForSync(seconds(10)));
  // A failing watch backs off too, and resumes rather than relisting: the backoff keeps
  // growing because the failures are consecutive (no two healthy minutes in between).
  auto w1 = api_.WaitForWatch(1);
  ASSERT_TRUE(w1);
  api_.AddWatchError(StatusResponse(500, "InternalError", "etcd leader changed"));
  w1->End();  // immediately after opening and without events: also a failure
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(seconds(30)));
  clock_.Advance(seconds(30));
  ASSERT_TRUE(api_.WaitForWatchAttempts(2));
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(seconds(30)));
  clock_.Advance(seconds(30));
  ASSERT_TRUE(api_.WaitForWatch(2));
  EXPECT_EQ(api_.ListTargets().size(), 9u);
  EXPECT_THAT(api_.WatchTargets()[2], HasSubstr("resourceVersion=10&"));
}

TEST_F(InformerTest, BackoffResetsAfterAHealthyPeriod) {
  api_.AddList(ListResponse({Pod("a", "1")}, "10"));
  auto inf = MakeInformer();
  inf->Start();
  auto w1 = api_.WaitForWatch(1);
  ASSERT_TRUE(w1);
  w1->Fail(Unavailable("connection reset"));  // no events yet: a failure, 800 ms
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(800)));
  clock_.Advance(milliseconds(800));
  auto w2 = api_.WaitForWatch(2);
  ASSERT_TRUE(w2);
  w2->Fail(Unavailable("connection reset"));  // consecutive: 1600 ms
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(1600)));
  clock_.Advance(milliseconds(1600));
  auto w3 = api_.WaitForWatch(3);
  ASSERT_TRUE(w3);
  clock_.Advance(std::chrono::minutes(3));  // a long healthy watch
  w3->Fail(Unavailable("connection reset"));
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(milliseconds(800)));
}

TEST_F(InformerTest, StopCancelsTheOpenWatchAndBackoff) {
  api_.AddList(ListResponse({}, "10"));
  auto inf = MakeInformer();
  inf->Start();
  auto w = api_.WaitForWatch(1);
  ASSERT_TRUE(w);
  inf->Stop();  // returns only once both threads have exited
  EXPECT_TRUE(w->cancelled());

  // Stopping during a backoff wait does not wait for the simulated time to pass.
  auto inf2 = MakeInformer();
  inf2->Start();  // lists fail (nothing scripted): backs off
  ASSERT_TRUE(clock_.BlockUntilDeadline());
  inf2->Stop();
}

TEST_F(InformerTest, ResyncRedeliversCachedObjects) {
  api_.AddList(ListResponse({Pod("a", "1"), Pod("b", "2")}, "10"));
  InformerOptions o;
  o.resync_period = seconds(30);
  auto inf = MakeInformer(o);
  inf->Start();
  ASSERT_TRUE(inf->WaitForSync(seconds(10)));
  ASSERT_TRUE(api_.WaitForWatch(1));
  ASSERT_TRUE(clock_.BlockUntilNextDeadlineIn(seconds(30)));
  clock_.Advance(seconds(30));
  ASSERT_TRUE(rec_.WaitForCount(4));
  auto ev = rec_.Events();
  EXPECT_THAT(std::vector<std::string>(ev.begin() + 2, ev.end()),
              UnorderedElementsAre("update ml/a 1->1", "update ml/b 2->2"));
}

TEST(StoreTest, IndexesFollowUpdatesAndRemovals) {
  Store s;
  s.Upsert(std::make_shared<const Json>(Pod("a", "1", {{"app", "x"}, {"tier", "web"}}, "u1")));
  s.Upsert(std::make_shared<const Json>(Pod("b", "1", {{"app", "x"}}, "u2")));
  EXPECT_THAT(s.IndexKeys(kLabelIndex, "app=x"), ElementsAre("ml/a", "ml/b"));
  auto old = s.Upsert(std::make_shared<const Json>(Pod("a", "2", {{"app", "z"}}, "u2")));
  ASSERT_TRUE(old);
  EXPECT_EQ(ResourceVersionOf(*old), "1");
  EXPECT_THAT(s.IndexKeys(kLabelIndex, "app=x"), ElementsAre("ml/b"));
  EXPECT_TRUE(s.IndexKeys(kLabelIndex, "tier=web").empty());
  EXPECT_THAT(s.IndexKeys(kOwnerUidIndex, "u2"), ElementsAre("ml/a", "ml/b"));
  EXPECT_TRUE(s.IndexKeys(kOwnerUidIndex, "u1").empty());
  s.AddIndex("phase", [](const Json& o) {
    return std::vector<std::string>{o.value("/status/phase"_json_pointer, std::string("none"))};
  });
  EXPECT_EQ(s.ByIndex("phase", "none").size(), 2u);
  EXPECT_TRUE(s.Remove("ml/b"));
  EXPECT_FALSE(s.Remove("ml/b"));
  EXPECT_TRUE(s.IndexKeys(kLabelIndex, "app=x").empty());
  EXPECT_EQ(s.ByIndex("phase", "none").size(), 1u);
  EXPECT_TRUE(s.ByIndex("no-such-index", "x").empty());
  EXPECT_EQ(s.Get("ml", "a")->at("metadata").at("resourceVersion"), "2");
}

TEST(StoreTest, ReplaceReportsTheDifference) {
  Store s;
  s.Upsert(std::make_shared<const Json>(Pod("a", "1")));
  s.Upsert(std::make_shared<const Json>(Pod("b", "1")));
  s.Upsert(std::make_shared<const Json>(Pod("c", "1")));
  auto r = s.Replace({std::make_shared<const Json>(Pod("a", "1")),
                      std::make_shared<const Json>(Pod("b", "2")),
                      std::make_shared<const Json>(Pod("d", "1", {{"k", "v"}}))});
  ASSERT_EQ(r.added.size(), 1u);
  EXPECT_EQ(NameOf(*r.added[0]), "d");
  ASSERT_EQ(r.updated.size(), 1u);
  EXPECT_EQ(ResourceVersionOf(*r.updated[0].first), "1");
  EXPECT_EQ(ResourceVersionOf(*r.updated[0].second), "2");
  ASSERT_EQ(r.deleted.size(), 1u);
  EXPECT_EQ(NameOf(*r.deleted[0]), "c");
  EXPECT_EQ(r.unchanged.size(), 1u);
  EXPECT_EQ(s.Size(), 3u);
  EXPECT_THAT(s.IndexKeys(kLabelIndex, "k=v"), ElementsAre("ml/d"));
}

}  // namespace
}  // namespace spawnpoint::kube
