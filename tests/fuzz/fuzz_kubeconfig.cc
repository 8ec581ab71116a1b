// kubeconfig parsing: kube::ParseKubeconfig (what LoadKubeconfig calls with the file's text),
// for the current context and for a context named by the input's first line. Relative file
// references resolve in an empty directory of its own, so they fail the same way every
// time; inputs naming /dev, /proc or /sys are skipped (a device file could block the read).
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "operator/kube/config.h"
#include "tests/fuzz/fuzz_input.h"

namespace kube = spawnpoint::kube;

namespace {

const std::string& EmptyDir() {
  static const std::string dir = [] {
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fuzz-kubeconfig-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) __builtin_trap();
    static const std::string removed = tmpl;
    atexit([] { rmdir(removed.c_str()); });
    return tmpl;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* special : {"/dev", "/proc", "/sys"}) {
    if (text.find(special) != std::string::npos) return 0;
  }
  const std::string context = text.substr(0, text.find('\n'));
  for (const std::string& name : {std::string(), context}) {
    auto config = kube::ParseKubeconfig(text, EmptyDir(), name, "kubeconfig fuzz");
    if (config.ok()) (void)config->DebugString();
  }
  return 0;
}
