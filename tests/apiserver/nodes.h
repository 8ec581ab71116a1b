// The simulated node side of the API test server (`--simulate-nodes N`): N Node objects
// (node-0 ... node-N-1, Ready), a scheduler that binds unbound pods (schedulerName
// default-scheduler) round-robin or by a kubernetes.io/hostname nodeSelector, and a
// kubelet that moves bound pods to Running with a pod IP, start time, conditions and
// running container statuses. Tests then finish pods by patching pods/status as a kubelet
// would.
//
// With `run_pods` the kubelet also runs each pod's main container (the one named
// "trainer", else the first) as a local process: command + args with $(VAR) expansion,
// env (literal values; fieldRef metadata.name/namespace/uid/labels/annotations,
// spec.nodeName, spec.serviceAccountName, status.podIP/hostIP; configMapKeyRef and
// secretKeyRef from the store), workingDir relative to the server's cwd, HOSTNAME = pod
// name, on top of the server's own environment (the image is ignored). Its output goes to a
// per-pod log (served as pods/log). The container's terminationMessagePath is rewritten,
// wherever it appears in command, args or env values, to a file in the pod's temp dir, and
// TERMINATION_MESSAGE_PATH names that file; its content becomes
// state.terminated.message (FallbackToLogsOnError uses the log tail). The exit code is
// written back (reason Completed/Error, phase Succeeded/Failed; restartPolicy Always and
// OnFailure restart the process after 1 s). Deleting a running pod sends SIGTERM to its
// process group, SIGKILL after the grace period, and the pod disappears once the process
// has exited (at once with gracePeriodSeconds=0). Pod IPs are 127.0.0.1 in this mode, since
// every process runs here; pod DNS names do not resolve.
//
// Processes never outlive the server: each is started with PR_SET_PDEATHSIG(SIGKILL) from
// a thread that lives as long as the simulator, in its own process group, and Stop()
// terminates every group.
//
// Thread-safety: Start/Stop from the owner; Logs() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/status.h"
#include "tests/apiserver/store.h"

namespace spawnpoint::kubetest {

class NodeSimulator {
 public:
  struct Options {
    int nodes = 1;
    bool run_pods = false;
    std::string work_root;  // "" = a new temp dir, removed by Stop()
    int api_port = 0;
  };
  NodeSimulator(Store* store, Options options);
  ~NodeSimulator();

  Status Start();
  void Stop();
  // The main container's output so far ("" when the pod never ran here).
  std::string Logs(const std::string& ns, const std::string& name);

 private:
  struct Proc;
  struct Command {
    enum Kind { kStart, kKill } kind;
    json pod;
    std::string uid;
    int grace_seconds = 0;
  };

  void WatchLoop();
  void ProcessLoop();
  void OnPod(const std::string& type, const json& pod);
  void MarkRunning(const json& pod, const std::string& node, const std::string& container_id);
  void StartProcess(const json& pod, int restart_count);
  void OnExit(const std::string& uid, int code);
  void Enqueue(Command c);
  bool ProcessAlive(const std::string& uid);

  Store* store_;
  Options options_;
  std::string work_root_;
  bool own_work_root_ = false;
  std::vector<std::string> node_names_;
  size_t next_node_ = 0;
  std::map<std::string, int> next_ip_;  // node → last host part used
  std::shared_ptr<Watcher> watcher_;
  std::thread watch_thread_;
  std::thread process_thread_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Command> commands_;
  std::map<std::string, std::unique_ptr<Proc>> procs_;  // by pod uid
  std::map<std::string, std::string> log_paths_;        // "ns/name" → log file
  std::set<std::string> started_;                       // pod uids handled by the kubelet
  int wake_fd_ = -1;
};

}  // namespace spawnpoint::kubetest
