// The client library over real HTTP against the real cluster SPAWNPOINT_TEST_KUBECONFIG names
// (ctest's cluster_kube_client starts scripts/cluster.sh's control plane and sets it, through
// tests/cluster/with_cluster.sh), through kube-fault-proxy (tools/faultproxy, built into
// .tools/bin by scripts/install-tools.sh --control-plane), which answers the /testing
// endpoints the fault tests use (fault rules, the request log). Every test works in its own
// namespace, deleted at the end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "operator/kube/client.h"
#include "operator/kube/cpprest_transport.h"
#include "operator/kube/errors.h"
#include "operator/kube/informer.h"
#include "operator/kube/leader_election.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using spawnpoint::testing::TempDir;
using spawnpoint::testing::TestProcess;
using spawnpoint::testing::WaitUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

const GroupVersionResource kConfigMaps = resources::ConfigMaps();

std::string RealClusterKubeconfig() {
  const char* v = std::getenv("SPAWNPOINT_TEST_KUBECONFIG");
  return v ? v : "";
}

class KubeIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(RealClusterKubeconfig().empty())
        << "SPAWNPOINT_TEST_KUBECONFIG names no cluster: run this through "
           "tests/cluster/with_cluster.sh (ctest -R cluster_kube_client), which starts one";
    // The fault proxy in front of the cluster: every request goes through it.
    ASSERT_EQ(::access(KUBE_FAULT_PROXY, X_OK), 0)
        << KUBE_FAULT_PROXY
        << " is missing: scripts/install-tools.sh --control-plane builds it (make deps)";
    std::string kubeconfig = dir_.File("proxy.kubeconfig");
    server_ = std::make_unique<TestProcess>(
        std::vector<std::string>{KUBE_FAULT_PROXY, "--upstream-kubeconfig", RealClusterKubeconfig(),
                                 "--kubeconfig-out", kubeconfig});
    ASSERT_TRUE(WaitUntil(
        [&] { return server_->Stdout().find("listening on http://") != std::string::npos; },
        seconds(20)))
        << server_->Stderr();
    auto c = LoadKubeconfig(kubeconfig);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    config_ = *c;
    client_ = NewClient();
    auto raw = NewCpprestTransport(config_);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    raw_ = std::move(raw).value();
    std::random_device rd;
    ns_ = "sp-it-" + std::to_string(::getpid()) + "-" + std::to_string(rd() % 100000);
    auto created = client_->Create(
        resources::Namespaces(),
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns_}}}});
    ASSERT_TRUE(created.ok()) << created.status().ToString();
  }

  void TearDown() override {
    if (raw_) Testing("DELETE", "/testing/faults");
    if (client_ && !ns_.empty()) {
      (void)client_->Delete(resources::Namespaces(), "", ns_, {.propagation_policy = "Background"});
    }
  }

  std::unique_ptr<Client> NewClient(ClientOptions o = {}) {
    o.logger = [this](LogLevel level, const std::string& m) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_ += m + "\n";
    };
    auto c = Client::Connect(config_, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

  // A call to the test server's /testing endpoints.
  Json Testing(const std::string& method, const std::string& path, const Json& body = nullptr) {
    HttpRequest r;
    r.method = method;
    r.target = path;
    if (!body.is_null()) {
      r.body = body.dump();
      r.headers["content-type"] = "application/json";
    }
    HttpResponse resp = raw_->Send(r);
    EXPECT_EQ(resp.status, 200) << method << " " << path << ": " << resp.body
                                << resp.error.ToString();
    return Json::parse(resp.body, nullptr, false);
  }

  void AddFaults(Json rules) { Testing("POST", "/testing/faults", {{"rules", rules}}); }

  // Requests the server saw for one verb on configmaps (or `resource`) in our namespace.
  std::vector<Json> Requests(const std::string& verb, const std::string& resource = "configmaps") {
    std::vector<Json> out;
    Json log = Testing("GET", "/testing/requests");
    for (auto& r : log["requests"]) {
      if (r.value("verb", "") == verb && r.value("resource", "") == resource &&
          r.value("namespace", "") == ns_) {
        out.push_back(r);
      }
    }
    return out;
  }

  // As Requests, once at least `n` are logged (the server logs a request after answering
  // it, so the last one may trail the client's return).
  std::vector<Json> RequestsAtLeast(size_t n, const std::string& verb,
                                    const std::string& resource = "configmaps") {
    std::vector<Json> out;
    WaitUntil(
        [&] {
          out = Requests(verb, resource);
          return out.size() >= n;
        },
        seconds(10));
    return out;
  }

  Json ConfigMap(const std::string& name, Json labels = Json::object()) {
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"namespace", ns_}, {"labels", labels}}},
            {"data", {{"v", "0"}}}};
  }

  std::string Log() {
    std::lock_guard<std::mutex> lock(log_mu_);
    return log_;
  }

  TempDir dir_;
  std::unique_ptr<TestProcess> server_;
  RestConfig config_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<HttpTransport> raw_;
  std::string ns_;
  std::mutex log_mu_;
  std::string log_;
};

TEST_F(KubeIntegrationTest, CrudWithPreconditionsAndConflicts) {
  auto created = client_->Create(kConfigMaps, ConfigMap("a"));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_FALSE(UidOf(*created).empty());
  EXPECT_TRUE(IsAlreadyExists(client_->Create(kConfigMaps, ConfigMap("a")).status()));
  EXPECT_TRUE(IsNotFound(client_->Get(kConfigMaps, ns_, "nope").status()));

  Json v1 = *created;
  Json v2 = v1;
  v2["data"]["v"] = "1";
  auto updated = client_->Update(kConfigMaps, v2);
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_NE(ResourceVersionOf(*updated), ResourceVersionOf(v1));
  // Writing on top of the version we read before someone else's update: 409.
  Json stale = v1;
  stale["data"]["v"] = "stale";
  auto conflict = client_->Update(kConfigMaps, stale);
  EXPECT_TRUE(IsConflict(conflict.status())) << conflict.status().ToString();

  auto patched =
      client_->Patch(kConfigMaps, ns_, "a",
                     {{"metadata", {{"labels", {{"patched", "yes"}}}}}, {"data", {{"w", "2"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ((*patched)["metadata"]["labels"]["patched"], "yes");
  EXPECT_EQ((*patched)["data"]["v"], "1");
  EXPECT_EQ((*patched)["data"]["w"], "2");

  // Deletion preconditions: the wrong uid or resourceVersion is a conflict.
  auto wrong_uid = client_->Delete(kConfigMaps, ns_, "a", {.precondition_uid = "not-the-uid"});
  EXPECT_TRUE(IsConflict(wrong_uid.status())) << wrong_uid.status().ToString();
  auto wrong_rv = client_->Delete(kConfigMaps, ns_, "a",
                                  {.precondition_resource_version = ResourceVersionOf(v1)});
  EXPECT_TRUE(IsConflict(wrong_rv.status())) << wrong_rv.status().ToString();
  ASSERT_TRUE(client_->Delete(kConfigMaps, ns_, "a", {.precondition_uid = UidOf(v1)}).ok());
  EXPECT_TRUE(IsNotFound(client_->Get(kConfigMaps, ns_, "a").status()));
}

TEST_F(KubeIntegrationTest, StatusSubresourceAndGarbageCollection) {
  Json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "p"}, {"namespace", ns_}}},
              {"spec",
               {// Bound to a node that does not exist, so a real cluster never runs it.
                {"nodeName", "spawnpoint-it-no-such-node"},
                {"containers", {{{"name", "c"}, {"image", "registry.k8s.io/pause:3.9"}}}}}}};
  // A real cluster refuses pods until the namespace's default service account exists.
  StatusOr<Json> created = Internal("not tried");
  WaitUntil(
      [&] {
        created = client_->Create(resources::Pods(), pod);
        return !IsForbidden(created.status());
      },
      seconds(30));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Json with_status = *created;
  with_status["status"]["phase"] = "Failed";
  with_status["status"]["message"] = "integration test";
  auto st = client_->UpdateStatus(resources::Pods(), with_status);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto got = client_->Get(resources::Pods(), ns_, "p");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["status"]["phase"], "Failed");
  auto phase = client_->List(resources::Pods(), ns_, {.field_selector = "status.phase=Failed"});
  ASSERT_TRUE(phase.ok()) << phase.status().ToString();
  EXPECT_EQ(phase->items.size(), 1u);

  // Deleting an owner with background propagation collects its dependents.
  auto owner = client_->Create(kConfigMaps, ConfigMap("owner"));
  ASSERT_TRUE(owner.ok());
  Json dep = ConfigMap("dependent");
  dep["metadata"]["ownerReferences"] = {
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "owner"}, {"uid", UidOf(*owner)}}};
  ASSERT_TRUE(client_->Create(kConfigMaps, dep).ok());
  ASSERT_TRUE(
      client_->Delete(kConfigMaps, ns_, "owner", {.propagation_policy = "Background"}).ok());
  EXPECT_TRUE(
      WaitUntil([&] { return IsNotFound(client_->Get(kConfigMaps, ns_, "dependent").status()); },
                seconds(60)));
  (void)client_->Delete(resources::Pods(), ns_, "p", {.grace_period_seconds = 0});
}

TEST_F(KubeIntegrationTest, PagingAndSelectors) {
  for (int i = 0; i < 25; ++i) {
    auto r = client_->Create(
        kConfigMaps, ConfigMap("cm-" + std::to_string(i), {{"app", "paging"},
                                                           {"parity", i % 2 ? "odd" : "even"},
                                                           {"idx", std::to_string(i)}}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  auto page = client_->List(kConfigMaps, ns_, {.label_selector = "app=paging", .limit = 10});
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(page->items.size(), 10u);
  EXPECT_FALSE(page->continue_token.empty());
  auto next = client_->List(
      kConfigMaps, ns_,
      {.label_selector = "app=paging", .limit = 10, .continue_token = page->continue_token});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->items.size(), 10u);
  EXPECT_NE(NameOf(next->items[0]), NameOf(page->items[0]));

  auto all = client_->ListAll(kConfigMaps, ns_, {.label_selector = "app=paging", .limit = 7});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::set<std::string> names;
  for (auto& i : all->items) names.insert(NameOf(i));
  EXPECT_EQ(names.size(), 25u);
  EXPECT_EQ(all->items.size(), 25u);
  EXPECT_FALSE(all->resource_version.empty());
  EXPECT_EQ(RequestsAtLeast(6, "list").size(), 2u + 4u);

  auto count = [&](const std::string& label, const std::string& field = "") -> size_t {
    auto l = client_->ListAll(kConfigMaps, ns_,
                              {.label_selector = label, .field_selector = field, .limit = 100});
    EXPECT_TRUE(l.ok()) << label << " " << field << ": " << l.status().ToString();
    return l.ok() ? l->items.size() : 0;
  };
  EXPECT_EQ(count("parity=even"), 13u);
  EXPECT_EQ(count("parity!=even,app=paging"), 12u);
  EXPECT_EQ(count("idx in (1,2,3,99)"), 3u);
  EXPECT_EQ(count("idx notin (1,2,3),app=paging"), 22u);
  EXPECT_EQ(count("parity"), 25u);
  EXPECT_EQ(count("app=paging,!parity"), 0u);
  EXPECT_EQ(count("", "metadata.name=cm-3"), 1u);
  EXPECT_EQ(count("parity=odd", "metadata.name!=cm-3"), 11u);
}

// A real cluster's kube-controller-manager publishes this ConfigMap into every namespace: the
// tests' informers see it, but it is none of theirs.
constexpr char kRootCaConfigMap[] = "kube-root-ca.crt";

// Counts what the informer delivered per object name (the cluster's own ConfigMap aside).
struct Tally {
  EventHandler Handler() {
    return {.on_add = [this](const ObjectPtr& o) { Bump(NameOf(*o), 0); },
            .on_update = [this](const ObjectPtr& a, const ObjectPtr& b) { Bump(NameOf(*b), 1); },
            .on_delete = [this](const ObjectPtr& o,
                                bool unknown) { Bump(NameOf(*o), unknown ? 3 : 2); }};
  }
  void Bump(const std::string& name, int kind) {
    if (name == kRootCaConfigMap) return;
    std::lock_guard<std::mutex> lock(mu);
    counts[name][kind]++;
    ++total;
  }
  std::array<int, 4> Of(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    return counts[name];
  }
  int Total() {
    std::lock_guard<std::mutex> lock(mu);
    return total;
  }
  std::mutex mu;
  std::map<std::string, std::array<int, 4>> counts;  // add, update, delete, delete-unknown
  int total = 0;
};

InformerOptions FastInformer(const std::string& ns) {
  InformerOptions o;
  o.namespaces = {ns};
  o.reflector.page_size = 10;
  o.reflector.backoff.initial = milliseconds(100);
  o.reflector.backoff.max = seconds(1);
  return o;
}

TEST_F(KubeIntegrationTest, WatchResumesAfterCutStreamsWithoutLossOrDuplicates) {
  // Three watches cut cleanly after 4 events, then two cut in the middle of an event.
  AddFaults({{{"verb", "watch"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"cutAfterEvents", 4},
              {"count", 3}},
             {{"verb", "watch"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"cutAfterEvents", 3},
              {"midLine", true},
              {"count", 2}}});
  Informer inf(client_.get(), kConfigMaps, FastInformer(ns_));
  Tally tally;
  inf.AddEventHandler(tally.Handler());
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(seconds(30)));
  constexpr int kN = 30;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(client_->Create(kConfigMaps, ConfigMap("w-" + std::to_string(i))).ok());
  }
  for (int i = 0; i < kN; ++i) {
    auto r = client_->Patch(kConfigMaps, ns_, "w-" + std::to_string(i), {{"data", {{"v", "1"}}}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  for (int i = 0; i < kN; i += 3) {
    ASSERT_TRUE(client_->Delete(kConfigMaps, ns_, "w-" + std::to_string(i)).ok());
  }
  const int expected = kN + kN + kN / 3;
  ASSERT_TRUE(WaitUntil([&] { return tally.Total() >= expected; }, seconds(60)))
      << tally.Total() << " of " << expected << "\n"
      << Log();
  for (int i = 0; i < kN; ++i) {
    auto c = tally.Of("w-" + std::to_string(i));
    EXPECT_EQ(c[0], 1) << "adds of w-" << i;
    EXPECT_EQ(c[1], 1) << "updates of w-" << i;
    EXPECT_EQ(c[2], i % 3 == 0 ? 1 : 0) << "deletes of w-" << i;
    EXPECT_EQ(c[3], 0);
  }
  EXPECT_EQ(inf.store().Size() - (inf.store().Get(ns_, kRootCaConfigMap) ? 1 : 0),
            static_cast<size_t>(kN - kN / 3));
  auto server_side = client_->ListAll(kConfigMaps, ns_, {.limit = 100});
  ASSERT_TRUE(server_side.ok());
  for (const auto& item : server_side->items) {
    auto cached = inf.store().Get(ObjectKey(item));
    ASSERT_TRUE(cached) << ObjectKey(item);
    EXPECT_EQ(ResourceVersionOf(*cached), ResourceVersionOf(item));
  }
  auto stats = inf.ReflectorStatistics();
  EXPECT_EQ(stats.lists, 1);  // resumed every time; never needed to relist
  EXPECT_GE(stats.watches, 6);
  auto watches = RequestsAtLeast(6, "watch");
  ASSERT_GE(watches.size(), 6u);
  for (auto& w : watches) {
    EXPECT_THAT(w["query"].get<std::string>(), HasSubstr("resourceVersion="));
    EXPECT_THAT(w["query"].get<std::string>(), HasSubstr("allowWatchBookmarks=true"));
  }
  inf.Stop();
}

TEST_F(KubeIntegrationTest, RelistAfterGoneReflectsDeletionsMissedInTheGap) {
  for (const char* n : {"keep", "change", "remove"}) {
    ASSERT_TRUE(client_->Create(kConfigMaps, ConfigMap(n)).ok());
  }
  // Every watch fails for now: the informer lists, then keeps backing off.
  AddFaults({{{"verb", "watch"}, {"resource", "configmaps"}, {"namespace", ns_}, {"code", 500}}});
  Informer inf(client_.get(), kConfigMaps, FastInformer(ns_));
  Tally tally;
  inf.AddEventHandler(tally.Handler());
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(seconds(30)));
  ASSERT_TRUE(WaitUntil([&] { return !Requests("watch").empty(); }, seconds(30)));
  // In the gap: a deletion, an update and a creation; then the informer's resourceVersion
  // is gone (410 Expired, as after the server compacted its history: the next watch says
  // so the way a real server does).
  ASSERT_TRUE(client_->Delete(kConfigMaps, ns_, "remove").ok());
  ASSERT_TRUE(client_->Patch(kConfigMaps, ns_, "change", {{"data", {{"v", "9"}}}}).ok());
  ASSERT_TRUE(client_->Create(kConfigMaps, ConfigMap("new")).ok());
  Testing("PUT", "/testing/faults",
          {{"rules",
            {{{"verb", "watch"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"code", 410},
              {"count", 1}}}}});

  ASSERT_TRUE(WaitUntil([&] { return tally.Total() >= 3 + 3; }, seconds(30))) << Log();
  EXPECT_EQ(tally.Of("remove")[3], 1) << "deletion reported as final-state-unknown";
  EXPECT_EQ(tally.Of("change")[1], 1);
  EXPECT_EQ(tally.Of("new")[0], 1);
  EXPECT_EQ(tally.Of("keep")[1], 0);  // unchanged objects stay quiet
  EXPECT_FALSE(inf.store().Get(ns_, "remove"));
  EXPECT_EQ((*inf.store().Get(ns_, "change"))["data"]["v"], "9");
  auto stats = inf.ReflectorStatistics();
  EXPECT_EQ(stats.lists, 2);
  EXPECT_EQ(stats.relists_on_gone, 1);
  EXPECT_THAT(Log(), HasSubstr("Expired"));
  // And the informer carries on watching from the new list.
  ASSERT_TRUE(client_->Delete(kConfigMaps, ns_, "keep").ok());
  EXPECT_TRUE(WaitUntil([&] { return tally.Of("keep")[2] == 1; }, seconds(30)));
  inf.Stop();
}

TEST_F(KubeIntegrationTest, TooManyRequestsHonoursRetryAfter) {
  ASSERT_TRUE(client_->Create(kConfigMaps, ConfigMap("x")).ok());
  AddFaults({{{"verb", "get"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"code", 429},
              {"retryAfter", 1},
              {"count", 2}}});
  auto start = std::chrono::steady_clock::now();
  auto got = client_->Get(kConfigMaps, ns_, "x");
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_GE(took, seconds(2));
  EXPECT_LT(took, seconds(10));
  auto gets = RequestsAtLeast(3, "get");
  ASSERT_EQ(gets.size(), 3u);
  EXPECT_EQ(gets[0]["code"], 429);
  EXPECT_EQ(gets[1]["code"], 429);
  EXPECT_EQ(gets[2]["code"], 200);
  EXPECT_THAT(Log(), HasSubstr("TooManyRequests"));
}

TEST_F(KubeIntegrationTest, ServerErrorStormsAreRetriedWithinBounds) {
  ClientOptions o;
  o.retry.max_attempts = 4;
  o.retry.initial_backoff = milliseconds(20);
  auto client = NewClient(o);
  // A storm that outlasts the retries: exactly max_attempts requests, then the error.
  AddFaults({{{"verb", "list"}, {"resource", "configmaps"}, {"namespace", ns_}, {"code", 500}}});
  auto r = client->List(kConfigMaps, ns_);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("gave up after 4 attempts"));
  EXPECT_EQ(RequestsAtLeast(4, "list").size(), 4u);
  // A shorter storm is ridden out.
  Testing("DELETE", "/testing/faults");
  Testing("DELETE", "/testing/requests");
  AddFaults({{{"verb", "create"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"code", 503},
              {"count", 3}}});
  auto created = client->Create(kConfigMaps, ConfigMap("after-storm"));
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(RequestsAtLeast(4, "create").size(), 4u);
  // A 30 % error rate over many calls: with the default six attempts every call succeeds.
  client = NewClient(ClientOptions{.retry = {.initial_backoff = milliseconds(20)}});
  Testing("DELETE", "/testing/faults");
  AddFaults({{{"verb", "get"},
              {"resource", "configmaps"},
              {"namespace", ns_},
              {"code", 500},
              {"rate", 0.3}}});
  for (int i = 0; i < 20; ++i) {
    auto g = client->Get(kConfigMaps, ns_, "after-storm");
    ASSERT_TRUE(g.ok()) << i << ": " << g.status().ToString();
  }
}

struct Elector {
  Elector(Client* client, const std::string& ns, const std::string& id, bool release,
          std::chrono::seconds lease_duration = seconds(2)) {
    LeaderElectionConfig c;
    c.lease_namespace = ns;
    c.lease_name = "spawnpoint-it";
    c.identity = id;
    c.lease_duration = lease_duration;
    c.renew_deadline = milliseconds(1500);
    c.retry_period = milliseconds(250);
    c.release_on_stop = release;
    c.callbacks.on_started_leading = [this] {
      started = std::chrono::steady_clock::now();
      leading = true;
    };
    c.callbacks.on_stopped_leading = [this] {
      leading = false;
      stopped = std::chrono::steady_clock::now();
      lost = true;
    };
    auto e = LeaderElector::Create(client, c);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    elector = std::move(e).value();
    thread = std::thread([this] { elector->Run(); });
  }
  ~Elector() { Stop(); }
  void Stop() {
    elector->Stop();
    if (thread.joinable()) thread.join();
  }
  std::unique_ptr<LeaderElector> elector;
  std::thread thread;
  std::atomic<bool> leading{false}, lost{false};
  std::chrono::steady_clock::time_point started{}, stopped{};
};

TEST_F(KubeIntegrationTest, TwoElectorsOneLeaderAndFailover) {
  auto client_b = NewClient();
  std::atomic<bool> both{false};
  auto a = std::make_unique<Elector>(client_.get(), ns_, "a", /*release=*/false);
  ASSERT_TRUE(WaitUntil([&] { return a->leading.load(); }, seconds(30)));
  // b holds its lease for 30 s, so that a successor who waited it out instead of taking the
  // released lease at once is told apart by a margin no load can cross.
  auto b = std::make_unique<Elector>(client_b.get(), ns_, "b", /*release=*/true, seconds(30));
  // Watch for two leaders while b campaigns against a healthy leader for a few leases.
  auto end = std::chrono::steady_clock::now() + seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    if (a->elector->IsLeader() && b->elector->IsLeader()) both = true;
    std::this_thread::yield();
  }
  EXPECT_FALSE(both);
  EXPECT_TRUE(a->leading);
  EXPECT_FALSE(b->leading);
  EXPECT_EQ(b->elector->GetLeader(), "a");

  // a stops renewing without releasing (as if it hung): b takes over once the lease, as b
  // observed it, has run out.
  a->Stop();
  auto a_gone = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return b->leading.load(); }, seconds(30)));
  auto failover = b->started - a_gone;
  EXPECT_GE(failover, milliseconds(1500));  // not before the lease could have expired
  EXPECT_LT(failover, seconds(10));
  auto lease = client_->Get(resources::Leases(), ns_, "spawnpoint-it");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(RecordFromLease(*lease).holder_identity, "b");
  EXPECT_GE(RecordFromLease(*lease).lease_transitions, 1);

  // b shuts down cleanly and releases: a new candidate need not wait out the lease.
  b->Stop();
  EXPECT_EQ(
      RecordFromLease(*client_->Get(resources::Leases(), ns_, "spawnpoint-it")).holder_identity,
      "");
  auto c_start = std::chrono::steady_clock::now();
  auto c = std::make_unique<Elector>(client_.get(), ns_, "c", true);
  ASSERT_TRUE(WaitUntil([&] { return c->leading.load(); }, seconds(30)));
  EXPECT_LT(c->started - c_start, seconds(15)) << "c waited out b's 30 s lease";
}

TEST_F(KubeIntegrationTest, LeaderStepsDownWhenRenewalsFail) {
  ClientOptions o;
  o.retry.max_attempts = 1;
  auto client = NewClient(o);
  Elector a(client.get(), ns_, "a", true);
  ASSERT_TRUE(WaitUntil([&] { return a.leading.load(); }, seconds(30)));
  AddFaults({{{"verb", "update"}, {"resource", "leases"}, {"namespace", ns_}, {"code", 500}}});
  auto faulted = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return a.lost.load(); }, seconds(30)));
  auto took = a.stopped - faulted;
  EXPECT_GE(took, milliseconds(1500 - 250));  // the renew deadline after the last renewal
  EXPECT_LT(took, seconds(5));
  EXPECT_FALSE(a.elector->IsLeader());
  EXPECT_THAT(Log(), HasSubstr("leadership lost"));
}

}  // namespace
}  // namespace spawnpoint::kube
