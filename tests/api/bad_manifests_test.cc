// Every manifest in tests/data/bad-manifests must be rejected with kInvalidArgument and a
// one-line message containing the text of the .expect file beside it (which includes the
// file:line:col location and the field path). They are read as `spawnpoint-agent run -f` reads
// them (ParseOptions::local), so env entries only a kubelet can resolve are errors too.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "api/training_job.h"

namespace spawnpoint::api {
namespace {

namespace fs = std::filesystem;

const fs::path kBadManifests = fs::path(SPAWNPOINT_SOURCE_DIR) / "tests/data/bad-manifests";

std::vector<fs::path> Manifests() {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(kBadManifests)) {
    if (entry.path().extension() == ".yaml") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ReadExpectation(const fs::path& manifest) {
  fs::path expect = manifest;
  expect.replace_extension(".expect");
  std::ifstream in(expect);
  std::string line;
  std::getline(in, line);
  return line;
}

// "name.yaml:12:5: ..."
bool StartsWithLocation(const std::string& expected, const std::string& file) {
  return expected.starts_with(file + ":") &&
         std::regex_search(expected.substr(file.size() + 1), std::regex(R"(^\d+:\d+: )"));
}

TEST(BadManifests, ThereAreEnough) { EXPECT_GE(Manifests().size(), 15u); }

TEST(BadManifests, EachIsRejectedWithItsLocationAndField) {
  for (const fs::path& manifest : Manifests()) {
    SCOPED_TRACE(manifest.filename().string());
    std::string expected = ReadExpectation(manifest);
    EXPECT_FALSE(expected.empty()) << "missing or empty .expect file";
    // The location has to be part of what is checked, not just the message.
    EXPECT_TRUE(StartsWithLocation(expected, manifest.filename().string()))
        << ".expect must hold the file:line:col location: " << expected;

    auto jobs = LoadTrainingJobsFile(manifest.string(), {.local = true});
    if (jobs.ok()) {
      ADD_FAILURE() << "accepted";
      continue;
    }
    EXPECT_EQ(jobs.status().code(), StatusCode::kInvalidArgument);
    const std::string& message = jobs.status().message();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos)
        << "message: " << message << "\nexpected to contain: " << expected;
  }
}

}  // namespace
}  // namespace spawnpoint::api
