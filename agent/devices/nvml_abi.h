/* The part of NVIDIA's nvml.h that spawnpoint uses, declared by hand with nvml.h's names,
 * layouts and calling convention, so that the agent builds without the CUDA toolkit and runs
 * without the driver (NVML is loaded with dlopen). One copy serves both users: the NVML
 * backend (C++: namespace spawnpoint::devices::nvml_abi, and NvmlApi, the entry points it
 * binds) and the fake libnvidia-ml of the tests (C: global names and prototypes). The test
 * nvml_header_abi (tests/devices/nvml_header_check.sh) checks every type, field offset,
 * constant and entry point here against nvml.h of the go-nvml module pinned in tools/nvml.
 * Declarations only: nothing to synchronise. */
#ifndef SPAWNPOINT_AGENT_DEVICES_NVML_ABI_H_
#define SPAWNPOINT_AGENT_DEVICES_NVML_ABI_H_

#ifdef __cplusplus
namespace spawnpoint::devices::nvml_abi {
#endif

/* nvml.h's values for the codes named here; any other code NVML returns is passed on as is. */
typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* An opaque device handle. NVML 13's nvml.h wraps the pointer in a struct; older headers
 * declared the bare pointer, which the x86-64 and AArch64 C ABIs pass and store alike. */
typedef struct {
  struct nvmlDevice_st* handle;
} nvmlDevice_t;

/* Buffer sizes (nvml.h's macros NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE,
 * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE and
 * NVML_DEVICE_NAME_V2_BUFFER_SIZE; named apart so that both headers fit in one unit). */
enum {
  SPAWNPOINT_NVML_PCI_BUS_ID_BUFFER_SIZE = 32,
  SPAWNPOINT_NVML_PCI_BUS_ID_LEGACY_BUFFER_SIZE = 16,
  SPAWNPOINT_NVML_UUID_BUFFER_SIZE = 96,
  SPAWNPOINT_NVML_NAME_BUFFER_SIZE = 96
};

typedef struct nvmlPciInfo_st {
  char busIdLegacy[SPAWNPOINT_NVML_PCI_BUS_ID_LEGACY_BUFFER_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[SPAWNPOINT_NVML_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* nvmlDeviceGetMemoryInfo's (v1) struct; nvmlMemory_v2_t belongs to the _v2 entry point. */
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;

typedef enum nvmlEnableState_enum {
  NVML_FEATURE_DISABLED = 0,
  NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

/* Every entry point the backend binds, as X(symbol, NvmlApi member, return type, parameters,
 * required). A required one missing from the library fails OpenNvmlBackend; of the two PCI
 * queries one must be there (_v2 is for drivers older than _v3; both fill nvmlPciInfo_t). */
#define SPAWNPOINT_NVML_ENTRY_POINTS(X)                                                            \
  X(nvmlInit_v2, Init, nvmlReturn_t, (void), 1)                                                    \
  X(nvmlShutdown, Shutdown, nvmlReturn_t, (void), 1)                                               \
  X(nvmlErrorString, ErrorString, const char*, (nvmlReturn_t result), 1)                           \
  X(nvmlDeviceGetCount_v2, GetCount, nvmlReturn_t, (unsigned int* deviceCount), 1)                 \
  X(nvmlDeviceGetHandleByIndex_v2, GetHandleByIndex, nvmlReturn_t,                                 \
    (unsigned int index, nvmlDevice_t* device), 1)                                                 \
  X(nvmlDeviceGetUUID, GetUUID, nvmlReturn_t,                                                      \
    (nvmlDevice_t device, char* uuid, unsigned int length), 1)                                     \
  X(nvmlDeviceGetName, GetName, nvmlReturn_t,                                                      \
    (nvmlDevice_t device, char* name, unsigned int length), 1)                                     \
  X(nvmlDeviceGetMemoryInfo, GetMemoryInfo, nvmlReturn_t,                                          \
    (nvmlDevice_t device, nvmlMemory_t * memory), 1)                                               \
  X(nvmlDeviceGetPciInfo_v3, GetPciInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlPciInfo_t * pci), \
    0)                                                                                             \
  X(nvmlDeviceGetPciInfo_v2, GetPciInfoV2, nvmlReturn_t,                                           \
    (nvmlDevice_t device, nvmlPciInfo_t * pci), 0)                                                 \
  X(nvmlDeviceGetUtilizationRates, GetUtilizationRates, nvmlReturn_t,                              \
    (nvmlDevice_t device, nvmlUtilization_t * utilization), 0)                                     \
  X(nvmlDeviceGetPowerUsage, GetPowerUsage, nvmlReturn_t,                                          \
    (nvmlDevice_t device, unsigned int* power), 0)                                                 \
  X(nvmlDeviceGetTemperature, GetTemperature, nvmlReturn_t,                                        \
    (nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int* temp), 0)             \
  X(nvmlDeviceGetRetiredPagesPendingStatus, GetRetiredPagesPendingStatus, nvmlReturn_t,            \
    (nvmlDevice_t device, nvmlEnableState_t * isPending), 0)                                       \
  X(nvmlDeviceGetRemappedRows, GetRemappedRows, nvmlReturn_t,                                      \
    (nvmlDevice_t device, unsigned int* corrRows, unsigned int* uncRows, unsigned int* isPending,  \
     unsigned int* failureOccurred),                                                               \
    0)

#ifdef __cplusplus
/* The entry points, bound with dlsym (null: not bound). */
struct NvmlApi {
#define SPAWNPOINT_NVML_MEMBER(symbol, member, ret, params, required) ret(*member) params = nullptr;
  SPAWNPOINT_NVML_ENTRY_POINTS(SPAWNPOINT_NVML_MEMBER)
#undef SPAWNPOINT_NVML_MEMBER
};
}  // namespace spawnpoint::devices::nvml_abi
#else
/* What the fake library defines (it need not define the optional ones). */
#define SPAWNPOINT_NVML_PROTOTYPE(symbol, member, ret, params, required) ret symbol params;
SPAWNPOINT_NVML_ENTRY_POINTS(SPAWNPOINT_NVML_PROTOTYPE)
#undef SPAWNPOINT_NVML_PROTOTYPE
#endif

#endif /* SPAWNPOINT_AGENT_DEVICES_NVML_ABI_H_ */
