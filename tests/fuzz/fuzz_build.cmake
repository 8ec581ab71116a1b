# SPAWNPOINT_FUZZ=ON (make fuzz): only the libFuzzer targets of tests/fuzz and the project
# libraries they link, nothing else (no torch, no tests). Included by the top-level
# CMakeLists.txt, which returns after it. Everything is compiled with ASan and UBSan (UB
# aborts: -fno-sanitize-recover) and libFuzzer's coverage; only the targets link libFuzzer.
# vptr is off: cpprest's headers (spawnpoint_kube) trip UBSan's vptr check.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "SPAWNPOINT_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++ "
                      "-DCMAKE_C_COMPILER=clang): libFuzzer is clang's")
endif()
set(_sanitizers -fsanitize=address,undefined -fno-sanitize-recover=all -fno-sanitize=vptr)
add_compile_options(-fsanitize=fuzzer-no-link ${_sanitizers} -fno-omit-frame-pointer)
add_link_options(${_sanitizers})

add_subdirectory(common EXCLUDE_FROM_ALL)
add_subdirectory(metrics EXCLUDE_FROM_ALL)
add_subdirectory(api EXCLUDE_FROM_ALL)
add_subdirectory(agent/devices ${CMAKE_BINARY_DIR}/agent/devices EXCLUDE_FROM_ALL)
add_subdirectory(operator EXCLUDE_FROM_ALL)
add_subdirectory(tests/fuzz)
