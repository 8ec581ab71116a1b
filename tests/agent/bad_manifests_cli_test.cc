// Every broken manifest in tests/data/bad-manifests makes `plan` and `run` exit 2 with one
// line that gives the location, and starts nothing.
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> BadManifests() {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(SOURCE_DIR "/tests/data/bad-manifests")) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class BadManifestCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BadManifestCliTest, PlanAndRunExitTwoWithALocatedOneLineError) {
  const std::string manifest = GetParam();
  std::string expect = Trim(ReadFile(manifest.substr(0, manifest.size() - 5) + ".expect"));
  ASSERT_FALSE(expect.empty());
  TempDir work;  // a working dir of its own, so a relative command could not resolve anyway
  for (const char* command : {"plan", "run"}) {
    TestProcess agent({AGENT_BIN, command, "-f", manifest, "--master-port", "0"}, {}, work.path());
    EXPECT_EQ(agent.Wait(std::chrono::milliseconds(30'000)), 2)
        << command << ": " << agent.Stderr();
    EXPECT_THAT(agent.Stderr(), HasSubstr(expect)) << command;
    EXPECT_EQ(CountLines(agent.Stderr(), ""), 1) << command << ": " << agent.Stderr();
    EXPECT_EQ(agent.Stdout(), "") << command;
  }
  EXPECT_TRUE(std::filesystem::is_empty(work.path())) << "something ran in " << work.path();
}

INSTANTIATE_TEST_SUITE_P(Manifests, BadManifestCliTest, ::testing::ValuesIn(BadManifests()),
                         [](const auto& info) {
                           std::string name = std::filesystem::path(info.param).stem().string();
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace spawnpoint::testing
