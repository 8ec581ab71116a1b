// The registry: exact exposition of each type, registration rules, label-set removal,
// collectors, and updates racing scrapes on several threads.
#include "metrics/registry.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/metrics/sample_parser.h"
#include "tests/support/test_process.h"

namespace spawnpoint::metrics {
namespace {

using testing::FindSample;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ParseSamples;

TEST(MetricsRegistryTest, UnlabelledCounterIsExportedFromTheStart) {
  Registry r;
  auto* c = r.AddCounter({.name = "x_events_total", .help = "Events."}).value();
  EXPECT_EQ(r.Render(),
            "# HELP x_events_total Events.\n"
            "# TYPE x_events_total counter\n"
            "x_events_total 0\n");
  c->WithLabels({})->Inc();
  c->WithLabels({})->Inc(2.5);
  c->WithLabels({})->Inc(-7);  // ignored: counters never go down
  c->WithLabels({})->Inc(std::nan(""));
  EXPECT_THAT(r.Render(), HasSubstr("\nx_events_total 3.5\n"));
}

TEST(MetricsRegistryTest, LabelledSeriesAreSortedAndEscaped) {
  Registry r;
  auto* g = r.AddGauge({.name = "x_temperature_celsius",
                        .help = "Temperature in \\ degrees\nCelsius.",
                        .labels = {"gpu", "modelName"}})
                .value();
  g->WithLabels({"1", "Model \"B\"\nrev\\2"})->Set(41);
  g->WithLabels({"0", "A"})->Set(40.5);
  g->WithLabels({"0", "A"})->Dec(0.5);
  EXPECT_EQ(r.Render(),
            "# HELP x_temperature_celsius Temperature in \\\\ degrees\\nCelsius.\n"
            "# TYPE x_temperature_celsius gauge\n"
            "x_temperature_celsius{gpu=\"0\",modelName=\"A\"} 40\n"
            "x_temperature_celsius{gpu=\"1\",modelName=\"Model \\\"B\\\"\\nrev\\\\2\"} 41\n");
}

TEST(MetricsRegistryTest, AFamilyWithoutSeriesWritesNothing) {
  Registry r;
  ASSERT_TRUE(r.AddGauge({.name = "x_up", .help = "Up.", .labels = {"rank"}}).ok());
  EXPECT_EQ(r.Render(), "");
}

TEST(MetricsRegistryTest, HistogramBucketsAreCumulativeWithInclusiveBounds) {
  Registry r;
  auto* h = r.AddHistogram({.name = "x_duration_seconds", .help = "Time.", .labels = {"verb"}},
                           {0.1, 1, 2.5})
                .value();
  auto get = h->WithLabels({"GET"});
  for (double v : {0.05, 0.1, 0.5, 1.0, 5.0, 100.0}) get->Observe(v);
  get->Observe(std::nan(""));  // ignored
  EXPECT_EQ(r.Render(),
            "# HELP x_duration_seconds Time.\n"
            "# TYPE x_duration_seconds histogram\n"
            "x_duration_seconds_bucket{verb=\"GET\",le=\"0.1\"} 2\n"
            "x_duration_seconds_bucket{verb=\"GET\",le=\"1\"} 4\n"
            "x_duration_seconds_bucket{verb=\"GET\",le=\"2.5\"} 4\n"
            "x_duration_seconds_bucket{verb=\"GET\",le=\"+Inf\"} 6\n"
            "x_duration_seconds_sum{verb=\"GET\"} 106.65\n"
            "x_duration_seconds_count{verb=\"GET\"} 6\n");
  auto snap = get->Take();
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{2, 4, 4, 6}));
  EXPECT_EQ(snap.count, 6u);
  EXPECT_DOUBLE_EQ(snap.sum, 106.65);
}

TEST(MetricsRegistryTest, UnlabelledHistogramAndBucketHelpers) {
  Registry r;
  auto* h =
      r.AddHistogram({.name = "x_size_bytes", .help = "Sizes."}, ExponentialBuckets(1024, 4, 3))
          .value();
  h->WithLabels({})->Observe(2000);
  std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("x_size_bytes_bucket{le=\"1024\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("x_size_bytes_bucket{le=\"4096\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("x_size_bytes_bucket{le=\"16384\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("x_size_bytes_sum 2000\nx_size_bytes_count 1\n"));
  EXPECT_EQ(LinearBuckets(0, 0.5, 3), (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(DefaultBuckets().front(), 0.005);
  EXPECT_TRUE(ExponentialBuckets(0, 2, 3).empty());
}

TEST(MetricsRegistryTest, HistogramBoundsAreChecked) {
  Registry r;
  auto unsorted = r.AddHistogram({.name = "a_seconds", .help = "h"}, {1, 0.5});
  EXPECT_FALSE(unsorted.ok());
  EXPECT_THAT(unsorted.status().message(), HasSubstr("strictly increasing"));
  EXPECT_FALSE(r.AddHistogram({.name = "b_seconds", .help = "h"}, {1, 1}).ok());
  EXPECT_FALSE(r.AddHistogram({.name = "c_seconds", .help = "h"}, {std::nan("")}).ok());
  auto inf = r.AddHistogram({.name = "d_seconds", .help = "h"}, {1, INFINITY});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)->WithLabels({})->bounds(), std::vector<double>{1});
  auto le = r.AddHistogram({.name = "e_seconds", .help = "h", .labels = {"le"}}, {1});
  EXPECT_THAT(le.status().message(), HasSubstr("bucket label"));
}

TEST(MetricsRegistryTest, RegistrationRules) {
  Registry r;
  ASSERT_TRUE(r.AddCounter({.name = "x_total", .help = "h"}).ok());
  auto dup = r.AddGauge({.name = "x_total", .help = "h", .check_conventions = false});
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(r.AddHistogram({.name = "y_seconds", .help = "h"}).ok());
  // Its samples' names are taken too.
  auto clash = r.AddGauge({.name = "y_seconds_count", .help = "h", .check_conventions = false});
  EXPECT_EQ(clash.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.status().message(), HasSubstr("y_seconds"));
  EXPECT_FALSE(r.AddGauge({.name = "z", .help = "h", .labels = {"a", "a"}}).ok());
  EXPECT_FALSE(r.AddGauge({.name = "z", .help = "h", .labels = {"__a"}}).ok());
  EXPECT_FALSE(r.AddGauge({.name = "bad-name", .help = "h"}).ok());
  EXPECT_FALSE(r.AddCounter({.name = "no_suffix", .help = "h"}).ok());
  // Foreign names skip the conventions, not the syntax.
  EXPECT_TRUE(
      r.AddGauge({.name = "DCGM_FI_DEV_FB_USED", .help = "h", .check_conventions = false}).ok());
}

TEST(MetricsRegistryTest, WrongLabelCountIsAnErrorOrADetachedSeries) {
  Registry r;
  auto* c = r.AddCounter({.name = "x_total", .help = "h", .labels = {"a", "b"}}).value();
  auto got = c->Get({"only-one"});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("takes 2 label values, not 1"));
  auto detached = c->WithLabels({"1", "2", "3"});
  ASSERT_NE(detached, nullptr);
  detached->Inc(5);  // harmless, never exported
  EXPECT_EQ(c->Misuses(), 1);
  EXPECT_EQ(c->Size(), 0u);
  EXPECT_EQ(r.Render(), "");
}

TEST(MetricsRegistryTest, TheSameLabelsGiveTheSameSeries) {
  Registry r;
  auto* c = r.AddCounter({.name = "x_total", .help = "h", .labels = {"a"}}).value();
  auto one = c->WithLabels({"v"});
  auto two = *c->Get({"v"});
  EXPECT_EQ(one.get(), two.get());
  // Values that join to the same text are still different series.
  auto* p = r.AddCounter({.name = "p_total", .help = "h", .labels = {"a", "b"}}).value();
  p->WithLabels({"x", ""})->Inc();
  p->WithLabels({"", "x"})->Inc(2);
  p->WithLabels({std::string("x\0", 2), ""})->Inc(4);
  EXPECT_EQ(p->Size(), 3u);
}

TEST(MetricsRegistryTest, RemovingLabelSetsForAFinishedJob) {
  Registry r;
  auto* util =
      r.AddGauge(
           {.name = "x_job_gpu_utilisation_ratio", .help = "h", .labels = {"namespace", "job"}})
          .value();
  auto* restarts =
      r.AddCounter({.name = "x_job_restarts_total", .help = "h", .labels = {"job", "namespace"}})
          .value();
  auto* other = r.AddGauge({.name = "x_queue_depth", .help = "h"}).value();
  util->WithLabels({"ml", "a"})->Set(0.9);
  util->WithLabels({"ml", "b"})->Set(0.5);
  util->WithLabels({"dev", "a"})->Set(0.1);
  auto held = restarts->WithLabels({"a", "ml"});
  held->Inc();
  restarts->WithLabels({"b", "ml"})->Inc();
  other->WithLabels({})->Set(3);

  EXPECT_EQ(r.RemoveMatching({{"namespace", "ml"}, {"job", "a"}}), 2u);
  auto s = ParseSamples(r.Render());
  EXPECT_EQ(s.count("x_job_gpu_utilisation_ratio{namespace=\"ml\",job=\"a\"}"), 0u);
  EXPECT_EQ(s.count("x_job_restarts_total{job=\"a\",namespace=\"ml\"}"), 0u);
  EXPECT_EQ(s.at("x_job_gpu_utilisation_ratio{namespace=\"dev\",job=\"a\"}"), 0.1);
  EXPECT_EQ(s.at("x_job_gpu_utilisation_ratio{namespace=\"ml\",job=\"b\"}"), 0.5);
  EXPECT_EQ(s.at("x_queue_depth"), 3);  // no such labels: untouched

  // Whoever still holds a removed series can use it; it is just no longer exported.
  held->Inc();
  EXPECT_EQ(held->Value(), 2);
  EXPECT_THAT(r.Render(), Not(HasSubstr("job=\"a\",namespace=\"ml\"")));
  // Asking again starts a fresh series at zero.
  EXPECT_EQ(restarts->WithLabels({"a", "ml"})->Value(), 0);

  EXPECT_TRUE(util->Remove({"ml", "b"}));
  EXPECT_FALSE(util->Remove({"ml", "b"}));
  EXPECT_FALSE(util->Remove({"too", "many", "values"}));
  util->Clear();
  EXPECT_EQ(util->Size(), 0u);
}

TEST(MetricsRegistryTest, CollectorsAreReadAtScrapeTime) {
  Registry r;
  std::atomic<int> calls{0};
  double reading = 40;
  int id = r.AddCollector([&](std::vector<CollectedFamily>* out) {
    ++calls;
    CollectedFamily f{.name = "x_gpu_temperature_celsius",
                      .help = "Temperature.",
                      .type = MetricType::kGauge,
                      .label_names = {"gpu"}};
    f.Add({"0"}, reading);
    f.Add({"1"}, reading + 1);
    out->push_back(std::move(f));
  });
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r.Render(),
            "# HELP x_gpu_temperature_celsius Temperature.\n"
            "# TYPE x_gpu_temperature_celsius gauge\n"
            "x_gpu_temperature_celsius{gpu=\"0\"} 40\n"
            "x_gpu_temperature_celsius{gpu=\"1\"} 41\n");
  reading = 50;
  EXPECT_THAT(r.Render(), HasSubstr("{gpu=\"1\"} 51\n"));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(r.RemoveCollector(id));
  EXPECT_FALSE(r.RemoveCollector(id));
  EXPECT_EQ(r.Render(), "");
}

// What a collector reads may be destroyed once RemoveCollector returns, even while a scrape
// was running it.
TEST(MetricsRegistryTest, RemoveCollectorWaitsForTheScrapesRunningIt) {
  Registry r;
  std::atomic<bool> entered{false}, remover_started{false}, removed{false};
  std::atomic<bool> removed_while_collecting{false};
  std::atomic<int> calls{0};
  const int id = r.AddCollector([&](std::vector<CollectedFamily>*) {
    ++calls;
    entered = true;
    ASSERT_TRUE(spawnpoint::testing::WaitUntil([&] { return remover_started.load(); },
                                               std::chrono::seconds(10)));
    // Give RemoveCollector every chance to return early if it did not wait (it must not).
    spawnpoint::testing::WaitUntil([&] { return removed.load(); }, std::chrono::milliseconds(100));
    removed_while_collecting = removed.load();
  });
  std::thread scrape([&] { r.Render(); });
  ASSERT_TRUE(
      spawnpoint::testing::WaitUntil([&] { return entered.load(); }, std::chrono::seconds(10)));
  std::thread remover([&] {
    remover_started = true;
    EXPECT_TRUE(r.RemoveCollector(id));
    removed = true;
  });
  scrape.join();
  remover.join();
  EXPECT_FALSE(removed_while_collecting) << "RemoveCollector returned while its collector ran";
  r.Render();
  EXPECT_EQ(calls, 1) << "never called after removal";
}

TEST(MetricsRegistryTest, CollectedSamplesJoinARegisteredFamilysGroup) {
  Registry r;
  auto* c =
      r.AddCounter({.name = "x_restarts_total", .help = "Restarts.", .labels = {"cause"}}).value();
  c->WithLabels({"died"})->Inc();
  ASSERT_TRUE(r.AddGauge({.name = "x_after", .help = "After."}).ok());
  r.AddCollector([](std::vector<CollectedFamily>* out) {
    CollectedFamily f{.name = "x_restarts_total",
                      .help = "ignored",
                      .type = MetricType::kCounter,
                      .label_names = {"cause"}};
    f.Add({"hung"}, 2);
    out->push_back(f);
  });
  std::string text = r.Render();
  EXPECT_EQ(text,
            "# HELP x_restarts_total Restarts.\n"
            "# TYPE x_restarts_total counter\n"
            "x_restarts_total{cause=\"died\"} 1\n"
            "x_restarts_total{cause=\"hung\"} 2\n"
            "# HELP x_after After.\n"
            "# TYPE x_after gauge\n"
            "x_after 0\n");
}

TEST(MetricsRegistryTest, InvalidCollectedFamiliesAreSkippedAndCounted) {
  Registry r;
  ASSERT_TRUE(r.AddGauge({.name = "x_taken", .help = "h"}).ok());
  r.AddCollector([](std::vector<CollectedFamily>* out) {
    out->push_back({.name = "bad name", .help = "h", .samples = {{{}, 1}}});
    out->push_back(
        {.name = "x_taken", .help = "h", .type = MetricType::kCounter, .samples = {{{}, 1}}});
    out->push_back({.name = "x_histogram", .help = "h", .type = MetricType::kHistogram});
    out->push_back({.name = "x_ms", .help = "h", .samples = {{{}, 1}}});
    CollectedFamily arity{.name = "x_ok", .help = "h", .label_names = {"a"}};
    arity.Add({"1"}, 1);
    arity.Add({"1", "2"}, 2);  // wrong arity: this sample only
    out->push_back(arity);
  });
  std::string text = r.Render();
  EXPECT_EQ(r.CollectErrors(), 5);
  EXPECT_THAT(text, HasSubstr("x_ok{a=\"1\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("bad name")));
  EXPECT_THAT(text, Not(HasSubstr("x_ms")));
  EXPECT_THAT(text, HasSubstr("x_taken 0\n"));
  EXPECT_EQ(ParseSamples(text).size(), 2u);
  EXPECT_THAT(r.LastCollectError(), HasSubstr("x_ok"));
}

// Many threads add to one counter and one histogram: nothing is lost.
TEST(MetricsRegistryConcurrencyTest, UpdatesFromManyThreadsAreAllCounted) {
  Registry r;
  auto* c = r.AddCounter({.name = "x_total", .help = "h", .labels = {"t"}}).value();
  auto* h = r.AddHistogram({.name = "x_seconds", .help = "h"}, {0.5}).value();
  constexpr int kThreads = 8, kPerThread = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto mine = c->WithLabels({std::to_string(t % 2)});
      auto hist = h->WithLabels({});
      for (int i = 0; i < kPerThread; ++i) {
        mine->Inc();
        hist->Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (auto& t : threads) t.join();
  auto s = ParseSamples(r.Render());
  EXPECT_EQ(s.at("x_total{t=\"0\"}") + s.at("x_total{t=\"1\"}"), kThreads * kPerThread);
  EXPECT_EQ(s.at("x_seconds_bucket{le=\"0.5\"}"), kThreads * kPerThread / 2);
  EXPECT_EQ(s.at("x_seconds_count"), kThreads * kPerThread);
  EXPECT_EQ(s.at("x_seconds_sum"), kThreads * (kPerThread / 2) * 1.25);
}

// Scrapes race observations, new label sets and removals: every scrape is well formed, a
// histogram's count equals its +Inf bucket, and counters never go backwards.
TEST(MetricsRegistryConcurrencyTest, ScrapesRacingUpdatesAreConsistent) {
  Registry r;
  auto* c = r.AddCounter({.name = "x_total", .help = "h"}).value();
  auto* h = r.AddHistogram({.name = "x_seconds", .help = "h"}, {0.1, 1}).value();
  auto* g = r.AddGauge({.name = "x_job_up", .help = "h", .labels = {"job"}}).value();
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      auto counter = c->WithLabels({});
      auto hist = h->WithLabels({});
      for (int i = 0; !stop; ++i) {
        counter->Inc();
        hist->Observe((i % 3) * 0.5);
        const std::string job = "j" + std::to_string(t) + "-" + std::to_string(i % 50);
        g->WithLabels({job})->Set(1);
        if (i % 7 == 0) r.RemoveMatching({{"job", job}});
      }
    });
  }
  double last_total = 0;
  const std::string type_line = "# TYPE x_job_up gauge\n";
  bool consistent = true;
  // At least 300 scrapes, and on until the writers have visibly moved on meanwhile (the
  // threads may start late on a busy machine), within a deadline.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double first_total = -1;
  for (int scrape = 0; consistent && std::chrono::steady_clock::now() < deadline &&
                       (scrape < 300 || first_total < 0 || last_total < first_total + 1000);
       ++scrape) {
    const std::string text = r.Render();
    auto s = ParseSamples(text);
    consistent = s.at("x_seconds_count") == s.at("x_seconds_bucket{le=\"+Inf\"}") &&
                 s.at("x_seconds_bucket{le=\"0.1\"}") <= s.at("x_seconds_bucket{le=\"1\"}") &&
                 s.at("x_total") >= last_total;
    last_total = s.at("x_total");
    if (first_total < 0 && last_total > 0) first_total = last_total;
    // Every family's samples come right after its own header.
    const size_t header = text.find(type_line);
    if (header != std::string::npos) {
      consistent = consistent && text.find("x_job_up{") == header + type_line.size();
    }
    EXPECT_TRUE(consistent) << "scrape " << scrape << ":\n" << text;
  }
  stop = true;
  for (auto& t : writers) t.join();
  EXPECT_GE(last_total, first_total + 1000) << "the scrapes never overlapped the updates";
}

}  // namespace
}  // namespace spawnpoint::metrics
