// The NVML backend when NVML answers a query with an error: every query it makes, with each
// of NOT_SUPPORTED, NO_PERMISSION, GPU_IS_LOST and UNINITIALIZED, injected by the fake NVML
// library ("fail" lines, tests/fakes/fake_nvml.c) into device 0 of two. The fake writes junk
// into a failed query's outputs, so a backend that used them would report a wrong number.
// What must happen: the value is absent (never a wrong number, never a crash), a lost GPU is
// reported unhealthy with the call and the reason, an identity the backend cannot read fails
// Discover() with the call, the device and NVML's words, and device 1 is untouched.
#include <cstdio>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/devices/assignment.h"
#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "tests/devices/fake_nvml_library.h"
#include "tests/fakes/fake_sysfs.h"

namespace spawnpoint::devices {
namespace {

using testing::FakeNvmlLibrary;
using testing::FakeSysfs;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScopedNvmlConfig;

// Says which fake library the tests load (nvml_header_abi checks that it is its own).
class FakeNvmlLibraryLine : public ::testing::Environment {
 public:
  void SetUp() override { std::printf("fake NVML library: %s\n", FakeNvmlLibrary().c_str()); }
};
[[maybe_unused]] ::testing::Environment* const kLibraryLine =
    ::testing::AddGlobalTestEnvironment(new FakeNvmlLibraryLine);

// Two H200s: device 0 (bus 19) takes the injected failures, device 1 (bus 3b) none.
constexpr const char* kTwoGpus =
    "GPU-00000000-0000-4000-8000-000000000019|NVIDIA H200|00000000:19:00.0|"
    "150754820096|40000000000|75|500000|55|0\n"
    "GPU-00000000-0000-4000-8000-00000000003b|NVIDIA H200|00000000:3B:00.0|"
    "150754820096|20000000000|25|300000|45|0\n";

struct Reading {
  std::string uuid, bus_id;
  uint64_t memory_total, memory_used;
  double utilisation, watts, celsius;
};
const Reading kDevice[2] = {{"GPU-00000000-0000-4000-8000-000000000019", "0000:19:00.0",
                             150754820096u, 40000000000u, 0.75, 500.0, 55.0},
                            {"GPU-00000000-0000-4000-8000-00000000003b", "0000:3b:00.0",
                             150754820096u, 20000000000u, 0.25, 300.0, 45.0}};

// What the backend does with the value a query returns.
enum class Use {
  kCount,     // how many devices: both calls fail
  kHandle,    // the device itself
  kIdentity,  // UUID, PCI bus id: Discover() needs them
  kName,      // the model name: Discover() leaves it empty
  kMemory,    // memory: Discover()'s total and Sample()'s used and total
  kMetric,    // one of Sample()'s readings
  kHealth,    // pending ECC repairs: Discover()'s health
};

struct Query {
  const char* symbol;    // the entry point the fake makes fail
  const char* reported;  // how the backend's messages name it
  Use use;
};
const Query kQueries[] = {
    {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount_v2()", Use::kCount},
    {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex_v2", Use::kHandle},
    {"nvmlDeviceGetUUID", "nvmlDeviceGetUUID", Use::kIdentity},
    {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", Use::kIdentity},
    {"nvmlDeviceGetName", "nvmlDeviceGetName", Use::kName},
    {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", Use::kMemory},
    {"nvmlDeviceGetUtilizationRates", "", Use::kMetric},
    {"nvmlDeviceGetPowerUsage", "", Use::kMetric},
    {"nvmlDeviceGetTemperature", "", Use::kMetric},
    {"nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRetiredPagesPendingStatus",
     Use::kHealth},
    {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRemappedRows", Use::kHealth},
};

struct NvmlError {
  const char* name;  // as the fake's config takes it
  int code;
  const char* text;  // nvmlErrorString's
};
const NvmlError kErrors[] = {
    {"NOT_SUPPORTED", 3, "Not Supported"},
    {"NO_PERMISSION", 4, "Insufficient Permissions"},
    {"GPU_IS_LOST", 15, "GPU is lost"},
    {"UNINITIALIZED", 1, "Uninitialized"},
};

// gtest prints parameters with these (not as bytes).
void PrintTo(const Query& q, std::ostream* os) { *os << q.symbol; }
void PrintTo(const NvmlError& e, std::ostream* os) { *os << e.name; }

std::string Words(const NvmlError& e) {
  return std::string(e.text) + " (NVML error " + std::to_string(e.code) + ")";
}

const GpuDevice* Find(const std::vector<GpuDevice>& gpus, int index) {
  for (const auto& g : gpus) {
    if (g.index == index) return &g;
  }
  return nullptr;
}

// Device i as discovered when nothing failed.
void ExpectDiscovered(const GpuDevice& g, int i) {
  SCOPED_TRACE("device " + std::to_string(i));
  EXPECT_TRUE(g.healthy) << g.unhealthy_reason;
  EXPECT_EQ(g.uuid, kDevice[i].uuid);
  EXPECT_EQ(g.pci_bus_id, kDevice[i].bus_id);
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.memory_total_bytes, kDevice[i].memory_total);
}

// Sample of device i: each reading the one configured, or absent where `absent` says.
struct Absent {
  bool memory = false, utilisation = false, power = false, temperature = false;
};
void ExpectSampled(const GpuSample& s, int i, Absent absent = {}) {
  SCOPED_TRACE("sample of device " + std::to_string(i));
  EXPECT_EQ(s.index, i);
  auto check = [](const auto& value, bool is_absent, auto expected, const char* what) {
    if (is_absent) {
      EXPECT_FALSE(value.has_value()) << what << " reported as " << *value;
    } else {
      ASSERT_TRUE(value.has_value()) << what;
      EXPECT_EQ(*value, expected) << what;
    }
  };
  check(s.memory_total_bytes, absent.memory, kDevice[i].memory_total, "memory total");
  check(s.memory_used_bytes, absent.memory, kDevice[i].memory_used, "memory used");
  check(s.utilisation, absent.utilisation, kDevice[i].utilisation, "utilisation");
  check(s.power_watts, absent.power, kDevice[i].watts, "power");
  check(s.temperature_celsius, absent.temperature, kDevice[i].celsius, "temperature");
}

class NvmlErrorTest : public ::testing::TestWithParam<std::tuple<Query, NvmlError>> {};

TEST_P(NvmlErrorTest, ValueAbsentNeverWrong) {
  const auto& [query, error] = GetParam();
  FakeSysfs sys;
  ScopedNvmlConfig config(
      sys.WriteFile("nvml.conf", std::string(kTwoGpus) + "fail " + query.symbol + " " + error.name +
                                     (query.use == Use::kCount ? "" : " 0") + "\n"));
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto gpus = (*backend)->Discover();
  auto samples = (*backend)->Sample();
  const bool lost = error.code == 15;

  if (query.use == Use::kCount) {
    for (const Status& s : {gpus.status(), samples.status()}) {
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.code(), StatusCode::kUnavailable);
      EXPECT_THAT(s.message(),
                  HasSubstr(std::string("NVML nvmlDeviceGetCount_v2() failed: ") + Words(error)));
    }
    return;
  }

  // Sample(): device 1 whole; device 0 without what failed.
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 2u);
  ExpectSampled((*samples)[1], 1);
  const std::string symbol = query.symbol;
  Absent absent;
  if (query.use == Use::kHandle) absent = {true, true, true, true};
  if (query.use == Use::kMemory) absent.memory = true;
  absent.utilisation |= symbol == "nvmlDeviceGetUtilizationRates";
  absent.power |= symbol == "nvmlDeviceGetPowerUsage";
  absent.temperature |= symbol == "nvmlDeviceGetTemperature";
  ExpectSampled((*samples)[0], 0, absent);

  // Discover(): an identity the backend cannot read is an error, unless the GPU is lost (or,
  // for the handle, may not be opened): then that GPU is reported, unhealthy.
  const bool identity = query.use == Use::kHandle || query.use == Use::kIdentity;
  const bool reported_unhealthy =
      lost || (query.use == Use::kHandle && error.code == 4 /* NO_PERMISSION */);
  if (identity && !reported_unhealthy) {
    ASSERT_FALSE(gpus.ok());
    EXPECT_EQ(gpus.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(gpus.status().message(), HasSubstr(std::string("NVML ") + query.reported +
                                                   "(index 0) failed: " + Words(error)));
    return;
  }
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 2u);
  const GpuDevice* g1 = Find(*gpus, 1);
  const GpuDevice* g0 = Find(*gpus, 0);
  ASSERT_TRUE(g0 && g1);
  ExpectDiscovered(*g1, 1);
  if (query.use == Use::kMetric) {  // Discover() does not ask for these
    ExpectDiscovered(*g0, 0);
    return;
  }
  if (lost || reported_unhealthy) {
    EXPECT_FALSE(g0->healthy);
    EXPECT_THAT(g0->unhealthy_reason,
                HasSubstr(std::string(query.reported) + ": " + Words(error) + "; "));
    EXPECT_THAT(g0->unhealthy_reason,
                HasSubstr(lost ? "reset or replace the GPU" : "may not open the GPU"));
  } else {
    EXPECT_TRUE(g0->healthy) << "a failed " << symbol
                             << " is no verdict on the GPU, but: " << g0->unhealthy_reason;
  }
  // Nothing of what failed is reported, nor anything of the junk the fake left behind.
  const bool no_handle = query.use == Use::kHandle;
  EXPECT_EQ(g0->uuid, no_handle || symbol == "nvmlDeviceGetUUID" ? "" : kDevice[0].uuid);
  EXPECT_EQ(g0->pci_bus_id,
            no_handle || symbol == "nvmlDeviceGetPciInfo_v3" ? "" : kDevice[0].bus_id);
  EXPECT_EQ(g0->name, no_handle || query.use == Use::kName ? "" : "NVIDIA H200");
  EXPECT_EQ(g0->memory_total_bytes,
            no_handle || query.use == Use::kMemory ? 0u : kDevice[0].memory_total);
  EXPECT_EQ(g0->vendor, "nvidia");
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<Query, NvmlError>>& info) {
  return std::string(std::get<0>(info.param).symbol) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(EveryQueryEveryError, NvmlErrorTest,
                         ::testing::Combine(::testing::ValuesIn(kQueries),
                                            ::testing::ValuesIn(kErrors)),
                         ParamName);

// A GPU the agent may not open is passed over when the machine has enough others (local mode),
// and named when the pod needed it.
TEST(NvmlErrorAssignmentTest, GpuWithoutPermissionIsPassedOverOrNamed) {
  FakeSysfs sys;
  ScopedNvmlConfig config(sys.WriteFile(
      "nvml.conf", std::string(kTwoGpus) + "fail nvmlDeviceGetHandleByIndex_v2 NO_PERMISSION 0\n"));
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  const CpuTopology cpus{{NumaNode{0, {0, 1, 2, 3}}}};
  auto one = AssignRanks(*gpus, cpus, 1, 1, api::GpuAssignment::kShared);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ((*one)[0].visible.size(), 1u);
  EXPECT_EQ((*one)[0].visible[0].uuid, kDevice[1].uuid);
  auto two = AssignRanks(*gpus, cpus, 2, 2, api::GpuAssignment::kShared);
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(two.status().message(), HasSubstr("Insufficient Permissions (NVML error 4)"));
}

// A config whose failure names no entry point the fake has must not inject nothing quietly.
TEST(FakeNvmlConfigTest, BadFailLineFailsInit) {
  FakeSysfs sys;
  for (const char* line :
       {"fail nvmlDeviceGetPowerUsge NOT_SUPPORTED 0", "fail nvmlDeviceGetPowerUsage NOT_A_CODE",
        "fail nvmlDeviceGetPowerUsage", "fail nvmlDeviceGetPowerUsage NOT_SUPPORTED 64",
        "fail nvmlDeviceGetCount_v2 NOT_SUPPORTED 0"}) {
    SCOPED_TRACE(line);
    ScopedNvmlConfig config(sys.WriteFile("bad.conf", std::string(kTwoGpus) + line + "\n"));
    auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
    ASSERT_FALSE(backend.ok());
    EXPECT_THAT(backend.status().message(), HasSubstr("Unknown Error (NVML error 999)"));
    EXPECT_THAT(backend.status().message(), Not(HasSubstr("\n")));
  }
}

}  // namespace
}  // namespace spawnpoint::devices
