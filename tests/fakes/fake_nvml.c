/* A stand-in for libnvidia-ml.so: exports the NVML entry points spawnpoint loads with
 * dlopen, with the declarations of agent/devices/nvml_abi.h (or, built with
 * FAKE_NVML_WITH_NVIDIA_HEADER, of NVIDIA's nvml.h itself: the test nvml_header_abi builds it
 * so), and serves devices described by the text file named in the FAKE_NVML_CONFIG
 * environment variable (read at nvmlInit_v2). Format, one item a line, '#' starts a comment:
 *
 *   init_error <code>        nvmlInit_v2 returns <code> (e.g. 9 = Driver Not Loaded)
 *   fail <entry point> <error> [<device index>]
 *                            that entry point returns <error> (NOT_SUPPORTED, NO_PERMISSION,
 *                            GPU_IS_LOST, UNINITIALIZED or a number) for that device, or for
 *                            every device; it writes junk into its outputs first, as nothing
 *                            in NVML promises they are left alone
 *   uuid|name|bus id|memory total bytes|memory used bytes|util %|power mW|temp C|lost[|ecc]
 *
 * lost: 0 healthy; 1 every query but the handle, UUID and PCI info fails with
 * NVML_ERROR_GPU_IS_LOST (15); 2 even nvmlDeviceGetHandleByIndex_v2 does.
 * ecc: 0 none (default); 1 retired pages pending; 2 row remapping pending; 3 row remapping
 * failed. Without FAKE_NVML_CONFIG there are no devices. A config it cannot read makes
 * nvmlInit_v2 fail with NVML_ERROR_UNKNOWN, the reason on stderr with the line number.
 * Not thread-safe (tests only). */
#ifdef FAKE_NVML_WITH_NVIDIA_HEADER
#include <nvml.h>
#else
#include "agent/devices/nvml_abi.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 64

struct nvmlDevice_st {
  char uuid[96];
  char name[96];
  char bus_id[32];
  unsigned long long mem_total, mem_used;
  unsigned int util, power_mw, temp;
  int lost, ecc;
};

/* The queries a config can make fail, by entry point name. */
enum query {
  Q_COUNT,
  Q_HANDLE,
  Q_UUID,
  Q_NAME,
  Q_PCI,
  Q_MEMORY,
  Q_UTILIZATION,
  Q_POWER,
  Q_TEMPERATURE,
  Q_RETIRED_PAGES,
  Q_REMAPPED_ROWS,
  Q_N
};
static const char* const kQueryNames[Q_N] = {"nvmlDeviceGetCount_v2",
                                             "nvmlDeviceGetHandleByIndex_v2",
                                             "nvmlDeviceGetUUID",
                                             "nvmlDeviceGetName",
                                             "nvmlDeviceGetPciInfo_v3",
                                             "nvmlDeviceGetMemoryInfo",
                                             "nvmlDeviceGetUtilizationRates",
                                             "nvmlDeviceGetPowerUsage",
                                             "nvmlDeviceGetTemperature",
                                             "nvmlDeviceGetRetiredPagesPendingStatus",
                                             "nvmlDeviceGetRemappedRows"};

/* What injected failures write into a query's outputs: a value a caller that used it anyway
 * would report, never one a test could mistake for a reading. */
#define JUNK_U32 0xA5A5A5A5u
#define JUNK_BYTE 0xA5

static struct nvmlDevice_st g_gpus[MAX_GPUS];
static unsigned int g_count;
static int g_refs;
/* g_fail[q][i]: what query q returns for device i instead of answering; NVML_SUCCESS: answer.
 * Q_COUNT uses [Q_COUNT][0]. */
static nvmlReturn_t g_fail[Q_N][MAX_GPUS];

static char* trim(char* s) {
  while (*s == ' ' || *s == '\t') ++s;
  char* e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
  return s;
}

static void copy(char* dst, size_t size, const char* src) { snprintf(dst, size, "%s", src); }

/* "NOT_SUPPORTED", "NVML_ERROR_NOT_SUPPORTED" or "3"; -1 if it is none of those. */
static long parse_error(const char* s) {
  static const struct {
    const char* name;
    nvmlReturn_t code;
  } kErrors[] = {{"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
                 {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
                 {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
                 {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
                 {"UNKNOWN", NVML_ERROR_UNKNOWN}};
  if (strncmp(s, "NVML_ERROR_", 11) == 0) s += 11;
  for (size_t i = 0; i < sizeof kErrors / sizeof kErrors[0]; ++i) {
    if (strcmp(s, kErrors[i].name) == 0) return (long)kErrors[i].code;
  }
  char* end = NULL;
  long code = strtol(s, &end, 10);
  return *s != 0 && *end == 0 && code > 0 ? code : -1;
}

/* A "fail" line after the keyword; 0 if it is good, else the reason is printed. */
static int parse_fail(char* args, const char* path, int line) {
  char* words[4] = {0};
  int n = 0;
  for (char* w = strtok(args, " \t"); w != NULL && n < 4; w = strtok(NULL, " \t")) words[n++] = w;
  if (n < 2 || n > 3) {
    fprintf(stderr, "fake_nvml: %s line %d: 'fail' takes <entry point> <error> [<device index>]\n",
            path, line);
    return -1;
  }
  int q = 0;
  while (q < Q_N && strcmp(words[0], kQueryNames[q]) != 0) ++q;
  if (q == Q_N) {
    fprintf(stderr, "fake_nvml: %s line %d: no entry point '%s' can fail; these can:", path, line,
            words[0]);
    for (int i = 0; i < Q_N; ++i) fprintf(stderr, " %s", kQueryNames[i]);
    fprintf(stderr, "\n");
    return -1;
  }
  long code = parse_error(words[1]);
  if (code < 0) {
    fprintf(stderr,
            "fake_nvml: %s line %d: error '%s' is none of NOT_SUPPORTED, NO_PERMISSION, "
            "GPU_IS_LOST, UNINITIALIZED, UNKNOWN or a positive number\n",
            path, line, words[1]);
    return -1;
  }
  int first = 0, last = MAX_GPUS - 1;
  if (n == 3) {
    char* end = NULL;
    long index = strtol(words[2], &end, 10);
    if (*end != 0 || index < 0 || index >= MAX_GPUS || q == Q_COUNT) {
      fprintf(stderr, "fake_nvml: %s line %d: device index '%s' must be 0-%d (and %s has none)\n",
              path, line, words[2], MAX_GPUS - 1, kQueryNames[Q_COUNT]);
      return -1;
    }
    first = last = (int)index;
  }
  for (int i = first; i <= last; ++i) g_fail[q][i] = (nvmlReturn_t)code;
  return 0;
}

/* Returns the init result the config asks for. */
static nvmlReturn_t load_config(void) {
  g_count = 0;
  memset(g_fail, 0, sizeof g_fail);
  const char* path = getenv("FAKE_NVML_CONFIG");
  if (path == NULL || *path == 0) return NVML_SUCCESS;
  FILE* f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "fake_nvml: cannot open FAKE_NVML_CONFIG=%s\n", path);
    return NVML_ERROR_UNKNOWN;
  }
  nvmlReturn_t init = NVML_SUCCESS;
  char line[1024];
  int number = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    ++number;
    char* hash = strchr(line, '#');
    if (hash) *hash = 0;
    char* s = trim(line);
    if (*s == 0) continue;
    if (strncmp(s, "init_error", 10) == 0) {
      init = (nvmlReturn_t)atoi(s + 10);
      continue;
    }
    if (strncmp(s, "fail ", 5) == 0) {
      if (parse_fail(s + 5, path, number) != 0) {
        fclose(f);
        return NVML_ERROR_UNKNOWN;
      }
      continue;
    }
    if (g_count == MAX_GPUS) break;
    char* fields[10] = {0};
    int n = 0;
    for (char* p = s; p != NULL && n < 10; ++n) {
      fields[n] = p;
      p = strchr(p, '|');
      if (p) *p++ = 0;
    }
    if (n < 9) {
      fprintf(stderr, "fake_nvml: %s line %d: need 9 or 10 '|' fields: %s\n", path, number, s);
      fclose(f);
      return NVML_ERROR_UNKNOWN;
    }
    struct nvmlDevice_st* g = &g_gpus[g_count++];
    memset(g, 0, sizeof *g);
    copy(g->uuid, sizeof g->uuid, trim(fields[0]));
    copy(g->name, sizeof g->name, trim(fields[1]));
    copy(g->bus_id, sizeof g->bus_id, trim(fields[2]));
    g->mem_total = strtoull(fields[3], NULL, 10);
    g->mem_used = strtoull(fields[4], NULL, 10);
    g->util = (unsigned)strtoul(fields[5], NULL, 10);
    g->power_mw = (unsigned)strtoul(fields[6], NULL, 10);
    g->temp = (unsigned)strtoul(fields[7], NULL, 10);
    g->lost = atoi(fields[8]);
    g->ecc = n > 9 ? atoi(fields[9]) : 0;
  }
  fclose(f);
  if (init != NVML_SUCCESS) g_count = 0;
  return init;
}

nvmlReturn_t nvmlInit_v2(void) {
  if (g_refs == 0) {
    nvmlReturn_t rc = load_config();
    if (rc != NVML_SUCCESS) return rc;
  }
  ++g_refs;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
  --g_refs;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t rc) {
  switch ((int)rc) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 6:
      return "Not Found";
    case 7:
      return "Insufficient Size";
    case 9:
      return "Driver Not Loaded";
    case 12:
      return "NVML Shared Library Not Found";
    case 15:
      return "GPU is lost";
    case 18:
      return "RM has detected an NVML/RM version mismatch.";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (g_fail[Q_COUNT][0] != NVML_SUCCESS) return g_fail[Q_COUNT][0];
  *count = g_count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (device == NULL || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
  if (g_fail[Q_HANDLE][index] != NVML_SUCCESS) {
    device->handle = NULL;
    return g_fail[Q_HANDLE][index];
  }
  if (g_gpus[index].lost >= 2) return NVML_ERROR_GPU_IS_LOST;
  device->handle = &g_gpus[index];
  return NVML_SUCCESS;
}

/* The checks every device query makes first. */
static nvmlReturn_t check(nvmlDevice_t d, const void* out) {
  if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (d.handle == NULL || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  return NVML_SUCCESS;
}

/* The failure the config injects into query q of device d, after junk into the `size` bytes
 * at `out`; NVML_SUCCESS: answer. */
static nvmlReturn_t injected(nvmlDevice_t d, enum query q, void* out, size_t size) {
  nvmlReturn_t fail = g_fail[q][d.handle - g_gpus];
  if (fail != NVML_SUCCESS) memset(out, JUNK_BYTE, size);
  return fail;
}

static nvmlReturn_t copy_out(const char* value, char* buf, unsigned int length) {
  if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(buf, value, strlen(value) + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int length) {
  nvmlReturn_t rc = check(d, uuid);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_UUID, uuid, length);
  return rc != NVML_SUCCESS ? rc : copy_out(d.handle->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int length) {
  nvmlReturn_t rc = check(d, name);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_NAME, name, length);
  if (rc != NVML_SUCCESS) return rc;
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  return copy_out(d.handle->name, name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* pci) {
  nvmlReturn_t rc = check(d, pci);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_PCI, pci, sizeof *pci);
  if (rc != NVML_SUCCESS) return rc;
  memset(pci, 0, sizeof *pci);
  copy(pci->busId, sizeof pci->busId, d.handle->bus_id);
  unsigned dev_fn = 0;
  sscanf(d.handle->bus_id, "%x:%x:%x.%x", &pci->domain, &pci->bus, &pci->device, &dev_fn);
  pci->pciDeviceId = 0x20b010de; /* A100 device id << 16 | NVIDIA vendor id */
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* mem) {
  nvmlReturn_t rc = check(d, mem);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_MEMORY, mem, sizeof *mem);
  if (rc != NVML_SUCCESS) return rc;
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  mem->total = d.handle->mem_total;
  mem->used = d.handle->mem_used;
  mem->free = d.handle->mem_total - d.handle->mem_used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  nvmlReturn_t rc = check(d, u);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_UTILIZATION, u, sizeof *u);
  if (rc != NVML_SUCCESS) return rc;
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  u->gpu = d.handle->util;
  u->memory = d.handle->util / 2;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* power) {
  nvmlReturn_t rc = check(d, power);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_POWER, power, sizeof *power);
  if (rc != NVML_SUCCESS) return rc;
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  *power = d.handle->power_mw;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor,
                                      unsigned int* temp) {
  nvmlReturn_t rc = check(d, temp);
  if (rc == NVML_SUCCESS) rc = injected(d, Q_TEMPERATURE, temp, sizeof *temp);
  if (rc != NVML_SUCCESS) return rc;
  if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  *temp = d.handle->temp;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t* pending) {
  nvmlReturn_t rc = check(d, pending);
  if (rc != NVML_SUCCESS) return rc;
  rc = injected(d, Q_RETIRED_PAGES, pending, sizeof *pending);
  if (rc != NVML_SUCCESS) {
    *pending = NVML_FEATURE_ENABLED; /* the junk that would mislead most */
    return rc;
  }
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  *pending = d.handle->ecc == 1 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int* corr, unsigned int* unc,
                                       unsigned int* pending, unsigned int* failed) {
  nvmlReturn_t rc = check(d, corr);
  if (rc != NVML_SUCCESS) return rc;
  if (unc == NULL || pending == NULL || failed == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  rc = injected(d, Q_REMAPPED_ROWS, corr, sizeof *corr);
  if (rc != NVML_SUCCESS) {
    *unc = *pending = *failed = JUNK_U32;
    return rc;
  }
  if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
  *corr = 0;
  *unc = d.handle->ecc >= 2;
  *pending = d.handle->ecc == 2;
  *failed = d.handle->ecc == 3;
  return NVML_SUCCESS;
}
