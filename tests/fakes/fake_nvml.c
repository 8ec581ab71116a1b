/* A stand-in for libnvidia-ml.so: exports the NVML entry points spawnpoint loads with
 * dlopen, with the real ABI, and serves devices described by the text file named in the
 * FAKE_NVML_CONFIG environment variable (read at nvmlInit_v2). Format, one item a line,
 * '#' starts a comment:
 *
 *   init_error <code>        nvmlInit_v2 returns <code> (e.g. 9 = Driver Not Loaded)
 *   uuid|name|bus id|memory total bytes|memory used bytes|util %|power mW|temp C|lost[|ecc]
 *
 * lost: 0 healthy; 1 every query but the handle, UUID and PCI info fails with
 * NVML_ERROR_GPU_IS_LOST (15); 2 even nvmlDeviceGetHandleByIndex_v2 does.
 * ecc: 0 none (default); 1 retired pages pending; 2 row remapping pending; 3 row remapping
 * failed. Without FAKE_NVML_CONFIG there are no devices. Not thread-safe (tests only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef int nvmlTemperatureSensors_t;
typedef int nvmlEnableState_t;

enum {
  SUCCESS = 0,
  ERROR_UNINITIALIZED = 1,
  ERROR_INVALID_ARGUMENT = 2,
  ERROR_INSUFFICIENT_SIZE = 7,
  ERROR_GPU_IS_LOST = 15,
  ERROR_UNKNOWN = 999
};

#define MAX_GPUS 64

struct nvmlDevice_st {
  char uuid[96];
  char name[96];
  char bus_id[32];
  unsigned long long mem_total, mem_used;
  unsigned int util, power_mw, temp;
  int lost, ecc;
};

static struct nvmlDevice_st g_gpus[MAX_GPUS];
static unsigned int g_count;
static int g_refs;

static char* trim(char* s) {
  while (*s == ' ' || *s == '\t') ++s;
  char* e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
  return s;
}

static void copy(char* dst, size_t size, const char* src) { snprintf(dst, size, "%s", src); }

/* Returns the init result the config asks for. */
static nvmlReturn_t load_config(void) {
  g_count = 0;
  const char* path = getenv("FAKE_NVML_CONFIG");
  if (path == NULL || *path == 0) return SUCCESS;
  FILE* f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "fake_nvml: cannot open FAKE_NVML_CONFIG=%s\n", path);
    return ERROR_UNKNOWN;
  }
  nvmlReturn_t init = SUCCESS;
  char line[1024];
  while (fgets(line, sizeof line, f) != NULL) {
    char* hash = strchr(line, '#');
    if (hash) *hash = 0;
    char* s = trim(line);
    if (*s == 0) continue;
    if (strncmp(s, "init_error", 10) == 0) {
      init = atoi(s + 10);
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
      fprintf(stderr, "fake_nvml: bad line (need 9 or 10 '|' fields): %s\n", s);
      fclose(f);
      return ERROR_UNKNOWN;
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
  if (init != SUCCESS) g_count = 0;
  return init;
}

nvmlReturn_t nvmlInit_v2(void) {
  if (g_refs == 0) {
    nvmlReturn_t rc = load_config();
    if (rc != SUCCESS) return rc;
  }
  ++g_refs;
  return SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  if (g_refs == 0) return ERROR_UNINITIALIZED;
  --g_refs;
  return SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
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
  if (g_refs == 0) return ERROR_UNINITIALIZED;
  if (count == NULL) return ERROR_INVALID_ARGUMENT;
  *count = g_count;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (g_refs == 0) return ERROR_UNINITIALIZED;
  if (device == NULL || index >= g_count) return ERROR_INVALID_ARGUMENT;
  if (g_gpus[index].lost >= 2) return ERROR_GPU_IS_LOST;
  *device = &g_gpus[index];
  return SUCCESS;
}

static nvmlReturn_t check(nvmlDevice_t d, const void* out) {
  if (g_refs == 0) return ERROR_UNINITIALIZED;
  if (d == NULL || out == NULL) return ERROR_INVALID_ARGUMENT;
  return SUCCESS;
}

static nvmlReturn_t copy_out(const char* value, char* buf, unsigned int length) {
  if (strlen(value) + 1 > length) return ERROR_INSUFFICIENT_SIZE;
  memcpy(buf, value, strlen(value) + 1);
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int length) {
  nvmlReturn_t rc = check(d, uuid);
  return rc != SUCCESS ? rc : copy_out(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int length) {
  nvmlReturn_t rc = check(d, name);
  if (rc != SUCCESS) return rc;
  if (d->lost) return ERROR_GPU_IS_LOST;
  return copy_out(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* pci) {
  nvmlReturn_t rc = check(d, pci);
  if (rc != SUCCESS) return rc;
  memset(pci, 0, sizeof *pci);
  copy(pci->busId, sizeof pci->busId, d->bus_id);
  unsigned dev_fn = 0;
  sscanf(d->bus_id, "%x:%x:%x.%x", &pci->domain, &pci->bus, &pci->device, &dev_fn);
  pci->pciDeviceId = 0x20b010de; /* A100 device id << 16 | NVIDIA vendor id */
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* mem) {
  nvmlReturn_t rc = check(d, mem);
  if (rc != SUCCESS) return rc;
  if (d->lost) return ERROR_GPU_IS_LOST;
  mem->total = d->mem_total;
  mem->used = d->mem_used;
  mem->free = d->mem_total - d->mem_used;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  nvmlReturn_t rc = check(d, u);
  if (rc != SUCCESS) return rc;
  if (d->lost) return ERROR_GPU_IS_LOST;
  u->gpu = d->util;
  u->memory = d->util / 2;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* power) {
  nvmlReturn_t rc = check(d, power);
  if (rc != SUCCESS) return rc;
  if (d->lost) return ERROR_GPU_IS_LOST;
  *power = d->power_mw;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor,
                                      unsigned int* temp) {
  nvmlReturn_t rc = check(d, temp);
  if (rc != SUCCESS) return rc;
  if (sensor != 0) return ERROR_INVALID_ARGUMENT;
  if (d->lost) return ERROR_GPU_IS_LOST;
  *temp = d->temp;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t* pending) {
  nvmlReturn_t rc = check(d, pending);
  if (rc != SUCCESS) return rc;
  if (d->lost) return ERROR_GPU_IS_LOST;
  *pending = d->ecc == 1;
  return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int* corr, unsigned int* unc,
                                       unsigned int* pending, unsigned int* failed) {
  nvmlReturn_t rc = check(d, corr);
  if (rc != SUCCESS) return rc;
  if (unc == NULL || pending == NULL || failed == NULL) return ERROR_INVALID_ARGUMENT;
  if (d->lost) return ERROR_GPU_IS_LOST;
  *corr = 0;
  *unc = d->ecc >= 2;
  *pending = d->ecc == 2;
  *failed = d->ecc == 3;
  return SUCCESS;
}
