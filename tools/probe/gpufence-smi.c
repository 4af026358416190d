/* gpufence-smi: an `nvidia-smi -L` stand-in for test containers. It dlopen()s libnvidia-ml.so.1
 * (never links it, as every NVML user in gpufence; docs/mock-nvml.md) and prints
 *   GPU <index>: <name> (UUID: <uuid>)
 * for each GPU NVML enumerates from where it runs.
 *   gpufence-smi            the listing
 *   gpufence-smi --cuda N   the UUID of the N-th GPU as CUDA numbers them: the N-th entry of
 *                           CUDA_VISIBLE_DEVICES (indices or UUID prefixes) when set, else the
 *                           N-th visible GPU (CUDA Programming Guide, "CUDA Environment Variables")
 * Exit 0 on success, 1 on an NVML error (named on stderr), 2 on bad usage or no such GPU. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned*);
typedef int (*handle_fn)(unsigned, void**);
typedef int (*string_fn)(void*, char*, unsigned);

static int (*nvml_init)(void);
static count_fn nvml_count;
static handle_fn nvml_handle;
static string_fn nvml_uuid, nvml_name;

static void* need(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "gpufence-smi: libnvidia-ml.so.1 lacks %s\n", name);
    exit(1);
  }
  return f;
}

static void load(void) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "gpufence-smi: cannot load libnvidia-ml.so.1: %s\n", dlerror());
    exit(1);
  }
  *(void**)&nvml_init = need(lib, "nvmlInit_v2");
  *(void**)&nvml_count = need(lib, "nvmlDeviceGetCount_v2");
  *(void**)&nvml_handle = need(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void**)&nvml_uuid = need(lib, "nvmlDeviceGetUUID");
  *(void**)&nvml_name = need(lib, "nvmlDeviceGetName");
  int rc = nvml_init();
  if (rc != 0) {
    fprintf(stderr, "gpufence-smi: nvmlInit_v2 failed: %d\n", rc);
    exit(1);
  }
}

static int gpu(unsigned i, char* uuid, char* name) {
  void* h = NULL;
  int rc = nvml_handle(i, &h);
  if (rc == 0) rc = nvml_uuid(h, uuid, 96);
  if (rc == 0 && name) rc = nvml_name(h, name, 96);
  if (rc != 0) fprintf(stderr, "gpufence-smi: GPU %u: NVML error %d\n", i, rc);
  return rc;
}

/* The visible GPU the CUDA_VISIBLE_DEVICES entry names: an index or a unique UUID prefix. */
static int cuda_entry(const char* entry, unsigned count, char* out) {
  char uuid[96];
  char* end = NULL;
  unsigned long idx = strtoul(entry, &end, 10);
  if (*entry && end && *end == '\0') {
    if (idx >= count || gpu((unsigned)idx, out, NULL) != 0) return 2;
    return 0;
  }
  int found = 0;
  for (unsigned i = 0; i < count; ++i) {
    if (gpu(i, uuid, NULL) != 0) return 1;
    if (strncmp(uuid, entry, strlen(entry)) == 0) {
      strcpy(out, uuid);
      ++found;
    }
  }
  return found == 1 ? 0 : 2;
}

static int select_cuda(unsigned n) {
  unsigned count = 0;
  char uuid[96];
  if (nvml_count(&count) != 0) return 1;
  const char* cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (!cvd) {
    if (n >= count || gpu(n, uuid, NULL) != 0) goto none;
    printf("%s\n", uuid);
    return 0;
  }
  char list[1024];
  snprintf(list, sizeof list, "%s", cvd);
  unsigned pos = 0;
  for (char* tok = strtok(list, ","); tok; tok = strtok(NULL, ","), ++pos) {
    if (cuda_entry(tok, count, uuid) != 0) break; /* CUDA stops at the first invalid entry */
    if (pos == n) {
      printf("%s\n", uuid);
      return 0;
    }
  }
none:
  fprintf(stderr, "gpufence-smi: no CUDA device %u among the visible GPUs\n", n);
  return 2;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--cuda") == 0) {
    load();
    return select_cuda((unsigned)strtoul(argv[2], NULL, 10));
  }
  if (argc != 1) {
    fprintf(stderr, "usage: gpufence-smi [--cuda N]\n");
    return 2;
  }
  load();
  unsigned count = 0;
  if (nvml_count(&count) != 0) return 1;
  for (unsigned i = 0; i < count; ++i) {
    char uuid[96], name[96];
    if (gpu(i, uuid, name) != 0) return 1;
    printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
  }
  return 0;
}
