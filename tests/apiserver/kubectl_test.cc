// Acceptance: the real kubectl (1.32) against kube-test-server. The CRD and the custom
// resource default to tests/apiserver/testdata; SPAWNPOINT_TEST_CRD and SPAWNPOINT_TEST_CR
// point the same tests at other files (the project's own CRD). Each test gets its own
// server and its own KUBECACHEDIR, so discovery caches are never shared.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "tests/apiserver/test_server.h"
#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest::testing {
namespace {

using spawnpoint::testing::ReadFile;
using spawnpoint::testing::TestProcess;
using spawnpoint::testing::WaitUntil;
using spawnpoint::testing::WriteFile;
using std::chrono::seconds;
using ::testing::HasSubstr;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Column {
  std::string name;
  std::string json_path;
};

// What the tests need to know about the CRD and the custom resource under test.
struct Subject {
  std::string crd_path, cr_path;
  std::string group, plural, kind, short_name, spec_description;
  std::vector<Column> columns;  // priority 0 printer columns
  YAML::Node cr;
  std::string cr_name;
  int nodes = 0;

  static Subject Load() {
    Subject s;
    s.crd_path =
        EnvOr("SPAWNPOINT_TEST_CRD", SOURCE_DIR "/tests/apiserver/testdata/trainingjob-crd.yaml");
    s.cr_path =
        EnvOr("SPAWNPOINT_TEST_CR", SOURCE_DIR "/tests/apiserver/testdata/trainingjob.yaml");
    YAML::Node crd = YAML::LoadFile(s.crd_path);
    s.group = crd["spec"]["group"].as<std::string>();
    s.plural = crd["spec"]["names"]["plural"].as<std::string>();
    s.kind = crd["spec"]["names"]["kind"].as<std::string>();
    if (crd["spec"]["names"]["shortNames"]) {
      s.short_name = crd["spec"]["names"]["shortNames"][0].as<std::string>();
    }
    for (const auto& v : crd["spec"]["versions"]) {
      if (!v["storage"].as<bool>()) continue;
      for (const auto& c : v["additionalPrinterColumns"]) {
        if (c["priority"] && c["priority"].as<int>() != 0) continue;
        s.columns.push_back({c["name"].as<std::string>(), c["jsonPath"].as<std::string>()});
      }
      YAML::Node spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"];
      if (spec["description"]) s.spec_description = spec["description"].as<std::string>();
    }
    s.cr = YAML::LoadFile(s.cr_path);
    s.cr_name = s.cr["metadata"]["name"].as<std::string>();
    s.nodes = s.cr["spec"]["nodes"].as<int>();
    return s;
  }
};

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// The cell under a header column of kubectl's aligned table output.
std::string Cell(const std::string& header, const std::string& row, const std::string& column) {
  size_t start = header.find(column);
  if (start == std::string::npos || start >= row.size()) return "";
  size_t next = header.find_first_not_of(' ', header.find(' ', start));
  std::string cell =
      row.substr(start, next == std::string::npos ? std::string::npos : next - start);
  cell.erase(cell.find_last_not_of(' ') + 1);
  return cell;
}

struct Result {
  int code;
  std::string out, err;
};

class KubectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The pinned kubectl (tests/CMakeLists.txt); missing is a failure, never a skip, so a
    // missing install step cannot hide.
    kubectl_ = EnvOr("KUBECTL", KUBECTL_BIN);
    ASSERT_EQ(access(kubectl_.c_str(), X_OK), 0)
        << "no kubectl at " << kubectl_
        << ": run `make deps` (scripts/install-tools.sh builds the pinned kubectl)";
    subject_ = Subject::Load();
    server_ = std::make_unique<KubeTestServer>(ServerArgs());
    ASSERT_TRUE(server_->ok()) << server_->error();
  }

  virtual std::vector<std::string> ServerArgs() const { return {"--bookmark-interval-ms", "200"}; }

  std::map<std::string, std::string> Env() {
    return {{"KUBECACHEDIR", dir_.File("cache")}, {"HOME", dir_.path()}};
  }

  std::vector<std::string> Argv(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kubectl_, "--kubeconfig", server_->kubeconfig()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  Result Kubectl(const std::vector<std::string>& args) {
    TestProcess p(Argv(args), Env());
    int code = p.Wait(seconds(30));
    return {code, p.Stdout(), p.Stderr()};
  }

  // kubectl with another kubeconfig.
  Result KubectlWith(const std::string& kubeconfig, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kubectl_, "--kubeconfig", kubeconfig};
    argv.insert(argv.end(), args.begin(), args.end());
    TestProcess p(argv, Env());
    int code = p.Wait(seconds(30));
    return {code, p.Stdout(), p.Stderr()};
  }

  // Applies the CRD and the custom resource, as every test needs them.
  void ApplyBoth() {
    Result crd = Kubectl({"apply", "-f", subject_.crd_path});
    ASSERT_EQ(crd.code, 0) << crd.err;
    ASSERT_THAT(crd.out, HasSubstr("created"));
    Result cr = Kubectl({"apply", "-f", subject_.cr_path});
    ASSERT_EQ(cr.code, 0) << cr.err;
    ASSERT_EQ(cr.out,
              Lower(subject_.kind) + "." + subject_.group + "/" + subject_.cr_name + " created\n");
  }

  // The custom resource with one field of spec changed, as a temp manifest.
  std::string VariantManifest(const std::string& field, const YAML::Node& value) {
    YAML::Node cr = YAML::Clone(subject_.cr);
    cr["spec"][field] = value;
    YAML::Emitter out;
    out << cr;
    std::string path = dir_.File(field + ".yaml");
    WriteFile(path, out.c_str());
    return path;
  }

  std::string Resource() const {
    return subject_.short_name.empty() ? subject_.plural : subject_.short_name;
  }

  spawnpoint::testing::TempDir dir_;
  std::string kubectl_;
  Subject subject_;
  std::unique_ptr<KubeTestServer> server_;
};

TEST_F(KubectlTest, ApplyCrdAndCustomResourceWithServerSideValidation) {
  ApplyBoth();
  Result again = Kubectl({"apply", "-f", subject_.cr_path});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("unchanged"));
  bool strict_create = false;
  const nlohmann::json log = server_->Requests();
  for (const auto& r : log["requests"]) {
    if (r["verb"] == "create" && r.value("resource", "") == subject_.plural) {
      strict_create =
          r["query"].get<std::string>().find("fieldValidation=Strict") != std::string::npos;
    }
  }
  EXPECT_TRUE(strict_create) << "kubectl found fieldValidation in the OpenAPI and used it";
}

TEST_F(KubectlTest, GetShowsThePrinterColumnsByShortName) {
  ApplyBoth();
  Result get = Kubectl({"get", Resource()});
  ASSERT_EQ(get.code, 0) << get.err;
  auto lines = Lines(get.out);
  ASSERT_EQ(lines.size(), 2u) << get.out;
  std::istringstream header(lines[0]);
  std::vector<std::string> got;
  for (std::string w; header >> w;) got.push_back(w);
  std::vector<std::string> want = {"NAME"};
  for (const auto& c : subject_.columns) want.push_back(Upper(c.name));
  EXPECT_EQ(got, want);
  EXPECT_EQ(Cell(lines[0], lines[1], "NAME"), subject_.cr_name);
  for (const auto& c : subject_.columns) {
    if (c.json_path == ".spec.nodes") {
      EXPECT_EQ(Cell(lines[0], lines[1], Upper(c.name)), std::to_string(subject_.nodes));
    }
    if (c.json_path == ".metadata.creationTimestamp") {
      EXPECT_THAT(Cell(lines[0], lines[1], Upper(c.name)), ::testing::MatchesRegex("[0-9]+s"));
    }
  }
  Result full = Kubectl({"get", subject_.plural + "." + subject_.group, subject_.cr_name, "-o",
                         "jsonpath={.spec.nodes}"});
  EXPECT_EQ(full.out, std::to_string(subject_.nodes));
}

TEST_F(KubectlTest, GetWatchSeesAnUpdate) {
  ApplyBoth();
  TestProcess watch(Argv({"get", Resource(), "-w"}), Env());
  ASSERT_TRUE(WaitUntil([&] { return Lines(watch.Stdout()).size() >= 2; }, seconds(20)))
      << watch.Stderr();
  int new_nodes = subject_.nodes + 1;
  Result patch = Kubectl({"patch", Resource(), subject_.cr_name, "--type", "merge", "-p",
                          "{\"spec\":{\"nodes\":" + std::to_string(new_nodes) + "}}"});
  ASSERT_EQ(patch.code, 0) << patch.err;
  std::string header;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto lines = Lines(watch.Stdout());
        if (lines.size() < 3) return false;
        std::istringstream row(lines.back());
        std::vector<std::string> cells;
        for (std::string w; row >> w;) cells.push_back(w);
        return !cells.empty() && cells[0] == subject_.cr_name &&
               std::find(cells.begin(), cells.end(), std::to_string(new_nodes)) != cells.end();
      },
      seconds(20)))
      << watch.Stdout() << watch.Stderr();
}

TEST_F(KubectlTest, PatchThenDelete) {
  ApplyBoth();
  Result patch = Kubectl({"patch", Resource(), subject_.cr_name, "--type", "merge", "-p",
                          "{\"metadata\":{\"labels\":{\"team\":\"ml\"}}}"});
  ASSERT_EQ(patch.code, 0) << patch.err;
  EXPECT_THAT(patch.out, HasSubstr(subject_.cr_name + " patched"));
  Result labelled = Kubectl({"get", Resource(), "-l", "team=ml", "-o", "name"});
  EXPECT_THAT(labelled.out, HasSubstr("/" + subject_.cr_name));
  Result del = Kubectl({"delete", Resource(), subject_.cr_name});
  ASSERT_EQ(del.code, 0) << del.err;
  EXPECT_THAT(del.out, HasSubstr("\"" + subject_.cr_name + "\" deleted"));
  Result gone = Kubectl({"get", Resource(), subject_.cr_name});
  EXPECT_NE(gone.code, 0);
  EXPECT_THAT(gone.err, HasSubstr("Error from server (NotFound): " + subject_.plural + "." +
                                  subject_.group + " \"" + subject_.cr_name + "\" not found"));
}

TEST_F(KubectlTest, ExplainShowsTheSchemaDescriptions) {
  ApplyBoth();
  Result explain = Kubectl({"explain", Resource() + ".spec"});
  ASSERT_EQ(explain.code, 0) << explain.err;
  EXPECT_THAT(explain.out, HasSubstr("KIND:       " + subject_.kind));
  EXPECT_THAT(explain.out, HasSubstr("nodes\t<integer>"));
  if (!subject_.spec_description.empty()) {
    EXPECT_THAT(explain.out, HasSubstr(subject_.spec_description.substr(0, 20)));
  }
}

TEST_F(KubectlTest, InvalidResourceIsA422WithKubectlsUsualMessage) {
  ApplyBoth();
  Result bad = Kubectl({"apply", "-f", VariantManifest("nodes", YAML::Node(0))});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("The " + subject_.kind + " \"" + subject_.cr_name +
                                 "\" is invalid: spec.nodes: Invalid value: 0: spec.nodes in "
                                 "body should be greater than or equal to 1"));
  bool saw_422 = false;
  const nlohmann::json log = server_->Requests();
  for (const auto& r : log["requests"]) saw_422 = saw_422 || r["code"] == 422;
  EXPECT_TRUE(saw_422);
}

TEST_F(KubectlTest, UnknownFieldsAreRejectedUnderStrictValidation) {
  Result crd = Kubectl({"apply", "-f", subject_.crd_path});
  ASSERT_EQ(crd.code, 0) << crd.err;
  std::string manifest = VariantManifest("bogusField", YAML::Node(1));
  Result strict = Kubectl({"apply", "-f", manifest});
  EXPECT_EQ(strict.code, 1);
  EXPECT_THAT(strict.err, HasSubstr("strict decoding error: unknown field \"spec.bogusField\""));
  Result warn = Kubectl({"apply", "--validate=warn", "-f", manifest});
  EXPECT_EQ(warn.code, 0) << warn.err;
  EXPECT_THAT(warn.err, HasSubstr("Warning: unknown field \"spec.bogusField\""));
}

// The same server with --authorization rbac: the admin applies a ServiceAccount, a Role
// and a RoleBinding, then kubectl with the ServiceAccount's kubeconfig sees what a real
// cluster would show it.
class KubectlRbacTest : public KubectlTest {
 protected:
  std::vector<std::string> ServerArgs() const override { return {"--authorization", "rbac"}; }

  // ServiceAccount "op" in default, allowed to read the custom resources there.
  std::string ApplyReaderServiceAccount() {
    std::string manifest = dir_.File("rbac.yaml");
    WriteFile(manifest, R"(apiVersion: v1
kind: ServiceAccount
metadata:
  name: op
  namespace: default
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: reader
  namespace: default
rules:
- apiGroups: [")" + subject_.group +
                            R"("]
  resources: [")" + subject_.plural +
                            R"("]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: op-reader
  namespace: default
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: reader
subjects:
- kind: ServiceAccount
  name: op
  namespace: default
)");
    Result apply = Kubectl({"apply", "-f", manifest});
    EXPECT_EQ(apply.code, 0) << apply.err;
    std::string kubeconfig = dir_.File("op.kubeconfig");
    Status st = server_->WriteServiceAccountKubeconfig("default", "op", kubeconfig);
    EXPECT_TRUE(st.ok()) << st.message();
    return kubeconfig;
  }

  const std::string kOp = "system:serviceaccount:default:op";
};

TEST_F(KubectlRbacTest, AServiceAccountIsForbiddenWhatItsRoleDoesNotGrant) {
  ApplyBoth();
  std::string op = ApplyReaderServiceAccount();
  Result get = KubectlWith(op, {"get", subject_.plural + "." + subject_.group, "-o", "name"});
  EXPECT_EQ(get.code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("/" + subject_.cr_name));

  Result pods = KubectlWith(op, {"get", "pods"});
  EXPECT_EQ(pods.code, 1);
  EXPECT_EQ(pods.err, "Error from server (Forbidden): pods is forbidden: User \"" + kOp +
                          "\" cannot list resource \"pods\" in API group \"\" in the namespace "
                          "\"default\"\n");
  Result nodes = KubectlWith(op, {"get", "nodes"});
  EXPECT_THAT(nodes.err,
              HasSubstr("Error from server (Forbidden): nodes is forbidden: User \"" + kOp +
                        "\" cannot list resource \"nodes\" in API group \"\" at the "
                        "cluster scope"));
  Result del =
      KubectlWith(op, {"delete", subject_.plural + "." + subject_.group, subject_.cr_name});
  EXPECT_EQ(del.code, 1);
  EXPECT_THAT(del.err,
              HasSubstr("Error from server (Forbidden): " + subject_.plural + "." + subject_.group +
                        " \"" + subject_.cr_name + "\" is forbidden: User \"" + kOp +
                        "\" cannot delete resource \"" + subject_.plural + "\" in API group \"" +
                        subject_.group + "\" in the namespace \"default\""));
  Result other_ns =
      KubectlWith(op, {"get", subject_.plural + "." + subject_.group, "-n", "kube-system"});
  EXPECT_EQ(other_ns.code, 1);
  EXPECT_THAT(other_ns.err, HasSubstr("in the namespace \"kube-system\""));
  Result still_there = Kubectl({"get", subject_.plural + "." + subject_.group, subject_.cr_name});
  EXPECT_EQ(still_there.code, 0) << "the admin is not restricted";

  bool logged = false;
  const nlohmann::json log = server_->Requests();
  for (const auto& r : log["requests"]) {
    if (r["user"] == kOp && r["verb"] == "delete") logged = r["code"] == 403 && !r["allowed"];
  }
  EXPECT_TRUE(logged) << "the request log names the user and the decision";
}

TEST_F(KubectlRbacTest, AuthCanIAndWhoami) {
  ApplyBoth();
  std::string op = ApplyReaderServiceAccount();
  std::string jobs = subject_.plural + "." + subject_.group;
  Result yes = KubectlWith(op, {"auth", "can-i", "list", jobs});
  EXPECT_EQ(yes.code, 0) << yes.err;
  EXPECT_EQ(yes.out, "yes\n");
  Result no = KubectlWith(op, {"auth", "can-i", "delete", jobs});
  EXPECT_EQ(no.code, 1);
  EXPECT_EQ(no.out, "no\n");
  Result pods = Kubectl({"auth", "can-i", "list", "pods", "--as", kOp});
  EXPECT_EQ(pods.out, "no\n") << "the admin asks about the ServiceAccount by impersonation";
  Result admin = Kubectl({"auth", "can-i", "delete", "nodes"});
  EXPECT_EQ(admin.out, "yes\n");
  Result list = KubectlWith(op, {"auth", "can-i", "--list"});
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(jobs));
  Result whoami = KubectlWith(op, {"auth", "whoami"});
  EXPECT_EQ(whoami.code, 0) << whoami.err;
  EXPECT_THAT(whoami.out, HasSubstr(kOp));
  EXPECT_THAT(whoami.out, HasSubstr("system:serviceaccounts:default"));
}

TEST_F(KubectlRbacTest, CreateTokenGivesAWorkingToken) {
  std::string op = ApplyReaderServiceAccount();
  Result token = Kubectl({"create", "token", "op", "--duration", "10m"});
  ASSERT_EQ(token.code, 0) << token.err;
  std::string t = token.out.substr(0, token.out.find('\n'));
  EXPECT_EQ(std::count(t.begin(), t.end(), '.'), 2) << t;
  auto whoami =
      server_->CallAs(t, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", "{}");
  EXPECT_EQ(whoami.code, 201) << whoami.body;
  EXPECT_EQ(whoami.Json()["status"]["userInfo"]["username"], kOp);
  EXPECT_EQ(server_->CallAs(t, "GET", "/api/v1/namespaces/default/pods").code, 403);
  Result missing = Kubectl({"create", "token", "nobody"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("serviceaccounts \"nobody\" not found"));
}

}  // namespace
}  // namespace spawnpoint::kubetest::testing
