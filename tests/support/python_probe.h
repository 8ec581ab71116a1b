// Whether a Python interpreter can import the modules a test needs. A test may skip
// (GTEST_SKIP, which ctest reports as Skipped) only when a module is not installed; a probe
// that crashes, outlives its deadline, or fails to import a module that is installed (a
// broken install: an ImportError from a missing shared library, a dependency's
// ModuleNotFoundError) is an error, so the test fails instead of hiding what broke.
// Stateless; each call starts its own interpreter, so calls may run on any thread.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::testing {

// Imports each of `modules` (top-level names) in a fresh `python`, with `env` added to this
// process's environment. Returns the names that are not installed (empty: every one
// imported), in the order given, or an error naming the interpreter, what it did (exit
// status, signal, deadline) and the end of its stderr. `timeout` is multiplied by
// SanitizerSlowdown(), as every deadline of TestProcess is.
StatusOr<std::vector<std::string>> MissingPythonModules(
    const std::string& python, const std::vector<std::string>& modules,
    std::chrono::milliseconds timeout, const std::map<std::string, std::string>& env = {});

}  // namespace spawnpoint::testing
