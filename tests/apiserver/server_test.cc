// kube-test-server as a process, over real HTTP: start-up contract, discovery, CRUD status
// codes, watch streams (bookmarks, timeouts, 410), fault injection, the request log,
// simulated nodes and pods run as local processes.
#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/apiserver/test_server.h"

namespace spawnpoint::kubetest::testing {
namespace {

using spawnpoint::testing::ReadFile;
using spawnpoint::testing::WaitUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kCms = "/api/v1/namespaces/default/configmaps";
const std::string kPods = "/api/v1/namespaces/default/pods";

std::string ConfigMap(const std::string& name) {
  return json{{"apiVersion", "v1"},
              {"kind", "ConfigMap"},
              {"metadata", {{"name", name}}},
              {"data", {{"k", "v"}}}}
      .dump();
}

json ParseLine(const std::optional<std::string>& line) {
  if (!line) return json();
  return json::parse(*line, nullptr, false);
}

#define ASSERT_STARTED(server) ASSERT_TRUE((server).ok()) << (server).error()

TEST(ServerTest, PrintsItsAddressWritesAKubeconfigAndStopsOnSigterm) {
  KubeTestServer server;
  ASSERT_STARTED(server);
  std::string kc = ReadFile(server.kubeconfig());
  EXPECT_THAT(kc, HasSubstr("server: " + server.url()));
  EXPECT_THAT(kc, HasSubstr("token: "));
  EXPECT_THAT(kc, HasSubstr("current-context: kube-test-server"));
  EXPECT_EQ(server.Call("GET", "/version").Json()["major"], "1");
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerTest, BadFlagsAreOneLineErrors) {
  spawnpoint::testing::TestProcess p({KUBE_TEST_SERVER_BIN, "--watch-window", "zero"});
  EXPECT_EQ(p.Wait(seconds(10)), 2);
  EXPECT_EQ(p.Stderr(), "kube-test-server: --watch-window: \"zero\" is not a number >= 1\n");
}

TEST(ServerTest, DiscoveryDocuments) {
  KubeTestServer server;
  ASSERT_STARTED(server);
  json core = server.Call("GET", "/api/v1").Json();
  bool pods = false, pod_status = false;
  for (const auto& r : core["resources"]) {
    if (r["name"] == "pods") {
      pods = true;
      EXPECT_EQ(r["shortNames"], json({"po"}));
      EXPECT_EQ(r["namespaced"], true);
    }
    if (r["name"] == "pods/status") pod_status = true;
  }
  EXPECT_TRUE(pods && pod_status);
  json groups = server.Call("GET", "/apis").Json();
  EXPECT_EQ(groups["kind"], "APIGroupList");
  auto aggregated = HttpCall(server.port(), "GET", "/apis", "",
                             {{"Accept",
                               "application/json;g=apidiscovery.k8s.io;v=v2;as="
                               "APIGroupDiscoveryList,application/json"}});
  EXPECT_EQ(aggregated.headers["content-type"],
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
  EXPECT_EQ(aggregated.Json()["kind"], "APIGroupDiscoveryList");
  json openapi = server.Call("GET", "/openapi/v3").Json();
  EXPECT_TRUE(openapi["paths"].contains("apis/coordination.k8s.io/v1"));
}

TEST(ServerTest, CrudStatusCodesAndBodies) {
  KubeTestServer server;
  ASSERT_STARTED(server);
  auto missing = server.Call("GET", kCms + "/nope");
  EXPECT_EQ(missing.code, 404);
  json status = missing.Json();
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["reason"], "NotFound");
  EXPECT_EQ(status["message"], "configmaps \"nope\" not found");
  EXPECT_EQ(status["details"], json({{"name", "nope"}, {"kind", "configmaps"}}));

  auto created = server.Call("POST", kCms, ConfigMap("a"));
  ASSERT_EQ(created.code, 201) << created.body;
  EXPECT_EQ(server.Call("POST", kCms, ConfigMap("a")).code, 409);
  json obj = created.Json();
  obj["data"]["k"] = "v2";
  EXPECT_EQ(server.Call("PUT", kCms + "/a", obj.dump()).code, 200);
  obj["data"]["k"] = "v3";
  auto stale = server.Call("PUT", kCms + "/a", obj.dump());
  EXPECT_EQ(stale.code, 409);
  EXPECT_EQ(stale.Json()["reason"], "Conflict");
  auto patched =
      server.Call("PATCH", kCms + "/a", R"({"data":{"x":"1"}})", "application/merge-patch+json");
  EXPECT_EQ(patched.code, 200);
  EXPECT_EQ(patched.Json()["data"], json({{"k", "v2"}, {"x", "1"}}));
  auto json_patched = server.Call("PATCH", kCms + "/a", R"([{"op":"remove","path":"/data/x"}])",
                                  "application/json-patch+json");
  EXPECT_EQ(json_patched.Json()["data"], json({{"k", "v2"}}));
  EXPECT_EQ(server.Call("PATCH", kCms + "/a", "{}", "text/plain").code, 415);
  auto list = server.Call("GET", kCms + "?labelSelector=" + std::string("app%3Dnone"));
  EXPECT_EQ(list.Json()["items"].size(), 0u);
  EXPECT_EQ(server.Call("DELETE", kCms + "/a").code, 200);
  EXPECT_EQ(server.Call("GET", kCms + "/a").code, 404);
  EXPECT_EQ(server.Call("GET", "/api/v1/namespaces/default/widgets").code, 404);
}

TEST(ServerTest, WatchStreamsEventsBookmarksAndEndsAtItsTimeout) {
  KubeTestServer server({"--bookmark-interval-ms", "100"});
  ASSERT_STARTED(server);
  std::string rv = server.Call("GET", kCms).Json()["metadata"]["resourceVersion"];
  HttpStream watch(
      server.port(),
      kCms + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=2&resourceVersion=" + rv);
  ASSERT_EQ(watch.WaitHead(seconds(5)), 200);
  ASSERT_EQ(server.Call("POST", kCms, ConfigMap("w")).code, 201);
  json added = ParseLine(watch.NextLine(seconds(5)));
  EXPECT_EQ(added["type"], "ADDED");
  EXPECT_EQ(added["object"]["metadata"]["name"], "w");
  json log = server.Requests()["requests"];
  EXPECT_TRUE(std::any_of(log.begin(), log.end(), [](const json& r) {
    return r["verb"] == "watch";
  })) << "a watch is in the request log while it streams";
  json bookmark = ParseLine(watch.NextLine(seconds(5)));
  EXPECT_EQ(bookmark["type"], "BOOKMARK");
  EXPECT_EQ(bookmark["object"]["metadata"]["resourceVersion"],
            added["object"]["metadata"]["resourceVersion"]);
  while (watch.NextLine(seconds(5))) {
  }
  EXPECT_TRUE(watch.ended_cleanly()) << "timeoutSeconds ends the stream with the last chunk";
}

TEST(ServerTest, WatchFromBeforeTheWindowGetsAnExpiredErrorEvent) {
  KubeTestServer server({"--watch-window", "3"});
  ASSERT_STARTED(server);
  std::string old = server.Call("GET", kCms).Json()["metadata"]["resourceVersion"];
  for (int i = 0; i < 5; ++i) server.Call("POST", kCms, ConfigMap("c" + std::to_string(i)));
  HttpStream watch(server.port(), kCms + "?watch=true&resourceVersion=" + old);
  ASSERT_EQ(watch.WaitHead(seconds(5)), 200);
  json error = ParseLine(watch.NextLine(seconds(5)));
  EXPECT_EQ(error["type"], "ERROR");
  EXPECT_EQ(error["object"]["code"], 410);
  EXPECT_EQ(error["object"]["reason"], "Expired");
  EXPECT_FALSE(watch.NextLine(seconds(5)).has_value());
  EXPECT_TRUE(watch.ended_cleanly());
}

TEST(ServerTest, TooManyRequestsForACountWithRetryAfterAndALoggedFault) {
  KubeTestServer server;
  ASSERT_STARTED(server);
  auto added = server.AddFaults(R"({"rules":[{"verb":"list","resource":"configmaps",
                                   "code":429,"retryAfter":2,"count":2}]})");
  ASSERT_EQ(added.code, 200) << added.body;
  for (int i = 0; i < 2; ++i) {
    auto r = server.Call("GET", kCms);
    EXPECT_EQ(r.code, 429);
    EXPECT_EQ(r.headers["retry-after"], "2");
    EXPECT_EQ(r.Json()["reason"], "TooManyRequests");
    EXPECT_EQ(r.Json()["details"]["retryAfterSeconds"], 2);
  }
  EXPECT_EQ(server.Call("GET", kCms).code, 200) << "the count is used up";
  EXPECT_EQ(server.Call("GET", "/api/v1/namespaces/default/pods").code, 200);
  json log = server.Requests()["requests"];
  std::vector<int> codes;
  for (const auto& r : log) {
    if (r.value("resource", "") == "configmaps") codes.push_back(r["code"]);
  }
  EXPECT_EQ(codes, std::vector<int>({429, 429, 200}));
  EXPECT_EQ(log[0]["verb"], "list");
  EXPECT_EQ(log[0]["fault"], "code=429");
  EXPECT_EQ(server.Call("GET", "/testing/faults").Json()["rules"][0]["fired"], 2);
  EXPECT_EQ(server.AddFaults(R"({"rules":[{"verb":"list"}]})").code, 400)
      << "a rule that does nothing";
}

TEST(ServerTest, CommandLineFaultsWithARateAndLatency) {
  KubeTestServer server({"--faults",
                         "verb=create,resource=configmaps,code=500,rate=0.5;"
                         "verb=get,resource=configmaps,latencyMs=300"});
  ASSERT_STARTED(server);
  int failed = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = server.Call("POST", kCms, ConfigMap("r" + std::to_string(i)));
    if (r.code == 500) {
      ++failed;
      EXPECT_EQ(r.Json()["reason"], "InternalError");
    } else {
      EXPECT_EQ(r.code, 201);
    }
  }
  EXPECT_GT(failed, 5);
  EXPECT_LT(failed, 35);
  auto start = std::chrono::steady_clock::now();
  server.Call("GET", kCms + "/r0");
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
}

TEST(ServerTest, WatchStreamsCanBeCutAfterEventsOrMidLine) {
  KubeTestServer server;
  ASSERT_STARTED(server);
  for (int i = 0; i < 4; ++i) server.Call("POST", kCms, ConfigMap("c" + std::to_string(i)));
  server.AddFaults("verb=watch,resource=configmaps,cutAfterEvents=2,count=1");
  HttpStream cut(server.port(), kCms + "?watch=1");
  ASSERT_EQ(cut.WaitHead(seconds(5)), 200);
  EXPECT_TRUE(cut.NextLine(seconds(5)).has_value());
  EXPECT_TRUE(cut.NextLine(seconds(5)).has_value());
  EXPECT_FALSE(cut.NextLine(seconds(5)).has_value());
  EXPECT_TRUE(cut.cut());
  EXPECT_FALSE(cut.ended_cleanly());

  server.AddFaults("verb=watch,resource=configmaps,cutAfterEvents=1,midLine=true,count=1");
  HttpStream mid(server.port(), kCms + "?watch=1");
  ASSERT_EQ(mid.WaitHead(seconds(5)), 200);
  json first = ParseLine(mid.NextLine(seconds(5)));
  EXPECT_EQ(first["type"], "ADDED");
  EXPECT_FALSE(mid.NextLine(seconds(5)).has_value());
  EXPECT_TRUE(mid.cut());
  EXPECT_THAT(mid.partial_line(), HasSubstr("{\"object\""));
  EXPECT_TRUE(json::parse(mid.partial_line(), nullptr, false).is_discarded());

  HttpStream whole(server.port(), kCms + "?watch=1&timeoutSeconds=1");
  int lines = 0;
  while (whole.NextLine(seconds(5))) ++lines;
  EXPECT_EQ(lines, 4) << "the rules were used up";
  EXPECT_TRUE(whole.ended_cleanly());
}

json WaitForPod(KubeTestServer& server, const std::string& name,
                const std::function<bool(const json&)>& condition) {
  json pod;
  WaitUntil(
      [&] {
        pod = server.Call("GET", kPods + "/" + name).Json();
        return condition(pod);
      },
      seconds(15));
  return pod;
}

std::string PodPhase(const json& pod) {
  return pod.value("status", json::object()).value("phase", "");
}

TEST(ServerTest, SimulatedNodesRunPodsAndAcceptKubeletStatus) {
  KubeTestServer server({"--simulate-nodes", "2"});
  ASSERT_STARTED(server);
  EXPECT_EQ(server.Call("GET", "/api/v1/nodes").Json()["items"].size(), 2u);
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "p"}}},
      {"spec",
       {{"restartPolicy", "Never"}, {"containers", {{{"name", "trainer"}, {"image", "x"}}}}}}};
  ASSERT_EQ(server.Call("POST", kPods, pod.dump()).code, 201);
  json running = WaitForPod(server, "p", [](const json& p) { return PodPhase(p) == "Running"; });
  ASSERT_EQ(PodPhase(running), "Running");
  EXPECT_THAT(running["spec"]["nodeName"].get<std::string>(), ::testing::StartsWith("node-"));
  EXPECT_FALSE(running["status"]["podIP"].get<std::string>().empty());
  EXPECT_TRUE(running["status"]["containerStatuses"][0]["state"].contains("running"));
  auto on_node = server.Call("GET", kPods + "?fieldSelector=spec.nodeName%3D" +
                                        running["spec"]["nodeName"].get<std::string>() +
                                        ",status.phase%3DRunning");
  EXPECT_EQ(on_node.Json()["items"].size(), 1u);

  json kubelet = {
      {"status",
       {{"phase", "Failed"},
        {"containerStatuses",
         {{{"name", "trainer"},
           {"ready", false},
           {"restartCount", 0},
           {"image", "x"},
           {"imageID", ""},
           {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}}}};
  auto patched = server.Call("PATCH", kPods + "/p/status", kubelet.dump(),
                             "application/strategic-merge-patch+json");
  ASSERT_EQ(patched.code, 200) << patched.body;
  json done = server.Call("GET", kPods + "/p").Json();
  EXPECT_EQ(PodPhase(done), "Failed");
  EXPECT_EQ(done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
  EXPECT_EQ(server.Call("DELETE", kPods + "/p").code, 200);
  EXPECT_EQ(server.Call("GET", kPods + "/p").code, 404);
}

json CommandPod(const std::string& name, const std::string& script,
                json extra_env = json::array()) {
  json env = json::array(
      {{{"name", "MY_NS"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}},
       {{"name", "GREETING"}, {"value", "hello-$(MY_NS)"}}});
  for (const auto& e : extra_env) env.push_back(e);
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"restartPolicy", "Never"},
            {"terminationGracePeriodSeconds", 5},
            {"containers",
             {{{"name", "trainer"},
               {"image", "ignored"},
               {"command", {"/bin/sh", "-c"}},
               {"args", {script}},
               {"workingDir", "."},
               {"env", env}}}}}}};
}

// Running or sleeping, not gone and not a zombie waiting for whoever adopted it.
bool Alive(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

pid_t ContainerPid(const json& pod) {
  std::string id = pod["status"]["containerStatuses"][0].value("containerID", "");
  return id.rfind("local://", 0) == 0 ? std::atoi(id.c_str() + 8) : -1;
}

TEST(ServerTest, RunPodsRunsTheCommandAndReportsItsExit) {
  KubeTestServer server({"--run-pods"});
  ASSERT_STARTED(server);
  std::string script =
      "echo \"$HOSTNAME $MY_NS $GREETING\"; pwd; echo 'rank 3 died' > /dev/termination-log; "
      "exit 3";
  ASSERT_EQ(server.Call("POST", kPods, CommandPod("job-0", script).dump()).code, 201);
  json pod = WaitForPod(server, "job-0", [](const json& p) { return PodPhase(p) == "Failed"; });
  ASSERT_EQ(PodPhase(pod), "Failed") << pod.dump();
  json term = pod["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(term["exitCode"], 3);
  EXPECT_EQ(term["reason"], "Error");
  EXPECT_EQ(term["message"], "rank 3 died\n");
  EXPECT_EQ(pod["status"]["podIP"], "127.0.0.1");
  auto logs = server.Call("GET", kPods + "/job-0/log");
  EXPECT_EQ(logs.code, 200);
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(logs.body, "job-0 default hello-default\n" + std::string(cwd) + "\n");

  ASSERT_EQ(server.Call("POST", kPods, CommandPod("ok", "exit 0").dump()).code, 201);
  json ok = WaitForPod(server, "ok", [](const json& p) { return PodPhase(p) == "Succeeded"; });
  EXPECT_EQ(ok["status"]["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
}

TEST(ServerTest, RunPodsDeletingARunningPodStopsItsProcess) {
  KubeTestServer server({"--run-pods"});
  ASSERT_STARTED(server);
  // The trap makes the shell exit on SIGTERM only after it has reported it.
  std::string script = "trap 'echo got-term; exit 143' TERM; while :; do sleep 0.05; done";
  ASSERT_EQ(server.Call("POST", kPods, CommandPod("long", script).dump()).code, 201);
  json running = WaitForPod(server, "long", [](const json& p) { return PodPhase(p) == "Running"; });
  pid_t pid = ContainerPid(running);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(Alive(pid));
  auto del = server.Call("DELETE", kPods + "/long");
  EXPECT_EQ(del.code, 202) << "the pod waits for its process";
  EXPECT_TRUE(
      WaitUntil([&] { return server.Call("GET", kPods + "/long").code == 404; }, seconds(10)));
  EXPECT_FALSE(Alive(pid));
}

TEST(ServerTest, RunPodsProcessesDieWithTheServer) {
  KubeTestServer server({"--run-pods"});
  ASSERT_STARTED(server);
  ASSERT_EQ(server.Call("POST", kPods, CommandPod("orphan", "exec sleep 600").dump()).code, 201);
  json running =
      WaitForPod(server, "orphan", [](const json& p) { return PodPhase(p) == "Running"; });
  pid_t pid = ContainerPid(running);
  ASSERT_GT(pid, 0);
  kill(server.pid(), SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return !Alive(pid); }, seconds(10)))
      << "PR_SET_PDEATHSIG takes the pod's process with the server";
}

}  // namespace
}  // namespace spawnpoint::kubetest::testing
