#include "operator/kube/config.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using spawnpoint::testing::TempDir;
using spawnpoint::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "s3cr3t-t0ken-abcdef";
constexpr char kKeyPem[] =
    "-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n";
constexpr char kCertPem[] = "-----BEGIN CERTIFICATE-----\nCERT\n-----END CERTIFICATE-----\n";

std::string Kubeconfig(const std::string& user_block) {
  return R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://10.1.2.3:6443/
    certificate-authority: ca.pem
- name: other-cluster
  cluster:
    server: http://127.0.0.1:8080
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user, namespace: ml}
- name: other
  context: {cluster: other-cluster, user: other-user}
users:
- name: dev-user
  user:
)" + user_block +
         R"(
- name: other-user
  user:
    tokenFile: tokens/other
)";
}

TEST(KubeconfigTest, CurrentContextWithTokenAndCaFile) {
  TempDir dir;
  WriteFile(dir.File("ca.pem"), kCertPem);
  std::string path = dir.File("config");
  WriteFile(path, Kubeconfig(std::string("    token: ") + kToken));
  auto c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "https://10.1.2.3:6443");
  EXPECT_EQ(c->default_namespace, "ml");
  EXPECT_EQ(c->certificate_authority_pem, kCertPem);
  EXPECT_EQ(c->bearer_token, kToken);
  EXPECT_FALSE(c->insecure_skip_tls_verify);
  EXPECT_THAT(c->DebugString(), Not(HasSubstr(kToken)));
  EXPECT_THAT(c->DebugString(), HasSubstr("token=<redacted>"));
}

TEST(KubeconfigTest, NamedContextWithRelativeTokenFile) {
  TempDir dir;
  WriteFile(dir.File("ca.pem"), kCertPem);
  std::string path = dir.File("config");
  WriteFile(path, Kubeconfig("    token: x"));
  auto c = LoadKubeconfig(path, "other");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(c->insecure_skip_tls_verify);
  EXPECT_EQ(c->token_file, dir.path() + "/tokens/other");
  EXPECT_EQ(c->default_namespace, "default");
}

TEST(KubeconfigTest, InlineClientCertificateAndKeyData) {
  TempDir dir;
  WriteFile(dir.File("ca.pem"), kCertPem);
  std::string path = dir.File("config");
  WriteFile(path, Kubeconfig("    client-certificate-data: " + Base64Encode(kCertPem) +
                             "\n    client-key-data: " + Base64Encode(kKeyPem)));
  auto c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->client_certificate_pem, kCertPem);
  EXPECT_EQ(c->client_key_pem, kKeyPem);
  EXPECT_THAT(c->DebugString(), Not(HasSubstr("TOPSECRET")));
}

TEST(KubeconfigTest, ErrorsNameTheFieldButNeverTheSecret) {
  TempDir dir;
  WriteFile(dir.File("ca.pem"), kCertPem);
  std::string path = dir.File("config");
  // Not base64: the decoder fails on the key material; the message must not echo it.
  WriteFile(path, Kubeconfig("    client-certificate-data: " + Base64Encode(kCertPem) +
                             "\n    client-key-data: TOPSECRET!KEY*MATERIAL"));
  auto c = LoadKubeconfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("client-key-data"));
  EXPECT_THAT(c.status().message(), Not(HasSubstr("TOPSECRET")));

  // A YAML syntax error on the token's line: located, not echoed.
  WriteFile(path, Kubeconfig(std::string("    token: ") + kToken + "\n  : : ["));
  c = LoadKubeconfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), Not(HasSubstr(kToken)));
}

TEST(KubeconfigTest, MissingPiecesAreReported) {
  TempDir dir;
  std::string path = dir.File("config");
  WriteFile(path, Kubeconfig("    token: x"));
  auto c = LoadKubeconfig(path, "nope");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("context \"nope\""));
  // The CA file of the current context does not exist.
  c = LoadKubeconfig(path);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("ca.pem"));
  WriteFile(path, Kubeconfig("    exec:\n      command: aws"));
  WriteFile(dir.File("ca.pem"), kCertPem);
  c = LoadKubeconfig(path);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("not supported"));
  EXPECT_FALSE(LoadKubeconfig(dir.File("absent")).ok());
}

TEST(InClusterTest, ReadsServiceAccountFiles) {
  TempDir dir;
  WriteFile(dir.File("token"), std::string(kToken) + "\n");
  WriteFile(dir.File("ca.crt"), kCertPem);
  WriteFile(dir.File("namespace"), "spawnpoint-system\n");
  std::map<std::string, std::string> env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                            {"KUBERNETES_SERVICE_PORT", "443"}};
  auto lookup = [&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  auto c = LoadInClusterConfig(dir.path(), lookup);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->token_file, dir.File("token"));
  EXPECT_TRUE(c->bearer_token.empty());  // read through the rotating token source
  EXPECT_EQ(c->certificate_authority_pem, kCertPem);
  EXPECT_EQ(c->default_namespace, "spawnpoint-system");

  env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  c = LoadInClusterConfig(dir.path(), lookup);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->server, "https://[fd00::1]:443");

  env.clear();
  EXPECT_EQ(LoadInClusterConfig(dir.path(), lookup).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(FileTokenSourceTest, RereadsWhenTheFileRotates) {
  TempDir dir;
  SimulatedClock clock;
  std::string path = dir.File("token");
  WriteFile(path, "first\n");
  FileTokenSource src(path, &clock, std::chrono::seconds(60));
  EXPECT_EQ(*src.Token(), "first");

  // Rotation by rename (as kubelet's atomic writer does) changes size/mtime: seen at once.
  WriteFile(dir.File("token.new"), "second-token\n");
  ASSERT_EQ(::rename(dir.File("token.new").c_str(), path.c_str()), 0);
  EXPECT_EQ(*src.Token(), "second-token");

  // Same size, and mtime forced back: only the periodic re-read notices.
  WriteFile(path, "third-token!\n");
  struct timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(*src.Token(), "third-token!");  // mtime changed to 1: re-read
  WriteFile(path, "fourth-tokn!\n");
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(*src.Token(), "third-token!");  // indistinguishable until max_age
  clock.Advance(std::chrono::seconds(61));
  EXPECT_EQ(*src.Token(), "fourth-tokn!");

  // After a 401 the client invalidates: the next read goes to the file.
  WriteFile(path, "fifth-token!\n");
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  src.Invalidate();
  EXPECT_EQ(*src.Token(), "fifth-token!");

  // A briefly missing file keeps the last good token.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  EXPECT_EQ(*src.Token(), "fifth-token!");
}

TEST(Base64Test, RoundTrip) {
  for (std::string s : {"", "a", "ab", "abc", "abcd", "\x01\xff\x80 binary"}) {
    auto d = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(*Base64Decode("aGVs\nbG8="), "hello");
  EXPECT_FALSE(Base64Decode("a$b").ok());
}

}  // namespace
}  // namespace spawnpoint::kube
