// The Python loader worker (agent/python/spawnpoint_rank/worker.py) on real processes: a
// StandalonePool spawns `/usr/bin/python3 -m spawnpoint_rank.worker` and the real C++
// PoolClient drives it with sample indices, as a Python rank's per-rank service will. The
// datasets and their pickle files come from python_datasets.py beside this file. Skipped
// (ctest: Skipped) when /usr/bin/python3 has no torch or numpy; a probe that crashes or hangs
// fails. The probe itself (tests/support/python_probe.h) is tested here too.
#include <signal.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/pool_client.h"
#include "agent/loader/pool_supervisor.h"
#include "tests/support/python_probe.h"
#include "tests/support/test_process.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kSource = SPAWNPOINT_SOURCE_DIR;
const std::string kPythonPath = kSource + "/agent/python:" + kSource + "/tests/loader";
const std::string kHelper = kSource + "/tests/loader/python_datasets.py";
// Every worker imports torch (seconds on a loaded machine): deadlines are generous.
constexpr std::chrono::seconds kDeadline(120);

// Runs python_datasets.py with these arguments; true when it succeeded.
bool RunHelper(std::vector<std::string> args) {
  args.insert(args.begin(), {kPython, kHelper});
  testing::TestProcess p(args, {{"PYTHONPATH", kPythonPath}});
  const int code = p.Wait(kDeadline * 2);
  EXPECT_EQ(code, 0) << p.Stderr();
  return code == 0;
}

// Sample indices lo, lo + 1, ..., hi - 1.
std::vector<int64_t> Range(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

const json& Field(const ReadyBatch& r, const json& node) {
  return r.fields.at(node.at("field").get<size_t>());
}
// The values of a field, read from the batch's slot as T.
template <typename T>
std::vector<T> Values(const PoolClient& client, const ReadyBatch& r, const json& field) {
  const auto* p =
      reinterpret_cast<const T*>(client.ring()->Slot(r.slot) + field.at("offset").get<size_t>());
  return std::vector<T>(p, p + field.at("nbytes").get<size_t>() / sizeof(T));
}

class PythonWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const auto missing =
        testing::MissingPythonModules(kPython, {"torch", "numpy"}, kDeadline);
    ASSERT_TRUE(missing.ok()) << missing.status().ToString();
    if (!missing->empty()) {
      GTEST_SKIP() << kPython << " has no " << ::testing::PrintToString(*missing)
                   << "; install python3-torch (scripts/install-deps.sh) to test the Python "
                   << "loader worker";
    }
  }

  // Writes the pickle of dataset `kind` and starts `workers` Python workers (through
  // `wrapper`, a shell script that ends by exec'ing "$@", when given).
  void StartPool(const std::string& kind, std::vector<std::string> helper_args = {},
                 int workers = 2, const std::string& wrapper = "") {
    workers_ = workers;
    helper_args.insert(helper_args.begin(), {"write", kind, pickle_});
    helper_args.insert(helper_args.end(), {"--workers", std::to_string(workers)});
    ASSERT_TRUE(RunHelper(helper_args));
    PoolSpec spec;
    spec.workers = workers;
    spec.dir = dir_.File("pool");
    spec.argv = {kPython, "-m", "spawnpoint_rank.worker"};
    if (!wrapper.empty()) spec.argv.insert(spec.argv.begin(), {"/bin/sh", "-c", wrapper, "sh"});
    for (char** e = environ; *e; ++e) {
      if (std::string(*e).rfind("PYTHONPATH=", 0) != 0) spec.env.push_back(*e);
    }
    spec.env.push_back("PYTHONPATH=" + kPythonPath);
    auto pool = StandalonePool::Start(spec);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(pool).value();
  }

  PoolClientOptions ClientOptions() const {
    return {.dir = pool_->dir(),
            .workers = workers_,
            .initial_active = workers_,
            .timeout = kDeadline,
            .dataset = "python",
            .dataset_arg = pickle_,
            .probe_batch = [](int64_t) { return Range(0, 4); }};
  }

  static StatusOr<std::optional<ReadyBatch>> Take(PoolClient& c, int64_t epoch, int64_t batch) {
    return c.Take(epoch, batch, kDeadline);
  }

  testing::TempDir dir_;
  const std::string pickle_ = dir_.File("loader.pickle");
  int workers_ = 2;
  std::unique_ptr<StandalonePool> pool_;
};

// Sample i is (a float tensor of 3 values i, label i), collated by torch's default_collate
// into two tensors (in a list, as default_collate collates tuples).
void ExpectIndexBatch(const PoolClient& client, const ReadyBatch& r) {
  const json expected_tree = {
      {"t", "list"}, {"items", {{{"t", "tensor"}, {"field", 0}}, {{"t", "tensor"}, {"field", 1}}}}};
  ASSERT_EQ(r.tree, expected_tree) << r.tree.dump();
  const json& x = r.fields.at(0);
  const json& label = r.fields.at(1);
  const auto n = static_cast<int64_t>(r.indices.size());
  EXPECT_EQ(x.at("name"), "0");
  EXPECT_EQ(x.at("dtype"), "f32");
  EXPECT_EQ(x.at("shape"), json({n, 3}));
  EXPECT_EQ(label.at("name"), "1");
  EXPECT_EQ(label.at("dtype"), "i64");
  EXPECT_EQ(label.at("offset").get<size_t>() % 64, 0u);
  const auto values = Values<float>(client, r, x);
  ASSERT_EQ(values.size(), r.indices.size() * 3);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(values[i], static_cast<float>(r.indices[i / 3])) << "value " << i;
  }
  EXPECT_EQ(Values<int64_t>(client, r, label), r.indices);
}

// Takes the submitted batches of `epoch` in order, checks each, and expects samples 0 ..
// size - 1 exactly once in all. `before(b)` runs before batch b is taken.
void ExpectEverySampleOnce(PoolClient& client, int64_t epoch,
                           const std::vector<std::vector<int64_t>>& batches, int64_t size,
                           const std::function<void(int64_t)>& before = nullptr) {
  std::multiset<int64_t> seen;
  for (int64_t b = 0; b < static_cast<int64_t>(batches.size()); ++b) {
    if (before) before(b);
    auto r = client.Take(epoch, b, kDeadline);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value()) << "batch " << b;
    EXPECT_EQ((*r)->indices, batches[static_cast<size_t>(b)]);
    ExpectIndexBatch(client, **r);
    seen.insert((*r)->indices.begin(), (*r)->indices.end());
    client.Release((*r)->slot);
  }
  const std::vector<int64_t> all = Range(0, size);
  EXPECT_EQ(seen, std::multiset<int64_t>(all.begin(), all.end())) << "epoch " << epoch;
}

TEST_F(PythonWorkerTest, EverySampleOfAnEpochArrivesOnceWithItsValues) {
  StartPool("index", {"--size", "40"});
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  EXPECT_EQ(client.dataset_size(), 40);
  const std::vector<pid_t> pids = client.WorkerPids();
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    // A shuffled order: sample (7 k) mod 40 at position k.
    std::vector<std::vector<int64_t>> batches(10);
    for (int64_t k = 0; k < 40; ++k) batches[k / 4].push_back(k * 7 % 40);
    client.Submit(epoch, 0, batches);
    ExpectEverySampleOnce(client, epoch, batches, 40);
  }
  EXPECT_EQ(client.WorkerPids(), pids);  // persistent across epochs
}

TEST_F(PythonWorkerTest, NestedBatchRoundTripsThroughFieldsAndTree) {
  StartPool("nested", {"--size", "20"});
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  client.Submit(0, 0, {{5, 2, 9}});
  auto r = Take(client, 0, 0);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  const ReadyBatch& b = **r;
  const json& tree = b.tree;
  ASSERT_EQ(tree.at("t"), "dict") << tree.dump();
  std::map<std::string, json> items;
  for (size_t i = 0; i < tree.at("keys").size(); ++i) {
    ASSERT_EQ(tree["keys"][i].at("t"), "value");
    items[tree["keys"][i].at("v").get<std::string>()] = tree["items"][i];
  }
  ASSERT_EQ(items.size(), 5u) << tree.dump();

  const json& x = Field(b, items["x"]);
  EXPECT_EQ(items["x"].at("t"), "tensor");
  EXPECT_EQ(x.at("name"), "x");
  EXPECT_EQ(x.at("shape"), json({3, 3}));
  EXPECT_EQ(Values<float>(client, b, x), std::vector<float>({5, 5, 5, 2, 2, 2, 9, 9, 9}));

  EXPECT_EQ(items["ids"], json({{"t", "list"},
                                {"items",
                                 {{{"t", "value"}, {"v", 5}},
                                  {{"t", "value"}, {"v", 2}},
                                  {{"t", "value"}, {"v", 9}}}}}));
  EXPECT_EQ(items["name"], json({{"t", "value"}, {"v", "batch-5-2-9"}}));

  const json& extra = items["extra"];
  ASSERT_EQ(extra.at("t"), "list");
  ASSERT_EQ(extra.at("items").size(), 3u);
  EXPECT_EQ(extra["items"][0].at("t"), "ndarray");
  const json& arange = Field(b, extra["items"][0]);
  EXPECT_EQ(arange.at("name"), "extra.0");
  EXPECT_EQ(arange.at("dtype"), "i16");
  EXPECT_EQ(Values<int16_t>(client, b, arange), std::vector<int16_t>({0, 1, 2}));
  EXPECT_EQ(extra["items"][1], json({{"t", "value"}, {"v", nullptr}}));
  EXPECT_EQ(extra["items"][2],
            json({{"t", "tuple"},
                  {"items", {{{"t", "value"}, {"v", 1.5}}, {{"t", "value"}, {"v", true}}}}}));

  // bfloat16: the upper half of the float32's bits.
  const json& bf = Field(b, items["bf"]);
  EXPECT_EQ(bf.at("dtype"), "bf16");
  std::vector<uint16_t> expected;
  for (float f : {5.0f, 2.0f, 9.0f}) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    expected.push_back(static_cast<uint16_t>(bits >> 16));
  }
  EXPECT_EQ(Values<uint16_t>(client, b, bf), expected);
  // Every field at an aligned offset, none overlapping.
  size_t end = 0;
  for (const json& f : b.fields) {
    EXPECT_EQ(f.at("offset").get<size_t>() % 64, 0u);
    EXPECT_GE(f.at("offset").get<size_t>(), end);
    end = f.at("offset").get<size_t>() + f.at("nbytes").get<size_t>();
  }
}

// Expects a batch of SeedDataset to be `want`, the stock DataLoader's batch (as
// python_datasets.py stock writes it) built by one of `workers` workers: the same samples,
// random draws, worker id and seed.
void ExpectStockBatch(const PoolClient& client, const ReadyBatch& got, const json& want,
                      int64_t workers) {
  std::map<std::string, json> items;
  for (size_t i = 0; i < got.tree.at("keys").size(); ++i) {
    items[got.tree["keys"][i].at("v").get<std::string>()] = got.tree["items"][i];
  }
  std::vector<double> flat;
  for (const auto& row : want.at("x")) {
    for (const auto& v : row) flat.push_back(v.get<double>());
  }
  const auto n = want.at("wid").size();
  EXPECT_EQ(Values<double>(client, got, Field(got, items["x"])), flat)
      << "epoch " << got.epoch << " batch " << got.batch;
  EXPECT_EQ(Values<int64_t>(client, got, Field(got, items["wid"])),
            want.at("wid").get<std::vector<int64_t>>());
  EXPECT_EQ(Values<int64_t>(client, got, Field(got, items["seed"])),
            want.at("seed").get<std::vector<int64_t>>());
  EXPECT_EQ(Values<int64_t>(client, got, Field(got, items["nw"])),
            std::vector<int64_t>(n, workers));
}

// The pool's batches are compared with a stock DataLoader(num_workers=2, spawn) run with a
// generator seeded the same: both draw base_seed from it first. Batches are submitted one at
// a time, so PoolClient gives batch b to worker b % 2, DataLoader's round robin; then every
// worker's torch, numpy and random streams must give the same values, batch by batch.
TEST_F(PythonWorkerTest, WorkerSeedsAndInfoMatchStockDataLoader) {
  const std::string stock = dir_.File("stock.json");
  ASSERT_TRUE(
      RunHelper({"stock", stock, "--size", "24", "--batch", "4", "--generator-seed", "1234"}));
  const json expected = json::parse(testing::ReadFile(stock));
  ASSERT_EQ(expected.size(), 6u);
  StartPool("seed", {"--size", "24", "--generator-seed", "1234"});
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  for (int64_t b = 0; b < 6; ++b) {
    client.Submit(0, b, {Range(4 * b, 4 * b + 4)});
    auto r = Take(client, 0, b);
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    EXPECT_EQ((*r)->worker, b % 2);
    ExpectStockBatch(client, **r, expected[static_cast<size_t>(b)], 2);
    client.Release((*r)->slot);
  }
}

// Persistent workers over two shuffled epochs whose length (7 batches) is no multiple of
// the workers (3), one worker slower than the others, and every batch of an epoch submitted
// at once: strict round robin still gives batch b to worker b % 3, restarting at worker 0
// each epoch as DataLoader's _reset does, so the batches are the stock DataLoader's
// (persistent_workers=True, the same generator seed), random draws included.
TEST_F(PythonWorkerTest, StrictRoundRobinMatchesStockPersistentWorkersOverShuffledEpochs) {
  constexpr int64_t kBatches = 13;  // of 4 samples, per epoch
  const std::vector<std::string> shape = {"--size",        "52", "--generator-seed", "77",
                                          "--slow-worker", "1"};
  std::vector<std::string> stock = {"stock", dir_.File("stock.json"), "--batch", "4"};
  for (const char* a : {"--workers", "3", "--epochs", "2", "--shuffle"}) stock.push_back(a);
  stock.insert(stock.end(), shape.begin(), shape.end());
  ASSERT_TRUE(RunHelper(stock));
  const json expected = json::parse(testing::ReadFile(dir_.File("stock.json")));
  ASSERT_EQ(expected.size(), static_cast<size_t>(2 * kBatches));
  StartPool("seed", shape, 3);
  PoolClientOptions o = ClientOptions();
  o.strict_round_robin = true;
  // The probe (samples 0-3) is not the first batch: worker 0 rewinds the streams it drew.
  PoolClient client(o);
  ASSERT_TRUE(client.Start().ok());
  const std::vector<pid_t> pids = client.WorkerPids();
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto want = [&](int64_t b) -> const json& {
      return expected[static_cast<size_t>(kBatches * epoch + b)];
    };
    std::vector<std::vector<int64_t>> batches;
    for (int64_t b = 0; b < kBatches; ++b) {
      batches.push_back(want(b).at("indices").get<std::vector<int64_t>>());
    }
    client.Submit(epoch, 0, batches);
    for (int64_t b = 0; b < kBatches; ++b) {
      auto r = Take(client, epoch, b);
      ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
      EXPECT_EQ((*r)->worker, b % 3) << "epoch " << epoch << " batch " << b;
      ExpectStockBatch(client, **r, want(b), 3);
      client.Release((*r)->slot);
    }
  }
  EXPECT_EQ(client.WorkerPids(), pids);
}

// A wrong prediction of the next epoch (the rank service's speculative batches): the workers
// build some of it (one batch taken, the others perhaps built, perhaps still queued), the
// epoch is dropped and rewound, and the real next epoch, under a new number, is then the
// stock DataLoader's second epoch draw for draw, as if the voided batches had never been
// built.
TEST_F(PythonWorkerTest, ARewoundEpochLeavesTheWorkersStreamsAsIfNothingOfItWasBuilt) {
  constexpr int64_t kBatches = 6;  // of 4 samples, per epoch
  const std::vector<std::string> shape = {"--size", "24", "--generator-seed", "31"};
  std::vector<std::string> stock = {"stock", dir_.File("stock.json"), "--batch", "4"};
  for (const char* a : {"--workers", "2", "--epochs", "2", "--shuffle"}) stock.push_back(a);
  stock.insert(stock.end(), shape.begin(), shape.end());
  ASSERT_TRUE(RunHelper(stock));
  const json expected = json::parse(testing::ReadFile(dir_.File("stock.json")));
  ASSERT_EQ(expected.size(), static_cast<size_t>(2 * kBatches));
  StartPool("seed", shape, 2);
  PoolClientOptions o = ClientOptions();
  o.strict_round_robin = true;
  o.slot_bytes = 1 << 16;  // no probe: the first task of worker 0 is batch 0
  PoolClient client(o);
  ASSERT_TRUE(client.Start().ok());
  const auto indices = [&](int64_t epoch, int64_t b) {
    return expected[static_cast<size_t>(kBatches * epoch + b)]
        .at("indices")
        .get<std::vector<int64_t>>();
  };
  const auto run_epoch = [&](int64_t wire_epoch, int64_t stock_epoch) {
    std::vector<std::vector<int64_t>> batches;
    for (int64_t b = 0; b < kBatches; ++b) batches.push_back(indices(stock_epoch, b));
    client.Submit(wire_epoch, 0, batches);
    for (int64_t b = 0; b < kBatches; ++b) {
      auto r = Take(client, wire_epoch, b);
      ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
      ExpectStockBatch(client, **r, expected[static_cast<size_t>(kBatches * stock_epoch + b)], 2);
      client.Release((*r)->slot);
    }
  };
  run_epoch(0, 0);
  // The prediction: epoch 0's order again (wrong: the real epoch 1 is shuffled anew).
  std::vector<std::vector<int64_t>> predicted;
  for (int64_t b = 0; b < 4; ++b) predicted.push_back(indices(0, b));
  ASSERT_NE(predicted[0], indices(1, 0));
  client.Submit(1, 0, predicted);
  auto built = Take(client, 1, 0);
  ASSERT_TRUE(built.ok() && built->has_value()) << built.status().ToString();
  client.Release((*built)->slot);
  client.DropAllBut(2);
  client.Rewind(1);
  run_epoch(2, 1);
}

// start_waits_for_all_workers = false (the rank service's setting, for pools that stagger
// their workers' start-up): worker 1 is held back before it even starts Python, yet Start()
// returns and batch 0 arrives from worker 0; batch 1 waits for worker 1 and comes from it.
TEST_F(PythonWorkerTest, TheFirstBatchDoesNotWaitForALateWorker) {
  const std::string go = dir_.File("go");
  StartPool("index", {"--size", "16"}, 2,
            "if [ \"$SPAWNPOINT_LOADER_WORKER_ID\" = 1 ]; then\n"
            "  while [ ! -e '" +
                go +
                "' ]; do sleep 0.01; done\n"
                "fi\n"
                "exec \"$@\"\n");
  PoolClientOptions o = ClientOptions();
  o.strict_round_robin = true;
  o.start_waits_for_all_workers = false;
  PoolClient client(o);
  ASSERT_TRUE(client.Start().ok());
  EXPECT_EQ(client.WorkerPids().at(1), 0) << "worker 1 said Hello before it was let go";
  client.Submit(0, 0, {Range(0, 4), Range(4, 8)});
  auto first = Take(client, 0, 0);
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status().ToString();
  EXPECT_EQ((*first)->worker, 0);
  ExpectIndexBatch(client, **first);
  client.Release((*first)->slot);
  EXPECT_EQ(client.WorkerPids().at(1), 0);
  testing::WriteFile(go, "");
  auto second = Take(client, 0, 1);
  ASSERT_TRUE(second.ok() && second->has_value()) << second.status().ToString();
  EXPECT_EQ((*second)->worker, 1);
  ExpectIndexBatch(client, **second);
  client.Release((*second)->slot);
}

TEST_F(PythonWorkerTest, ADatasetExceptionCarriesThePythonTracebackAndTheWorkerGoesOn) {
  StartPool("failing", {"--size", "20", "--bad", "6"});
  std::vector<pid_t> pids;
  {
    PoolClient client(ClientOptions());
    ASSERT_TRUE(client.Start().ok());
    pids = client.WorkerPids();
    client.Submit(0, 0, {Range(0, 4), Range(4, 8), Range(8, 12)});
    auto first = Take(client, 0, 0);
    ASSERT_TRUE(first.ok() && first->has_value()) << first.status().ToString();
    ExpectIndexBatch(client, **first);
    auto failed = Take(client, 0, 1);
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(
        failed.status().message(),
        AllOf(HasSubstr("failed on sample index 6"),
              HasSubstr("Caught ValueError in DataLoader worker process 1"),
              HasSubstr("Traceback (most recent call last)"), HasSubstr("python_datasets.py"),
              HasSubstr("in __getitem__"), HasSubstr("ValueError: sample 6 is broken on purpose")));
  }
  // A new rank (the error sticks to a client) reaches the same workers, which serve on.
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  EXPECT_EQ(client.WorkerPids(), pids);
  client.Submit(0, 0, {Range(8, 12), Range(12, 16)});
  for (int64_t b = 0; b < 2; ++b) {
    auto r = Take(client, 0, b);
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    ExpectIndexBatch(client, **r);
    client.Release((*r)->slot);
  }
}

TEST_F(PythonWorkerTest, APickleTheWorkersCannotLoadFailsStartWithTheirReason) {
  StartPool("index", {"--size", "8"});
  PoolClientOptions o = ClientOptions();
  o.dataset_arg = dir_.File("missing.pickle");
  PoolClient client(o);
  const Status st = client.Start();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), AllOf(HasSubstr("cannot serve dataset \"python\""),
                                  HasSubstr("cannot load the DataLoader from " + o.dataset_arg),
                                  HasSubstr("FileNotFoundError")));
}

TEST_F(PythonWorkerTest, ASigkilledWorkerIsReplacedAndEverySampleStillArrivesOnce) {
  StartPool("index", {"--size", "200"});
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  const std::vector<pid_t> pids = client.WorkerPids();
  std::vector<std::vector<int64_t>> batches;
  for (int64_t b = 0; b < 50; ++b) batches.push_back(Range(4 * b, 4 * b + 4));
  client.Submit(0, 0, batches);
  ExpectEverySampleOnce(client, 0, batches, 200, [&](int64_t b) {
    if (b == 5) {
      ASSERT_EQ(kill(pids[1], SIGKILL), 0);
    }
  });
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        const auto now = client.WorkerPids();
        return now[1] != pids[1] && now[1] > 0;
      },
      kDeadline));
  EXPECT_EQ(client.WorkerPids()[0], pids[0]);
}

// The probe that decides the skip above: only a module that is not installed skips; an
// installed one that cannot be imported, crashes or hangs fails the test that asked.
class PythonProbeTest : public ::testing::Test {
 protected:
  // A module `name` in a directory on the probe's PYTHONPATH, with this body.
  void Module(const std::string& name, const std::string& body) {
    testing::WriteFile(dir_.File(name + ".py"), body);
  }
  StatusOr<std::vector<std::string>> Probe(const std::vector<std::string>& modules,
                                           std::chrono::milliseconds timeout = kDeadline) {
    return testing::MissingPythonModules(kPython, modules, timeout, {{"PYTHONPATH", dir_.path()}});
  }
  testing::TempDir dir_;
};

TEST_F(PythonProbeTest, ModulesNotInstalledAreNamedInOrder) {
  auto missing = Probe({"json", "sp_probe_absent_b", "os", "sp_probe_absent_a"});
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_EQ(*missing, (std::vector<std::string>{"sp_probe_absent_b", "sp_probe_absent_a"}));
  missing = Probe({"json", "os"});
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_TRUE(missing->empty());
}

TEST_F(PythonProbeTest, AnInstalledModuleThatFailsToImportIsAnError) {
  Module("sp_probe_broken",
         "raise ImportError('libsp_probe.so: cannot open shared object file')\n");
  auto missing = Probe({"sp_probe_broken"});
  ASSERT_FALSE(missing.ok()) << "a broken install passed for a missing module";
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("sp_probe_broken"), HasSubstr("exit 1"),
                    HasSubstr("installed but cannot be imported"), HasSubstr("libsp_probe.so")));
}

TEST_F(PythonProbeTest, AModuleWhoseDependencyIsMissingIsAnError) {
  Module("sp_probe_needs", "import sp_probe_absent_dependency\n");
  auto missing = Probe({"sp_probe_needs"});
  ASSERT_FALSE(missing.ok()) << "a missing dependency passed for a missing module";
  EXPECT_THAT(missing.status().message(), HasSubstr("sp_probe_absent_dependency"));
}

TEST_F(PythonProbeTest, AnImportThatCrashesIsAnError) {
  Module("sp_probe_crash", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n");
  auto missing = Probe({"sp_probe_crash"});
  ASSERT_FALSE(missing.ok()) << "a crash passed for a missing module";
  EXPECT_THAT(missing.status().message(), HasSubstr("killed by signal 11"));
}

TEST_F(PythonProbeTest, AnImportThatHangsIsAnError) {
  Module("sp_probe_hang", "import threading\nthreading.Event().wait()\n");
  auto missing = Probe({"sp_probe_hang"}, std::chrono::milliseconds(500));
  ASSERT_FALSE(missing.ok()) << "a hang passed for a missing module";
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded) << missing.status().ToString();
}

}  // namespace
}  // namespace spawnpoint::loader
