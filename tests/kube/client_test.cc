#include "operator/kube/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/kube/errors.h"
#include "tests/kube/fake_clock.h"
#include "tests/kube/fake_transport.h"

namespace spawnpoint::kube {
namespace {

using testing::AutoAdvanceClock;
using testing::ConnectionRefused;
using ::testing::ElementsAre;
using testing::FakeStreamControl;
using testing::FakeTransport;
using ::testing::HasSubstr;
using testing::JsonResponse;
using ::testing::Not;
using testing::StatusResponse;

constexpr char kSecret[] = "sup3r-s3cret-bearer";

class LogCapture {
 public:
  Logger logger() {
    return [this](LogLevel, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(m);
    };
  }
  std::string All() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (auto& l : lines_) s += l + "\n";
    return s;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> MakeClient(ClientOptions o = {}) {
    RestConfig c;
    c.server = "https://k8s.example:6443";
    c.bearer_token = kSecret;
    o.logger = logs_.logger();
    if (o.qps == ClientOptions{}.qps) o.qps = 0;  // rate limit tested separately
    return std::make_unique<Client>(c, transport_, &clock_, o);
  }
  std::vector<std::string> SleepsMs() {
    std::vector<std::string> out;
    for (auto d : clock_.Sleeps()) {
      out.push_back(
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()));
    }
    return out;
  }

  AutoAdvanceClock clock_;
  std::shared_ptr<FakeTransport> transport_ = std::make_shared<FakeTransport>(&clock_);
  LogCapture logs_;
};

const Json kPod = {{"apiVersion", "v1"},
                   {"kind", "Pod"},
                   {"metadata", {{"name", "p-1"}, {"namespace", "ml"}, {"resourceVersion", "7"}}}};

TEST_F(ClientTest, RequestShapes) {
  ClientOptions o;
  o.field_manager = "spawnpoint";
  auto client = MakeClient(o);
  transport_->SetSendHandler([](const HttpRequest&) { return JsonResponse(200, kPod.dump()); });
  const auto pods = resources::Pods();
  ASSERT_TRUE(client->Get(pods, "ml", "p-1").ok());
  ASSERT_TRUE(client
                  ->List(resources::TrainingJobs(), "",
                         {.label_selector = "app in (a,b),tier!=db",
                          .field_selector = "status.phase=Running",
                          .limit = 50,
                          .continue_token = "abc=",
                          .resource_version = "0"})
                  .status()
                  .code() == StatusCode::kInternal);  // a Pod is not a list
  ASSERT_TRUE(client->Create(pods, kPod).ok());
  ASSERT_TRUE(client->Update(pods, kPod).ok());
  ASSERT_TRUE(client->UpdateStatus(pods, kPod).ok());
  ASSERT_TRUE(client->Patch(pods, "ml", "p-1", {{"metadata", {{"labels", {{"a", "b"}}}}}}).ok());
  ASSERT_TRUE(client->Patch(pods, "ml", "p-1", Json::array(), PatchType::kJsonPatch).ok());
  ASSERT_TRUE(client
                  ->Delete(resources::Namespaces(), "", "ns-1",
                           {.propagation_policy = "Foreground",
                            .grace_period_seconds = 0,
                            .precondition_uid = "u-1",
                            .precondition_resource_version = "9"})
                  .ok());

  auto reqs = transport_->Requests();
  ASSERT_EQ(reqs.size(), 8u);
  auto line = [&](int i) { return reqs[i].request.method + " " + reqs[i].request.target; };
  EXPECT_EQ(line(0), "GET /api/v1/namespaces/ml/pods/p-1");
  EXPECT_EQ(line(1),
            "GET /apis/spawnpoint.dev/v1alpha1/trainingjobs?labelSelector=app%20in%20%28a%2Cb%29"
            "%2Ctier%21%3Ddb&fieldSelector=status.phase%3DRunning&limit=50&continue=abc%3D&"
            "resourceVersion=0");
  EXPECT_EQ(line(2), "POST /api/v1/namespaces/ml/pods?fieldManager=spawnpoint");
  EXPECT_EQ(line(3), "PUT /api/v1/namespaces/ml/pods/p-1?fieldManager=spawnpoint");
  EXPECT_EQ(line(4), "PUT /api/v1/namespaces/ml/pods/p-1/status?fieldManager=spawnpoint");
  EXPECT_EQ(line(5), "PATCH /api/v1/namespaces/ml/pods/p-1?fieldManager=spawnpoint");
  EXPECT_EQ(reqs[5].request.headers["content-type"], "application/merge-patch+json");
  EXPECT_EQ(reqs[6].request.headers["content-type"], "application/json-patch+json");
  EXPECT_EQ(line(7), "DELETE /api/v1/namespaces/ns-1");
  Json del = Json::parse(reqs[7].request.body);
  EXPECT_EQ(del["propagationPolicy"], "Foreground");
  EXPECT_EQ(del["gracePeriodSeconds"], 0);
  EXPECT_EQ(del["preconditions"]["uid"], "u-1");
  EXPECT_EQ(del["preconditions"]["resourceVersion"], "9");
  EXPECT_EQ(Json::parse(reqs[3].request.body)["metadata"]["resourceVersion"], "7");
  for (auto& r : reqs) {
    EXPECT_EQ(r.request.headers["authorization"], std::string("Bearer ") + kSecret);
    EXPECT_EQ(r.request.headers["accept"], "application/json");
    EXPECT_EQ(r.request.headers["user-agent"], "spawnpoint-operator");
  }
}

TEST_F(ClientTest, StaleUpdateIsAConflictAndNotRetried) {
  auto client = MakeClient();
  transport_->Enqueue(StatusResponse(409, "Conflict",
                                     "Operation cannot be fulfilled on pods \"p-1\": the object "
                                     "has been modified; please apply your changes to the latest "
                                     "version and try again"));
  auto r = client->Update(resources::Pods(), kPod);
  EXPECT_TRUE(IsConflict(r.status())) << r.status().ToString();
  EXPECT_EQ(transport_->RequestCount(), 1u);
  transport_->Enqueue(StatusResponse(409, "AlreadyExists", "pods \"p-1\" already exists"));
  EXPECT_TRUE(IsAlreadyExists(client->Create(resources::Pods(), kPod).status()));
}

TEST_F(ClientTest, InvalidIsTerminalWithCauses) {
  auto client = MakeClient();
  auto resp = StatusResponse(422, "Invalid", "TrainingJob \"x\" is invalid");
  Json body = Json::parse(resp.body);
  body["details"]["causes"] = {
      {{"field", "spec.nodes"}, {"reason", "FieldValueInvalid"}, {"message", "must be >= 1"}}};
  resp.body = body.dump();
  transport_->Enqueue(resp);
  auto r = client->Create(resources::TrainingJobs(), kPod);
  EXPECT_TRUE(IsInvalid(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("spec.nodes: must be >= 1"));
  EXPECT_EQ(transport_->RequestCount(), 1u);
}

TEST_F(ClientTest, TooManyRequestsHonoursRetryAfter) {
  auto client = MakeClient();
  transport_->Enqueue(StatusResponse(429, "TooManyRequests", "slow down", 3));
  transport_->Enqueue(StatusResponse(429, "TooManyRequests", "slow down", 1));
  transport_->Enqueue(JsonResponse(200, kPod.dump()));
  auto r = client->Get(resources::Pods(), "ml", "p-1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(SleepsMs(), ElementsAre("3000", "1000"));
  auto reqs = transport_->Requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[1].at - reqs[0].at, std::chrono::seconds(3));
}

TEST_F(ClientTest, RetryAfterBeyondTheBudgetGivesUpAtOnce) {
  auto client = MakeClient();
  transport_->Enqueue(StatusResponse(429, "TooManyRequests", "come back in an hour", 3600));
  auto r = client->Get(resources::Pods(), "ml", "p-1");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("retry budget"));
  EXPECT_TRUE(clock_.Sleeps().empty());
}

TEST_F(ClientTest, ServerErrorStormIsRetriedWithinBounds) {
  auto client = MakeClient();
  transport_->SetSendHandler(
      [](const HttpRequest&) { return StatusResponse(500, "InternalError", "etcd is sad"); });
  auto r = client->Get(resources::Pods(), "ml", "p-1");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("gave up after 6 attempts"));
  EXPECT_EQ(transport_->RequestCount(), 6u);
  EXPECT_THAT(SleepsMs(), ElementsAre("200", "400", "800", "1600", "3200"));

  // The total budget bounds the storm too: 200+400+800 fit in 2 s, 1600 more would not.
  ClientOptions o;
  o.retry.max_total = std::chrono::seconds(2);
  o.retry.max_attempts = 100;
  auto tight = MakeClient(o);
  auto before = transport_->RequestCount();
  r = tight->Get(resources::Pods(), "ml", "p-1");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(transport_->RequestCount() - before, 4u);
}

TEST_F(ClientTest, ServiceUnavailableThenSuccess) {
  auto client = MakeClient();
  transport_->Enqueue(StatusResponse(503, "ServiceUnavailable", "apiserver starting"));
  transport_->Enqueue(StatusResponse(504, "Timeout", "timeout"));
  transport_->Enqueue(JsonResponse(201, kPod.dump()));
  EXPECT_TRUE(client->Create(resources::Pods(), kPod).ok());
  EXPECT_EQ(transport_->RequestCount(), 3u);
}

TEST_F(ClientTest, ConnectionFailuresAreRetriedOnlyWhenSafe) {
  auto client = MakeClient();
  // Refused: the request never left, so even a create is retried.
  transport_->Enqueue(ConnectionRefused());
  transport_->Enqueue(JsonResponse(201, kPod.dump()));
  EXPECT_TRUE(client->Create(resources::Pods(), kPod).ok());
  EXPECT_EQ(transport_->RequestCount(), 2u);

  // Broken after sending: a create might have happened; not retried. A GET is.
  HttpResponse reset;
  reset.error = Unavailable("connection failed: Connection reset by peer");
  reset.request_sent = true;
  transport_->Enqueue(reset);
  auto r = client->Create(resources::Pods(), kPod);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(transport_->RequestCount(), 3u);
  transport_->Enqueue(reset);
  transport_->Enqueue(JsonResponse(200, kPod.dump()));
  EXPECT_TRUE(client->Get(resources::Pods(), "ml", "p-1").ok());
  EXPECT_EQ(transport_->RequestCount(), 5u);
}

TEST_F(ClientTest, UnauthorizedRereadsTheTokenOnce) {
  struct CountingSource : TokenSource {
    StatusOr<std::string> Token() override { return "tok-" + std::to_string(generation); }
    void Invalidate() override { ++generation; }
    int generation = 1;
  };
  auto source = std::make_shared<CountingSource>();
  ClientOptions o;
  o.token_source = source;
  auto client = MakeClient(o);
  transport_->Enqueue(StatusResponse(401, "Unauthorized", "Unauthorized"));
  transport_->Enqueue(JsonResponse(200, kPod.dump()));
  EXPECT_TRUE(client->Get(resources::Pods(), "ml", "p-1").ok());
  auto reqs = transport_->Requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].request.headers["authorization"], "Bearer tok-1");
  EXPECT_EQ(reqs[1].request.headers["authorization"], "Bearer tok-2");

  transport_->Enqueue(StatusResponse(401, "Unauthorized", "Unauthorized"));
  transport_->Enqueue(StatusResponse(401, "Unauthorized", "Unauthorized"));
  auto r = client->Get(resources::Pods(), "ml", "p-1");
  EXPECT_TRUE(IsUnauthenticated(r.status()));
  EXPECT_EQ(transport_->RequestCount(), 4u);
}

TEST_F(ClientTest, ClientSideRateLimit) {
  ClientOptions o;
  o.qps = 10;
  o.burst = 2;
  RestConfig c;
  c.server = "http://x";
  o.logger = NullLogger();
  Client client(c, transport_, &clock_, o);
  transport_->SetSendHandler([](const HttpRequest&) { return JsonResponse(200, kPod.dump()); });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client.Get(resources::Pods(), "ml", "p").ok());
  // Two from the burst, then one every 100 ms.
  EXPECT_THAT(SleepsMs(), ElementsAre("100", "100", "100"));
  auto reqs = transport_->Requests();
  EXPECT_EQ(reqs[4].at - reqs[0].at, std::chrono::milliseconds(300));
}

TEST_F(ClientTest, DeadlineStopsRetries) {
  auto client = MakeClient();
  transport_->SetSendHandler(
      [](const HttpRequest&) { return StatusResponse(503, "ServiceUnavailable", "down"); });
  CallOptions call;
  call.deadline = clock_.Now() + std::chrono::milliseconds(500);
  auto r = client->Get(resources::Pods(), "ml", "p", call);
  EXPECT_FALSE(r.ok());
  // 200 and 400 ms would end at 600 ms: only the first retry fits.
  EXPECT_EQ(transport_->RequestCount(), 2u);
  auto reqs = transport_->Requests();
  EXPECT_LE(reqs[1].request.timeout, std::chrono::milliseconds(300));
}

TEST_F(ClientTest, ListAllFollowsContinueTokens) {
  auto client = MakeClient();
  auto page = [](std::vector<std::string> names, std::string cont, std::string rv) {
    Json items = Json::array();
    for (auto& n : names) items.push_back({{"metadata", {{"name", n}, {"namespace", "ml"}}}});
    return JsonResponse(200, Json{{"kind", "PodList"},
                                  {"metadata", {{"resourceVersion", rv}, {"continue", cont}}},
                                  {"items", items}}
                                 .dump());
  };
  transport_->Enqueue(page({"a", "b"}, "tok1", "100"));
  transport_->Enqueue(page({"c", "d"}, "tok2", "100"));
  transport_->Enqueue(page({"e"}, "", "100"));
  auto all = client->ListAll(resources::Pods(), "ml", {.limit = 2, .resource_version = "0"});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->items.size(), 5u);
  EXPECT_EQ(all->items[4]["metadata"]["name"], "e");
  EXPECT_EQ(all->resource_version, "100");
  auto reqs = transport_->Requests();
  EXPECT_EQ(reqs[0].request.target, "/api/v1/namespaces/ml/pods?limit=2&resourceVersion=0");
  EXPECT_EQ(reqs[1].request.target, "/api/v1/namespaces/ml/pods?limit=2&continue=tok1");
  EXPECT_EQ(reqs[2].request.target, "/api/v1/namespaces/ml/pods?limit=2&continue=tok2");

  // An expired continue token fails the whole list with Gone.
  transport_->Enqueue(page({"a", "b"}, "tok1", "100"));
  transport_->Enqueue(StatusResponse(410, "Expired", "The provided continue parameter is too old"));
  EXPECT_TRUE(IsGone(client->ListAll(resources::Pods(), "ml", {.limit = 2}).status()));
}

// A list whose metadata fields have other types (found by the kube_list fuzz target: the
// client threw nlohmann's type_error, which would end the operator): read as absent.
TEST_F(ClientTest, AListsMetadataOfAnotherTypeReadsAsAbsent) {
  auto client = MakeClient();
  transport_->Enqueue(
      JsonResponse(200, Json{{"kind", "PodList"},
                             {"metadata", {{"resourceVersion", 33}, {"continue", 4}}},
                             {"items", Json::array({{{"metadata", {{"name", "a"}}}}})}}
                            .dump()));
  auto list = client->List(resources::Pods(), "ml", {});
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->items.size(), 1u);
  EXPECT_EQ(list->resource_version, "");
  EXPECT_EQ(list->continue_token, "");
}

TEST_F(ClientTest, WatchParsesEventsAndErrors) {
  auto client = MakeClient();
  auto control = std::make_shared<FakeStreamControl>();
  transport_->SetStreamHandler([&](const HttpRequest&, std::shared_ptr<FakeStreamControl>* c) {
    *c = control;
    return JsonResponse(200, "");
  });
  auto w = client->Watch(resources::Pods(), "ml",
                         {.resource_version = "42", .server_timeout = std::chrono::seconds(300)});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto reqs = transport_->Requests();
  EXPECT_EQ(reqs[0].request.target,
            "/api/v1/namespaces/ml/pods?watch=true&resourceVersion=42&allowWatchBookmarks=true&"
            "timeoutSeconds=300");
  EXPECT_TRUE(reqs[0].stream);
  EXPECT_EQ(reqs[0].request.timeout, std::chrono::minutes(2));

  control->PushLine(
      R"({"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"43"}}})");
  control->PushLine("");
  control->PushLine(R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"50"}}})");
  control->PushLine(
      R"j({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 42 (60)"}})j");
  auto e = (*w)->Next();
  ASSERT_TRUE(e.ok() && e->has_value());
  EXPECT_EQ((*e)->type, WatchEventType::kAdded);
  EXPECT_EQ(ResourceVersionOf((*e)->object), "43");
  e = (*w)->Next();
  ASSERT_TRUE(e.ok() && e->has_value());
  EXPECT_EQ((*e)->type, WatchEventType::kBookmark);
  e = (*w)->Next();
  EXPECT_TRUE(IsGone(e.status())) << e.status().ToString();

  // Half an event (a cut mid-line) is an error, not a silently skipped event.
  auto control2 = std::make_shared<FakeStreamControl>();
  control = control2;
  auto w2 = client->Watch(resources::Pods(), "ml", {});
  ASSERT_TRUE(w2.ok());
  control2->PushLine(R"({"type":"MODIFIED","obj)");
  EXPECT_EQ((*w2)->Next().status().code(), StatusCode::kUnavailable);

  // A clean end.
  auto control3 = std::make_shared<FakeStreamControl>();
  control = control3;
  auto w3 = client->Watch(resources::Pods(), "ml", {});
  control3->End();
  auto end = (*w3)->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());

  transport_->SetStreamHandler([&](const HttpRequest&, std::shared_ptr<FakeStreamControl>*) {
    return StatusResponse(410, "Expired", "too old resource version");
  });
  EXPECT_TRUE(IsGone(client->Watch(resources::Pods(), "ml", {.resource_version = "1"}).status()));
}

TEST_F(ClientTest, SecretsNeverAppearInErrorsOrLogs) {
  ClientOptions o;
  o.retry.max_attempts = 3;
  auto client = MakeClient(o);
  std::vector<Status> errors;
  // The server echoes nothing secret, but every path that formats a message is exercised.
  transport_->Enqueue(StatusResponse(401, "Unauthorized", "Unauthorized"));
  transport_->Enqueue(StatusResponse(401, "Unauthorized", "Unauthorized"));
  errors.push_back(client->Get(resources::Pods(), "ml", "p").status());
  transport_->SetSendHandler(
      [](const HttpRequest&) { return StatusResponse(500, "InternalError", "boom"); });
  errors.push_back(client->Get(resources::Pods(), "ml", "p").status());
  transport_->SetSendHandler([](const HttpRequest&) { return ConnectionRefused(); });
  errors.push_back(client->Create(resources::Pods(), kPod).status());
  transport_->SetSendHandler([](const HttpRequest&) { return JsonResponse(200, "not json"); });
  errors.push_back(client->Get(resources::Pods(), "ml", "p").status());
  transport_->SetStreamHandler([](const HttpRequest&, std::shared_ptr<FakeStreamControl>*) {
    return StatusResponse(403, "Forbidden", "pods is forbidden: User \"system:anonymous\"");
  });
  errors.push_back(client->Watch(resources::Pods(), "ml", {}).status());
  for (const auto& e : errors) {
    EXPECT_FALSE(e.ok());
    EXPECT_THAT(e.ToString(), Not(HasSubstr(kSecret)));
    EXPECT_THAT(e.ToString(), Not(HasSubstr("Bearer")));
  }
  EXPECT_THAT(logs_.All(), HasSubstr("retrying"));
  EXPECT_THAT(logs_.All(), Not(HasSubstr(kSecret)));
}

TEST(ClientPathTest, ResourcePaths) {
  EXPECT_EQ(Client::ResourcePath(resources::Leases(), "kube-system", "op"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/op");
  EXPECT_EQ(Client::ResourcePath(resources::Pods(), "", ""), "/api/v1/pods");
  EXPECT_EQ(Client::ResourcePath(resources::TrainingJobs(), "ml", "j", "status"),
            "/apis/spawnpoint.dev/v1alpha1/namespaces/ml/trainingjobs/j/status");
  EXPECT_EQ(ObjectKey(kPod), "ml/p-1");
  EXPECT_EQ(SplitKey("ml/p-1"), std::make_pair(std::string("ml"), std::string("p-1")));
  EXPECT_EQ(SplitKey("node-1"), std::make_pair(std::string(""), std::string("node-1")));
}

}  // namespace
}  // namespace spawnpoint::kube
