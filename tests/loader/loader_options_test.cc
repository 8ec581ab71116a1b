// ResolveLoaderOptions on a fake environment: defaults, what each variable sets, and the
// error each bad value gets.
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/loader/loader_options.h"
#include "agent/loader/shm_ring.h"

namespace spawnpoint::loader {
namespace {

using ::testing::HasSubstr;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

LoaderOptions Minimal() {
  LoaderOptions o;
  o.dataset = "index";
  o.cpus = 4;
  return o;
}

StatusOr<LoaderOptions> Resolve(std::map<std::string, std::string> vars,
                                LoaderOptions o = Minimal()) {
  return ResolveLoaderOptions(std::move(o), FakeEnv(std::move(vars)));
}

std::string ErrorOf(std::map<std::string, std::string> vars, LoaderOptions o = Minimal()) {
  auto r = Resolve(std::move(vars), std::move(o));
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(LoaderOptions, DefaultsWithAnEmptyEnvironment) {
  auto r = Resolve({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->workers, 0);
  EXPECT_EQ(r->prefetch_factor, 2);
  EXPECT_EQ(r->timeout, std::chrono::seconds(120));
  EXPECT_EQ(r->seed, 0u);
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 1);
  EXPECT_EQ(r->cpus, 4);
  EXPECT_EQ(r->shm_dir, "/dev/shm");
  EXPECT_EQ(r->pool_dir, "");
  EXPECT_FALSE(r->slot_bytes.has_value());
}

TEST(LoaderOptions, TheEnvironmentFillsWhatIsUnset) {
  auto r = Resolve({{kEnvWorkers, "3"},
                    {kEnvPrefetchFactor, "5"},
                    {kEnvTimeoutSeconds, "1.5"},
                    {kEnvSeed, "42"},
                    {kEnvSlotBytes, "1000"},
                    {"RANK", "2"},
                    {"WORLD_SIZE", "4"},
                    {kEnvShmDir, "/tmp/shm"}},
                   [] {
                     LoaderOptions o = Minimal();
                     o.cpus.reset();
                     return o;
                   }());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->workers, 3);
  EXPECT_EQ(r->prefetch_factor, 5);
  EXPECT_EQ(r->timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(r->seed, 42u);
  EXPECT_EQ(r->slot_bytes, RoundUpToPages(1000));
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_GE(r->cpus, 1);  // the affinity
  EXPECT_EQ(r->shm_dir, "/tmp/shm");
}

TEST(LoaderOptions, ExplicitOptionsWin) {
  LoaderOptions o = Minimal();
  o.workers = 1;
  o.prefetch_factor = 3;
  o.seed = 7;
  auto r = Resolve({{kEnvWorkers, "4"}, {kEnvPrefetchFactor, "9"}, {kEnvSeed, "8"}}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->workers, 1);
  EXPECT_EQ(r->prefetch_factor, 3);
  EXPECT_EQ(r->seed, 7u);
}

TEST(LoaderOptions, AutoWorkers) {
  EXPECT_EQ(Resolve({{kEnvWorkers, "auto"}})->workers, kAutoWorkers);
  // In a pool the agent runs, SPAWNPOINT_LOADER_WORKERS is the pool's size; auto comes from
  // SPAWNPOINT_LOADER_AUTO_WORKERS.
  EXPECT_EQ(Resolve({{kEnvPoolDir, "/p"}, {kEnvWorkers, "4"}, {kEnvAutoWorkers, "1"}})->workers,
            kAutoWorkers);
  EXPECT_EQ(Resolve({{kEnvPoolDir, "/p"}, {kEnvWorkers, "4"}})->workers, 4);
  EXPECT_EQ(Resolve({{kEnvWorkers, "4"}, {kEnvAutoWorkers, "1"}})->workers, 4);
}

TEST(LoaderOptions, CpusFromAList) {
  LoaderOptions o = Minimal();
  o.cpus.reset();
  EXPECT_EQ(Resolve({{kEnvCpus, "0-3,8"}}, o)->cpus, 5);
  EXPECT_EQ(Resolve({{kEnvCpus, "6"}}, o)->cpus, 6);
}

TEST(LoaderOptions, BadValuesNameTheOptionOrVariable) {
  LoaderOptions no_dataset = Minimal();
  no_dataset.dataset.clear();
  EXPECT_THAT(ErrorOf({}, no_dataset), HasSubstr("dataset is empty"));
  LoaderOptions zero_batch = Minimal();
  zero_batch.batch_size = 0;
  EXPECT_THAT(ErrorOf({}, zero_batch), HasSubstr("batch_size"));
  LoaderOptions zero_attempts = Minimal();
  zero_attempts.max_attempts = 0;
  EXPECT_THAT(ErrorOf({}, zero_attempts), HasSubstr("max_attempts"));
  LoaderOptions bad_workers = Minimal();
  bad_workers.workers = -7;
  EXPECT_THAT(ErrorOf({}, bad_workers), HasSubstr("workers must be >= 0"));

  EXPECT_THAT(ErrorOf({{kEnvWorkers, "many"}}),
              HasSubstr("SPAWNPOINT_LOADER_WORKERS=\"many\" is not an integer"));
  EXPECT_THAT(ErrorOf({{kEnvWorkers, "-1"}}), HasSubstr("must be >= 0 or auto"));
  EXPECT_THAT(ErrorOf({{kEnvPrefetchFactor, "2x"}}),
              HasSubstr("SPAWNPOINT_LOADER_PREFETCH_FACTOR"));
  EXPECT_THAT(ErrorOf({{kEnvPrefetchFactor, "0"}}), HasSubstr("prefetch_factor must be >= 1"));
  EXPECT_THAT(ErrorOf({{kEnvTimeoutSeconds, "soon"}}), HasSubstr("is not a number of seconds"));
  EXPECT_THAT(ErrorOf({{kEnvTimeoutSeconds, "-1"}}), HasSubstr("is not a number of seconds"));
  EXPECT_THAT(ErrorOf({{kEnvSeed, "abc"}}), HasSubstr("SPAWNPOINT_LOADER_SEED"));
  EXPECT_THAT(ErrorOf({{kEnvSlotBytes, "0"}}), HasSubstr("must be positive"));
  EXPECT_THAT(ErrorOf({{"RANK", "one"}}), HasSubstr("RANK=\"one\""));
  EXPECT_THAT(ErrorOf({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
              HasSubstr("rank 4 is outside world size 4"));
  EXPECT_THAT(ErrorOf({{"WORLD_SIZE", "0"}}), HasSubstr("outside world size 0"));
  LoaderOptions no_cpus = Minimal();
  no_cpus.cpus.reset();
  EXPECT_THAT(ErrorOf({{kEnvCpus, "x-y"}}, no_cpus), HasSubstr(kEnvCpus));
}

TEST(LoaderOptions, AgentPoolSize) {
  EXPECT_EQ(AgentPoolSize(FakeEnv({{kEnvWorkers, "3"}})).value(), 3);
  auto unset = AgentPoolSize(FakeEnv({}));
  ASSERT_FALSE(unset.ok());
  EXPECT_THAT(unset.status().message(), HasSubstr("(the pool's size) is not"));
  for (const char* bad : {"0", "auto", "2x"}) {
    auto r = AgentPoolSize(FakeEnv({{kEnvWorkers, bad}}));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("must be the pool's size (>= 1)"));
  }
}

}  // namespace
}  // namespace spawnpoint::loader
