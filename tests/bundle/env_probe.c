// A trainer for the bundle test, linked statically so it runs where the system libraries
// are hidden. It writes what it was started with to <argv[1]>.<RANK>: its environment, one
// VAR=value a line, then PARENT_COMM=<the comm of its parent>, and exits 0.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: env_probe OUT\n");
    return 2;
  }
  const char* rank = getenv("RANK");
  char path[4096];
  snprintf(path, sizeof(path), "%s.%s", argv[1], rank ? rank : "none");
  FILE* out = fopen(path, "w");
  if (out == NULL) {
    perror(path);
    return 1;
  }
  for (char** e = environ; *e != NULL; ++e) fprintf(out, "%s\n", *e);
  char comm_path[64], comm[64] = "";
  snprintf(comm_path, sizeof(comm_path), "/proc/%d/comm", (int)getppid());
  FILE* in = fopen(comm_path, "r");
  if (in != NULL) {
    if (fgets(comm, sizeof(comm), in) == NULL) comm[0] = '\0';
    fclose(in);
  }
  fprintf(out, "PARENT_COMM=%s", comm);  // comm ends in a newline
  return fclose(out) == 0 ? 0 : 1;
}
