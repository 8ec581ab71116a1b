#include "agent/loader/split_trainer.h"

#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "agent/loader/worker.h"

namespace spawnpoint::loader {

int RunSplitTrainer(int argc, char** argv, const std::string& module) {
  // First thing: a worker serves batches and never loads the torch half.
  if (int rc = RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  const char* self = argc > 0 ? argv[0] : "trainer";
  std::filesystem::path path(module);
  if (path.is_relative()) {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
      std::fprintf(stderr, "%s: cannot find this program's directory (/proc/self/exe: %s)\n", self,
                   ec.message().c_str());
      return 127;
    }
    path = exe.parent_path() / path;
  }
  // RTLD_LOCAL: the module's copy of the loader stays its own (see the header).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "%s: cannot load the trainer's torch half: %s\n", self, dlerror());
    return 127;
  }
  using Entry = int (*)(int, char**);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kSplitTrainerEntry));
  if (entry == nullptr) {
    std::fprintf(stderr, "%s: %s does not define %s: %s\n", self, path.c_str(), kSplitTrainerEntry,
                 dlerror());
    return 127;
  }
  return entry(argc, argv);  // the module stays loaded: its static destructors run at exit
}

}  // namespace spawnpoint::loader
