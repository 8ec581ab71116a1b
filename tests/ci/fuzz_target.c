/* A libFuzzer target for tests/ci/fuzz_crash_test.sh, compiled three ways: -DCRASH_ASAN
 * overflows a heap buffer and -DCRASH_UBSAN overflows a signed int (UB, which
 * -fno-sanitize-recover makes fatal) on any input that starts with "CRASH"; without either it
 * never fails. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5 || memcmp(data, "CRASH", 5) != 0) return 0;
#if defined(CRASH_ASAN)
  volatile char* p = malloc(4);
  p[4 + size % 4] = 1; /* heap-buffer-overflow */
  free((void*)p);
#elif defined(CRASH_UBSAN)
  volatile int big = INT_MAX - 1;
  volatile int sum = big + (int)size; /* signed overflow */
  (void)sum;
#endif
  return 0;
}
