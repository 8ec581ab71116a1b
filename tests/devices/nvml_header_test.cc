// Part of the test nvml_header_abi (nvml_header_check.sh compiles and runs it): every
// declaration of agent/devices/nvml_abi.h, which the NVML backend and the fake NVML library
// are built with, against NVIDIA's own nvml.h from the go-nvml module pinned in tools/nvml.
// Any difference fails the compile with a static_assert that names the declaration: a struct's
// size or alignment, a field's offset or type, an enum's underlying type or a constant's
// value, and each entry point's exported name and signature (the type the backend calls it
// through, with nvml_abi.h's types mapped to nvml.h's, must be exactly nvml.h's).
#include "agent/devices/nvml_abi.h"

// Declares the versioned names the unversioned macros would otherwise hide, such as
// nvmlDeviceGetPciInfo_v2, the backend's fallback.
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

namespace {

namespace abi = spawnpoint::devices::nvml_abi;

// Nvidia<T>::type: what nvml.h calls the type nvml_abi.h calls T. A type of nvml_abi.h left
// out here stays itself, which differs from nvml.h's and so fails the checks below.
template <typename T>
struct Nvidia {
  using type = T;
};
template <typename T>
struct Nvidia<T*> {
  using type = typename Nvidia<T>::type*;
};
template <typename T>
struct Nvidia<const T> {
  using type = const typename Nvidia<T>::type;
};
template <typename T, std::size_t N>
struct Nvidia<T[N]> {
  using type = typename Nvidia<T>::type[N];
};
template <typename R, typename... Args>
struct Nvidia<R(Args...)> {
  using type = typename Nvidia<R>::type(typename Nvidia<Args>::type...);
};
#define SAME_NAME(T)      \
  template <>             \
  struct Nvidia<abi::T> { \
    using type = ::T;     \
  };
SAME_NAME(nvmlReturn_t)
SAME_NAME(nvmlDevice_st)
SAME_NAME(nvmlDevice_t)
SAME_NAME(nvmlPciInfo_t)
SAME_NAME(nvmlMemory_t)
SAME_NAME(nvmlUtilization_t)
SAME_NAME(nvmlTemperatureSensors_t)
SAME_NAME(nvmlEnableState_t)
#undef SAME_NAME
template <typename T>
using NvidiaT = typename Nvidia<T>::type;

int checked = 0;  // declarations checked, for the summary line
int Count() { return ++checked; }

// --- structs: size, alignment, every field's offset and type ---
#define CHECK_STRUCT(S)                                                                    \
  static_assert(std::is_standard_layout_v<abi::S> && std::is_trivially_copyable_v<abi::S>, \
                #S ": nvml_abi.h must declare a plain C struct");                          \
  static_assert(sizeof(abi::S) == sizeof(::S), #S ": size differs from nvml.h");           \
  static_assert(alignof(abi::S) == alignof(::S), #S ": alignment differs from nvml.h");    \
  [[maybe_unused]] const int struct_##S = Count();
#define CHECK_FIELD(S, f)                                                       \
  static_assert(offsetof(abi::S, f) == offsetof(::S, f),                        \
                #S "." #f ": offset differs from nvml.h");                      \
  static_assert(std::is_same_v<NvidiaT<decltype(abi::S::f)>, decltype(::S::f)>, \
                #S "." #f ": type differs from nvml.h");                        \
  [[maybe_unused]] const int field_##S##_##f = Count();

CHECK_STRUCT(nvmlDevice_t)
CHECK_FIELD(nvmlDevice_t, handle)
// The handle is what older headers declared bare: it must stay one pointer, passed as one.
static_assert(sizeof(abi::nvmlDevice_t) == sizeof(void*));

CHECK_STRUCT(nvmlPciInfo_t)
CHECK_FIELD(nvmlPciInfo_t, busIdLegacy)
CHECK_FIELD(nvmlPciInfo_t, domain)
CHECK_FIELD(nvmlPciInfo_t, bus)
CHECK_FIELD(nvmlPciInfo_t, device)
CHECK_FIELD(nvmlPciInfo_t, pciDeviceId)
CHECK_FIELD(nvmlPciInfo_t, pciSubSystemId)
CHECK_FIELD(nvmlPciInfo_t, busId)

CHECK_STRUCT(nvmlMemory_t)
CHECK_FIELD(nvmlMemory_t, total)
CHECK_FIELD(nvmlMemory_t, free)
CHECK_FIELD(nvmlMemory_t, used)

CHECK_STRUCT(nvmlUtilization_t)
CHECK_FIELD(nvmlUtilization_t, gpu)
CHECK_FIELD(nvmlUtilization_t, memory)

// --- enums: underlying type and every value nvml_abi.h names ---
#define CHECK_ENUM(E)                                                                        \
  static_assert(std::is_same_v<std::underlying_type_t<abi::E>, std::underlying_type_t<::E>>, \
                #E ": underlying type differs from nvml.h");                                 \
  static_assert(sizeof(abi::E) == sizeof(::E), #E ": size differs from nvml.h");             \
  [[maybe_unused]] const int enum_##E = Count();
#define CHECK_VALUE(name)                                                            \
  static_assert(static_cast<long long>(abi::name) == static_cast<long long>(::name), \
                #name ": value differs from nvml.h");                                \
  [[maybe_unused]] const int value_##name = Count();

CHECK_ENUM(nvmlReturn_t)
CHECK_VALUE(NVML_SUCCESS)
CHECK_VALUE(NVML_ERROR_UNINITIALIZED)
CHECK_VALUE(NVML_ERROR_INVALID_ARGUMENT)
CHECK_VALUE(NVML_ERROR_NOT_SUPPORTED)
CHECK_VALUE(NVML_ERROR_NO_PERMISSION)
CHECK_VALUE(NVML_ERROR_NOT_FOUND)
CHECK_VALUE(NVML_ERROR_INSUFFICIENT_SIZE)
CHECK_VALUE(NVML_ERROR_DRIVER_NOT_LOADED)
CHECK_VALUE(NVML_ERROR_LIBRARY_NOT_FOUND)
CHECK_VALUE(NVML_ERROR_GPU_IS_LOST)
CHECK_VALUE(NVML_ERROR_LIB_RM_VERSION_MISMATCH)
CHECK_VALUE(NVML_ERROR_UNKNOWN)

CHECK_ENUM(nvmlTemperatureSensors_t)
CHECK_VALUE(NVML_TEMPERATURE_GPU)

CHECK_ENUM(nvmlEnableState_t)
CHECK_VALUE(NVML_FEATURE_DISABLED)
CHECK_VALUE(NVML_FEATURE_ENABLED)

// --- buffer sizes (macros in nvml.h) ---
#define CHECK_SIZE(ours, nvidia)                                                \
  static_assert(abi::ours == nvidia, #ours ": differs from nvml.h's " #nvidia); \
  [[maybe_unused]] const int size_##ours = Count();
CHECK_SIZE(SPAWNPOINT_NVML_PCI_BUS_ID_BUFFER_SIZE, NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE)
CHECK_SIZE(SPAWNPOINT_NVML_PCI_BUS_ID_LEGACY_BUFFER_SIZE, NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE)
CHECK_SIZE(SPAWNPOINT_NVML_UUID_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE)
CHECK_SIZE(SPAWNPOINT_NVML_NAME_BUFFER_SIZE, NVML_DEVICE_NAME_V2_BUFFER_SIZE)

// --- entry points: the symbol the backend looks up exists in nvml.h, and the type it calls
// it through is that function's type ---
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // nvmlDeviceGetTemperature (13.0)
#define CHECK_ENTRY_POINT(symbol, member, ret, params, required)                                   \
  static_assert(std::is_same_v<NvidiaT<std::remove_pointer_t<decltype(abi::NvmlApi::member)>>,     \
                               decltype(::symbol)>,                                                \
                #symbol ": the backend's NvmlApi::" #member " differs from nvml.h's declaration"); \
  [[maybe_unused]] const int entry_##member = Count();
SPAWNPOINT_NVML_ENTRY_POINTS(CHECK_ENTRY_POINT)
#undef CHECK_ENTRY_POINT
#pragma GCC diagnostic pop

// Every NvmlApi member is an entry point of the list above (so was checked there).
#define ONE(symbol, member, ret, params, required) +1
constexpr int kEntryPoints = 0 SPAWNPOINT_NVML_ENTRY_POINTS(ONE);
#undef ONE
static_assert(sizeof(abi::NvmlApi) == kEntryPoints * sizeof(void*),
              "NvmlApi has a member that is not in SPAWNPOINT_NVML_ENTRY_POINTS");

}  // namespace

int main() {
  std::printf("nvml_abi.h matches nvml.h: %d declarations (%d entry points) checked\n", checked,
              kEntryPoints);
  return 0;
}
