// bin/spawnpoint-agent of the agent bundle: a static launcher, so it runs in any Linux
// image (no shell, no libc of the image needed). It finds the bundle from its own path
// (<prefix>/bin/spawnpoint-agent) and replaces itself with the bundle's dynamic loader:
//
//   <prefix>/lib/ld-linux-x86-64.so.2 --library-path <prefix>/lib[:$LD_LIBRARY_PATH]
//       --argv0 <argv[0]> <prefix>/libexec/spawnpoint-agent <args...>
//
// --library-path, not LD_LIBRARY_PATH, so the bundle's libraries reach only the agent and
// never the trainers and workers it spawns; the image's own LD_LIBRARY_PATH follows the
// bundle's directory so a dlopen of what the bundle does not carry (NVML) finds the same
// library the unbundled agent would. SPAWNPOINT_AGENT_EXE tells the agent its own path
// (its /proc/self/exe is ld.so); the agent removes it from its environment at start-up.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char** environ;

static const char kLoader[] = "/lib/ld-linux-x86-64.so.2";
static const char kAgent[] = "/libexec/spawnpoint-agent";

static void Die(const char* what, const char* path) {
  fprintf(stderr, "spawnpoint-agent (bundle launcher): %s %s: %s\n", what, path, strerror(errno));
  exit(127);
}

static char* Join(const char* a, const char* b, const char* c) {
  size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
  char* s = malloc(n);
  if (s == NULL) Die("out of memory for", a);
  snprintf(s, n, "%s%s%s", a, b, c);
  return s;
}

int main(int argc, char** argv) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
  } else if (argc > 0 && strchr(argv[0], '/') != NULL && realpath(argv[0], self) != NULL) {
    // No /proc: argv[0] names the launcher when it was started by path, as pods do.
  } else {
    Die("cannot find itself: readlink", "/proc/self/exe");
  }

  // <prefix>/bin/spawnpoint-agent -> <prefix>
  char* prefix = strdup(self);
  if (prefix == NULL) Die("out of memory for", self);
  for (int up = 0; up < 2; ++up) {
    char* slash = strrchr(prefix, '/');
    if (slash == NULL) {
      errno = EINVAL;
      Die("not inside a bundle (<prefix>/bin/spawnpoint-agent):", self);
    }
    *slash = '\0';
  }

  if (strchr(prefix, ':') != NULL) {  // --library-path splits at ':'
    errno = EINVAL;
    Die("cannot run from a directory whose path holds ':':", prefix);
  }

  char* loader = Join(prefix, kLoader, "");
  char* agent = Join(prefix, kAgent, "");
  const char* user_path = getenv("LD_LIBRARY_PATH");
  char* lib_path = Join(prefix, "/lib", "");
  if (user_path != NULL && user_path[0] != '\0') lib_path = Join(lib_path, ":", user_path);

  if (setenv("SPAWNPOINT_AGENT_EXE", self, 1) != 0) Die("setenv", "SPAWNPOINT_AGENT_EXE");

  char** args = calloc((size_t)argc + 8, sizeof(char*));
  if (args == NULL) Die("out of memory for", self);
  int i = 0;
  args[i++] = loader;
  args[i++] = "--library-path";
  args[i++] = lib_path;
  args[i++] = "--argv0";
  args[i++] = argc > 0 ? argv[0] : self;
  args[i++] = agent;
  for (int a = 1; a < argc; ++a) args[i++] = argv[a];
  args[i] = NULL;

  execve(loader, args, environ);
  Die("cannot execute", loader);
  return 127;
}
