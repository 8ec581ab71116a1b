#include "tests/support/python_probe.h"

#include <signal.h>
#include <string.h>

#include <sstream>
#include <stdexcept>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

// Exit 0: all imported; 77: some not installed (their names on stdout). Only a
// ModuleNotFoundError for the module itself means "not installed"; anything else raised
// (exit 1, traceback on stderr) or a signal is the probe's failure.
constexpr char kProbe[] = R"(import importlib, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        missing.append(name)
print(" ".join(missing))
sys.exit(77 if missing else 0)
)";
constexpr int kMissing = 77;

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

}  // namespace

StatusOr<std::vector<std::string>> MissingPythonModules(
    const std::string& python, const std::vector<std::string>& modules,
    std::chrono::milliseconds timeout, const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = {python, "-c", kProbe};
  argv.insert(argv.end(), modules.begin(), modules.end());
  std::string names;
  for (const auto& m : modules) names += (names.empty() ? "" : ", ") + m;
  const std::string what = python + " importing " + names;
  try {
    TestProcess probe(argv, env);
    const int code = probe.Wait(timeout);
    if (code == 0) return std::vector<std::string>{};
    if (code == kMissing) {
      std::vector<std::string> missing;
      std::istringstream words(probe.Stdout());
      for (std::string w; words >> w;) missing.push_back(w);
      if (!missing.empty()) return missing;
      return Internal(what + ": exit 77 without naming a missing module");
    }
    const std::string err = Tail(probe.Stderr(), 2000);
    if (code == -1) {
      return Status(StatusCode::kDeadlineExceeded,
                    what + ": no answer within " +
                        std::to_string(timeout.count() * SanitizerSlowdown()) +
                        " ms (killed): a hung import is a failure, not a missing module");
    }
    if (code > 128) {
      return Internal(what + ": killed by signal " + std::to_string(code - 128) + " (" +
                      strsignal(code - 128) +
                      "): a crashing import is a failure, not a missing "
                      "module; stderr: " +
                      err);
    }
    return Internal(what + ": exit " + std::to_string(code) +
                    ": installed but cannot be imported (only a ModuleNotFoundError for the "
                    "module itself means it is not installed); stderr: " +
                    err);
  } catch (const std::exception& e) {
    return Internal(what + ": cannot start the interpreter: " + e.what());
  }
}

}  // namespace spawnpoint::testing
