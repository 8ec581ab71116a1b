// The desired Service and pods of a job: pure functions of the job and the settings.
#include "operator/reconciler/children.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "common/env_parts.h"
#include "operator/common/names.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

json Owner() {
  return {{"metadata", {{"name", "job"}, {"namespace", "default"}, {"uid", "uid-1"}}}};
}

api::TrainingJob Parse(const json& object) {
  auto job = api::TrainingJobFromJson(object);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  return *job;
}

json EnvOf(const json& container, const std::string& name) {
  for (const auto& e : container["env"]) {
    if (e["name"] == name) return e;
  }
  return json();
}

std::vector<std::string> Names(const json& list) {
  std::vector<std::string> out;
  for (const auto& e : list) out.push_back(e.value("name", ""));
  return out;
}

TEST(EnvPartsTest, AValueTooLongForOneVariableGoesInPartsAndComesBackWhole) {
  using Vars = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(SplitEnvValue("J", "abc", 3), (Vars{{"J", "abc"}}));
  EXPECT_EQ(SplitEnvValue("J", "abcdefg", 3),
            (Vars{{"J_PARTS", "3"}, {"J_0", "abc"}, {"J_1", "def"}, {"J_2", "g"}}));
  std::map<std::string, std::string> env;
  auto get = [&env](const std::string& var) -> std::optional<std::string> {
    auto it = env.find(var);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  EXPECT_FALSE(JoinEnvValue("J", get)->has_value()) << "neither set";
  const std::string big(250 * 1024, 'x');
  for (const auto& [var, value] : SplitEnvValue("J", big)) env[var] = value;
  EXPECT_EQ(env["J_PARTS"], "3");
  EXPECT_EQ(**JoinEnvValue("J", get), big);
  env.erase("J_1");
  EXPECT_EQ(JoinEnvValue("J", get).status().message(), "J_1: not set, though J_PARTS is 3");
  env["J_PARTS"] = "three";
  EXPECT_EQ(JoinEnvValue("J", get).status().message(),
            "J_PARTS: must be a count of parts (1 or more), got \"three\"");
}

// Issue 41: a template of 30 variables of 10 KB is valid and runs as a process, but the whole
// job in one variable (300 KB) stopped every pod with E2BIG. In parts, none over 100 KiB.
TEST(ChildrenTest, ABigJobReachesTheAgentInPartsNoneTooLongForExec) {
  json object = testing::MakeJob("job", 2);
  json& env = object["spec"]["template"]["spec"]["containers"][0]["env"];
  for (int i = 0; i < 30; ++i) {
    env.push_back({{"name", "BIG_" + std::to_string(i)}, {"value", std::string(10'000, 'v')}});
  }
  api::TrainingJob job = Parse(object);
  json pod = BuildPod(job, Owner(), 0, 0, PodSettings{});
  const json& trainer = pod["spec"]["containers"][0];
  EXPECT_TRUE(EnvOf(trainer, kJobEnv).is_null()) << "not in one variable";
  std::map<std::string, std::string> vars;
  for (const auto& e : trainer["env"]) {
    if (e.contains("value")) vars[e["name"]] = e["value"];
  }
  ASSERT_TRUE(vars.count(std::string(kJobEnv) + "_PARTS"));
  for (const auto& [name, value] : vars) EXPECT_LE(value.size(), kEnvPartMax) << name;
  auto get = [&vars](const std::string& var) -> std::optional<std::string> {
    auto it = vars.find(var);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  StatusOr<std::optional<std::string>> joined = JoinEnvValue(kJobEnv, get);
  ASSERT_TRUE(joined.ok() && joined->has_value());
  EXPECT_EQ(json::parse(**joined), JobForAgent(job));
  // A small job keeps its one variable.
  json small = BuildPod(Parse(testing::MakeJob("job", 2)), Owner(), 0, 0, PodSettings{});
  EXPECT_FALSE(EnvOf(small["spec"]["containers"][0], kJobEnv).is_null());
}

TEST(ChildrenTest, ServiceIsHeadlessAndPublishesNotReadyAddresses) {
  json object = testing::MakeJob("job");
  object["spec"]["rendezvous"]["port"] = 29777;
  json svc = BuildService(Parse(object), Owner());
  EXPECT_EQ(svc["metadata"]["name"], "job");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(svc["spec"]["selector"][kJobNameLabel], "job");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 29777);
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["controller"], true);
}

// restartPolicy.mode InPlace with several nodes: the agents form a gang on node 0's address,
// with the job's budget and the token of the job's Secret, mounted read-only.
TEST(ChildrenTest, InPlacePodsJoinTheGangWithTheJobsTokenAndBudget) {
  json object = testing::MakeJob("job", 2, /*max_restarts=*/5, 1, "InPlace");
  const api::TrainingJob job = Parse(object);
  ASSERT_TRUE(RestartsInPlace(job));
  PodSettings settings;
  settings.gang_port = 29444;
  json pod = BuildPod(job, Owner(), 1, /*attempt=*/2, settings);
  const json& spec = pod["spec"];
  const json& c = spec["containers"][0];
  EXPECT_THAT(
      c["command"].get<std::vector<std::string>>(),
      ElementsAre("/spawnpoint/bin/spawnpoint-agent", "run", "--job-env", kJobEnv, "--node-rank",
                  "1", "--nnodes", "2", "--master-addr", "job-node-0.job", "--master-port", "29500",
                  "--gang", "job-node-0.job:29444", "--gang-token-file",
                  "/var/run/spawnpoint/tokens/gang", "--max-restarts", "5", "--restart-count", "2",
                  "--termination-log", "/dev/termination-log", "--metrics-addr", ":9400"));
  EXPECT_EQ(pod["metadata"]["labels"][kAttemptLabel], "2");
  EXPECT_THAT(Names(spec["volumes"]), ElementsAre(kShmVolume, kAgentVolume, kTokensVolume));
  EXPECT_EQ(spec["volumes"][2]["secret"]["secretName"], "job-tokens-uid-1");
  EXPECT_THAT(Names(c["volumeMounts"]), ElementsAre(kShmVolume, kAgentVolume, kTokensVolume));
  EXPECT_EQ(c["volumeMounts"][2]["mountPath"], "/var/run/spawnpoint/tokens");
  EXPECT_EQ(c["volumeMounts"][2]["readOnly"], true);
  EXPECT_THAT(Names(c["ports"]), ElementsAre("rendezvous", "agent-status", "gang"));
  EXPECT_EQ(c["ports"][2]["containerPort"], 29444);
  // The master address override is the gang's address too.
  settings.master_addr = "127.0.0.1";
  json local = BuildPod(job, Owner(), 0, 0, settings);
  EXPECT_EQ(local["spec"]["containers"][0]["command"][13], "127.0.0.1:29444");

  json secret = BuildJobSecret(job, Owner(), "abc", "");
  EXPECT_EQ(secret["metadata"]["name"], "job-tokens-uid-1");
  EXPECT_EQ(secret["stringData"], json({{"gang", "abc"}}));
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(secret["metadata"]["labels"][kJobNameLabel], "job");
}

// With status tokens, every job's pods mount the job's Secret and the agent is told where its
// status token is; without, a job that does not restart in place mounts nothing of it. The
// Secret holds the status token (and the gang token only in place).
TEST(ChildrenTest, WithStatusTokensTheAgentReadsTheJobsTokenFromItsSecret) {
  json object = testing::MakeJob("job", 2, /*max_restarts=*/5, 1);
  const api::TrainingJob job = Parse(object);
  ASSERT_FALSE(RestartsInPlace(job));
  PodSettings settings;
  json plain = BuildPod(job, Owner(), 0, 0, settings);
  EXPECT_THAT(Names(plain["spec"]["volumes"]), ElementsAre(kShmVolume, kAgentVolume));
  EXPECT_THAT(plain["spec"]["containers"][0]["command"].get<std::vector<std::string>>(),
              Not(Contains("--status-token-file")));

  settings.status_token = true;
  json pod = BuildPod(job, Owner(), 1, 0, settings);
  const json& spec = pod["spec"];
  const json& c = spec["containers"][0];
  EXPECT_THAT(Names(spec["volumes"]), ElementsAre(kShmVolume, kAgentVolume, kTokensVolume));
  EXPECT_EQ(spec["volumes"][2]["secret"]["secretName"], "job-tokens-uid-1");
  EXPECT_EQ(c["volumeMounts"][2]["mountPath"], "/var/run/spawnpoint/tokens");
  EXPECT_EQ(c["volumeMounts"][2]["readOnly"], true);
  const auto command = c["command"].get<std::vector<std::string>>();
  auto flag = std::find(command.begin(), command.end(), "--status-token-file");
  ASSERT_NE(flag, command.end());
  ASSERT_NE(flag + 1, command.end());
  EXPECT_EQ(*(flag + 1), "/var/run/spawnpoint/tokens/status");
  // Never in the environment, which the ranks inherit and a trainer may print.
  for (const auto& e : c["env"]) EXPECT_EQ(e.dump().find("tokens"), std::string::npos) << e;

  json secret = BuildJobSecret(job, Owner(), "", "s3cret");
  EXPECT_EQ(secret["stringData"], json({{"status", "s3cret"}}));
}

// Unless the operator pins one, a job's gang port is next to its rendezvous port: two jobs
// whose pods share a network (hostNetwork, the local node) do not meet on one gang port.
TEST(ChildrenTest, TheGangPortFollowsTheJobsRendezvousPort) {
  json object = testing::MakeJob("job", 2, /*max_restarts=*/5, 1, "InPlace");
  for (const auto& [rendezvous, gang] :
       std::vector<std::pair<int, int>>{{29500, 29501}, {40000, 40001}, {65535, 65534}}) {
    object["spec"]["rendezvous"]["port"] = rendezvous;
    json pod = BuildPod(Parse(object), Owner(), 0, 0, PodSettings{});
    const json& c = pod["spec"]["containers"][0];
    EXPECT_EQ(c["command"][13], "job-node-0.job:" + std::to_string(gang)) << rendezvous;
    EXPECT_EQ(c["ports"][0]["containerPort"], rendezvous);
    EXPECT_EQ(c["ports"][2]["containerPort"], gang);
  }
}

// Recreate, and a single node whatever the mode: the operator restarts; no gang, no Secret.
TEST(ChildrenTest, RecreateAndSingleNodePodsLeaveRestartsToTheOperator) {
  for (const auto& [nodes, mode] :
       std::vector<std::pair<int, std::string>>{{2, "Recreate"}, {1, "InPlace"}}) {
    SCOPED_TRACE(mode);
    const api::TrainingJob job = Parse(testing::MakeJob("job", nodes, 5, 1, mode));
    EXPECT_FALSE(RestartsInPlace(job));
    json pod = BuildPod(job, Owner(), 0, 0, PodSettings{});
    const auto command = pod["spec"]["containers"][0]["command"].get<std::vector<std::string>>();
    EXPECT_THAT(command, ::testing::Not(::testing::Contains("--gang")));
    EXPECT_THAT(command, ::testing::Contains("--max-restarts"));
    EXPECT_EQ(*(std::find(command.begin(), command.end(), "--max-restarts") + 1), "0");
    EXPECT_THAT(Names(pod["spec"]["volumes"]), ElementsAre(kShmVolume, kAgentVolume));
  }
}

TEST(ChildrenTest, GangTokensAreRandomHex) {
  StatusOr<std::string> a = NewGangToken(), b = NewGangToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

TEST(ChildrenTest, PodRunsTheAgentWithTheRendezvousOfItsNode) {
  json object = testing::MakeJob("job", 3);
  object["spec"]["gpusPerNode"] = 4;
  object["spec"]["gpuResource"] = "amd.com/gpu";
  object["spec"]["template"]["metadata"] = {{"labels", {{"team", "ml"}}},
                                            {"annotations", {{"note", "x"}}}};
  json& trainer = object["spec"]["template"]["spec"]["containers"][0];
  trainer["env"] = {{{"name", "NCCL_DEBUG"}, {"value", "INFO"}},
                    {{"name", "WORLD_SIZE"}, {"value", "99"}}};
  trainer["volumeMounts"] = {{{"name", "data"}, {"mountPath", "/data"}},
                             {{"name", "small-shm"}, {"mountPath", "/dev/shm"}}};
  trainer["resources"] = {{"limits", {{"memory", "64Gi"}}}};
  PodSettings settings;
  settings.agent_image = "registry/agent:2";
  json pod = BuildPod(Parse(object), Owner(), 2, 1, settings);

  EXPECT_EQ(pod["metadata"]["name"], "job-node-2");
  EXPECT_EQ(pod["metadata"]["labels"][kJobNameLabel], "job");
  EXPECT_EQ(pod["metadata"]["labels"][kNodeRankLabel], "2");
  EXPECT_EQ(pod["metadata"]["labels"][kAttemptLabel], "1");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "ml");
  EXPECT_EQ(pod["metadata"]["annotations"]["note"], "x");
  const json& spec = pod["spec"];
  EXPECT_EQ(spec["restartPolicy"], "Never");
  EXPECT_EQ(spec["hostname"], "job-node-2");
  EXPECT_EQ(spec["subdomain"], "job");
  EXPECT_EQ(spec["initContainers"][0]["image"], "registry/agent:2");
  EXPECT_THAT(spec["initContainers"][0]["command"].get<std::vector<std::string>>(),
              ElementsAre("cp", "-R", "/opt/spawnpoint/.", "/spawnpoint/"));
  const json& install = spec["initContainers"][0];
  EXPECT_EQ(install["securityContext"]["runAsNonRoot"], true) << "Pod Security restricted";
  EXPECT_EQ(install["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(install["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(install["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(install["resources"]["limits"]["memory"], "64Mi") << "fits a ResourceQuota";
  EXPECT_THAT(Names(spec["volumes"]), ElementsAre(kShmVolume, kAgentVolume));
  EXPECT_EQ(spec["volumes"][0]["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(spec["volumes"][0]["emptyDir"]["sizeLimit"], "1Gi");

  const json& c = spec["containers"][0];
  EXPECT_THAT(c["command"].get<std::vector<std::string>>(),
              ElementsAre("/spawnpoint/bin/spawnpoint-agent", "run", "--job-env", kJobEnv,
                          "--node-rank", "2", "--nnodes", "3", "--master-addr", "job-node-0.job",
                          "--master-port", "29500", "--max-restarts", "0", "--restart-count", "1",
                          "--termination-log", "/dev/termination-log", "--metrics-addr", ":9400"));
  EXPECT_FALSE(c.contains("args"));
  EXPECT_EQ(c["resources"]["limits"]["amd.com/gpu"], "4");
  EXPECT_EQ(c["resources"]["requests"]["amd.com/gpu"], "4");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "64Gi");
  EXPECT_EQ(EnvOf(c, "NCCL_DEBUG")["value"], "INFO");
  EXPECT_EQ(EnvOf(c, "WORLD_SIZE")["value"], "12") << "the operator owns the rendezvous variables";
  EXPECT_EQ(EnvOf(c, "MASTER_ADDR")["value"], "job-node-0.job");
  EXPECT_EQ(EnvOf(c, "NODE_RANK")["value"], "2");
  EXPECT_EQ(EnvOf(c, "GROUP_RANK")["value"], "2");
  EXPECT_EQ(EnvOf(c, "LOCAL_WORLD_SIZE")["value"], "4");
  EXPECT_EQ(EnvOf(c, "TORCHELASTIC_RESTART_COUNT")["value"], "1");
  EXPECT_EQ(EnvOf(c, "TORCHELASTIC_RUN_ID")["value"], "uid-1");
  EXPECT_EQ(EnvOf(c, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
  std::vector<std::string> mounts;
  for (const auto& m : c["volumeMounts"]) mounts.push_back(m["mountPath"]);
  EXPECT_THAT(mounts, ElementsAre("/data", "/dev/shm", "/spawnpoint"));
  EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError");
}

TEST(ChildrenTest, AgentInTheImageAndMasterAddressOverrides) {
  json object = testing::MakeJob("job");
  PodSettings settings;
  settings.agent_path = "/usr/local/bin/spawnpoint-agent";
  settings.master_addr = "127.0.0.1";
  json pod = BuildPod(Parse(object), Owner(), 0, 0, settings);
  EXPECT_FALSE(pod["spec"].contains("initContainers"));
  EXPECT_THAT(Names(pod["spec"]["volumes"]), ElementsAre(kShmVolume));
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["command"][0], "/usr/local/bin/spawnpoint-agent");
  EXPECT_EQ(EnvOf(c, "MASTER_ADDR")["value"], "127.0.0.1");
  EXPECT_FALSE(c["resources"].is_object() && c["resources"].contains("limits"));

  // The job's annotations win over the operator's settings.
  object["metadata"]["annotations"] = {{kAgentPathAnnotation, "/opt/agent"},
                                       {kMasterAddrAnnotation, "10.0.0.7"}};
  json annotated = BuildPod(Parse(object), Owner(), 0, 0, PodSettings{});
  EXPECT_FALSE(annotated["spec"].contains("initContainers"));
  EXPECT_EQ(annotated["spec"]["containers"][0]["command"][0], "/opt/agent");
  EXPECT_EQ(annotated["spec"]["containers"][0]["command"][9], "10.0.0.7");
}

TEST(ChildrenTest, TheTrainerContainerIsTheOneNamedTrainer) {
  json object = testing::MakeJob("job");
  json sidecar = {{"name", "logger"}, {"image", "fluent"}, {"command", {"fluent-bit"}}};
  auto& containers = object["spec"]["template"]["spec"]["containers"];
  containers.insert(containers.begin(), sidecar);
  json pod = BuildPod(Parse(object), Owner(), 0, 0, PodSettings{});
  EXPECT_EQ(pod["spec"]["containers"][0]["command"][0], "fluent-bit");
  EXPECT_EQ(pod["spec"]["containers"][1]["command"][1], "run");
}

TEST(ChildrenTest, TheAgentReadsBackTheJobItIsGiven) {
  json object = testing::MakeJob("job");
  object["metadata"]["uid"] = "uid-1";
  object["metadata"]["managedFields"] = json::array({{{"manager", "kubectl"}}});
  object["status"] = {{"phase", "Running"}};
  api::TrainingJob job = Parse(object);
  json pod = BuildPod(job, Owner(), 0, 0, PodSettings{});
  std::string text = EnvOf(pod["spec"]["containers"][0], kJobEnv)["value"];
  EXPECT_THAT(text, ::testing::Not(HasSubstr("managedFields")));
  auto parsed = api::ParseTrainingJobs(text, "$SPAWNPOINT_JOB");  // what the agent does
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_EQ((*parsed)[0].name, "job");
  EXPECT_EQ((*parsed)[0].spec.trainer.command, job.spec.trainer.command);
  EXPECT_EQ((*parsed)[0].spec.trainer.args, job.spec.trainer.args);
  EXPECT_EQ((*parsed)[0].spec.shm_size_bytes, job.spec.shm_size_bytes);
}

}  // namespace
}  // namespace spawnpoint::op
