# SPAWNPOINT_SANITIZE (make test-asan, make test-tsan): every target of the tree compiled and
# linked with GCC's sanitizers. Included by the top-level CMakeLists.txt (always: it defines
# spawnpoint_unsanitized).
#
# - address,undefined: UB aborts (-fno-sanitize-recover=all) like a memory error does.
#   vptr is off: cpprest's headers (spawnpoint_kube) and libtorch's classes are only seen
#   as declarations, and UBSan's vptr check then reports types it cannot see as mismatched.
# - thread: alone (TSan cannot be combined with ASan).
#
# What links libtorch (the example trainer, the torch loader adapter, the torch benches) is
# instrumented in our code only: Debian's libtorch, libgloo, Python and the other system
# libraries are not rebuilt. scripts/sanitizer-tests.sh lists the tests that are excluded.

# spawnpoint_unsanitized(target): a static executable (the bundle's launcher, the probes that
# run with no libraries at all) stays uninstrumented: the sanitizers' runtimes are shared.
function(spawnpoint_unsanitized target)
  if(SPAWNPOINT_SANITIZE)
    target_compile_options(${target} PRIVATE -fno-sanitize=all)
    target_link_options(${target} PRIVATE -fno-sanitize=all)
  endif()
endfunction()

# A test's own deadlines are SanitizerSlowdown() times longer in these builds
# (tests/support/test_process.h: 3 under ASan, 6 under TSan); a ctest TIMEOUT that is not far
# above the test's time in a plain build is multiplied by SPAWNPOINT_TEST_TIMEOUT_SCALE, so
# that ctest does not kill a test its own deadlines still allow (and that would have said why).
set(SPAWNPOINT_TEST_TIMEOUT_SCALE 1)
if(NOT SPAWNPOINT_SANITIZE)
  return()
endif()
set(_allowed "address,undefined" "thread")
if(NOT SPAWNPOINT_SANITIZE IN_LIST _allowed)
  message(FATAL_ERROR "SPAWNPOINT_SANITIZE=${SPAWNPOINT_SANITIZE}: allowed are "
                      "address,undefined (make test-asan) and thread (make test-tsan)")
endif()
if(SPAWNPOINT_SANITIZE STREQUAL "thread")
  set(_sanitizers -fsanitize=thread)
  set(SPAWNPOINT_TEST_TIMEOUT_SCALE 6)
else()
  set(_sanitizers -fsanitize=address,undefined -fno-sanitize-recover=all -fno-sanitize=vptr)
  set(SPAWNPOINT_TEST_TIMEOUT_SCALE 3)
endif()
add_compile_options(${_sanitizers} -fno-omit-frame-pointer)
# -O1 and line tables only: half the compile time of -O2 -g (the tree is built twice in CI),
# and reports still name file and line.
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O1 -g1 -DNDEBUG")
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -g1 -DNDEBUG")
add_link_options(${_sanitizers})
# Every binary knows what it was built with: tests that cannot run instrumented skip
# themselves (e.g. a measured-throughput test) and say why.
add_compile_definitions(SPAWNPOINT_SANITIZED="${SPAWNPOINT_SANITIZE}")
message(STATUS "spawnpoint: sanitizers ${SPAWNPOINT_SANITIZE}")
